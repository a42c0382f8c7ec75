package packaging

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/template"

	"sigs.k8s.io/yaml"
)

// krewPlugin is what TestKrewManifest reads of a krew Plugin manifest.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// .krew.yaml, rendered as krew-release-bot renders it for a tag, is a
// krew Plugin for linux and darwin on amd64 and arm64, each naming the
// archive `make plugin-dist` builds for that platform, with the plugin's
// binary in it.
func TestKrewManifest(t *testing.T) {
	const tag = "v1.2.3"
	tmpl, err := template.New(".krew.yaml").Funcs(template.FuncMap{
		// As krew-release-bot: the URL is a template of its own.
		"addURIAndSha": func(url, tag string) (string, error) {
			var u bytes.Buffer
			if err := template.Must(template.New("uri").Parse(url)).Execute(&u, map[string]string{"TagName": tag}); err != nil {
				return "", err
			}
			return fmt.Sprintf("uri: %s\n    sha256: %s", u.String(), strings.Repeat("ab", 32)), nil
		},
	}).Parse(readFile(t, ".krew.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, map[string]string{"TagName": tag}); err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(out.Bytes(), &p, yaml.DisallowUnknownFields); err != nil {
		t.Fatalf("rendered .krew.yaml: %v\n%s", err, out.String())
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "watchgate" ||
		p.Spec.Version != tag || p.Spec.ShortDescription == "" || p.Spec.Description == "" || p.Spec.Homepage == "" {
		t.Errorf("rendered .krew.yaml: %+v; want a Plugin named watchgate at version %s", p, tag)
	}
	makefile := readFile(t, "Makefile")
	var platforms []string
	for _, pl := range p.Spec.Platforms {
		os, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		platforms = append(platforms, os+"/"+arch)
		archive := fmt.Sprintf("kubectl-watchgate_%s_%s_%s.tar.gz", tag, os, arch)
		if !strings.HasSuffix(pl.URI, "/releases/download/"+tag+"/"+archive) || len(pl.SHA256) != 64 {
			t.Errorf("%s/%s: uri %q, sha256 %q; want the release's %s", os, arch, pl.URI, pl.SHA256, archive)
		}
		if pl.Bin != "kubectl-watchgate" || !slices.ContainsFunc(pl.Files, func(f struct {
			From string `json:"from"`
			To   string `json:"to"`
		}) bool {
			return f.From == "kubectl-watchgate"
		}) {
			t.Errorf("%s/%s: bin %q, files %+v; want the archive's kubectl-watchgate installed", os, arch, pl.Bin, pl.Files)
		}
	}
	slices.Sort(platforms)
	if want := []string{"darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf(".krew.yaml platforms %v, want %v", platforms, want)
	}
	for _, want := range []string{
		"PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64",
		"bin/plugin/kubectl-watchgate_$(VERSION)_$${os}_$${arch}.tar.gz kubectl-watchgate LICENSE",
	} {
		if !strings.Contains(makefile, want) {
			t.Errorf("the Makefile's plugin-dist does not build the archives .krew.yaml names: no %q", want)
		}
	}
}
