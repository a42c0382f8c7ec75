package packaging

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedFileBytes is the largest file the repository may hold: source,
// documents and generated manifests are far below it; a compiled program
// or a data dump is not.
const maxTrackedFileBytes = 1 << 20

// binaryDataExtensions are the kinds of file that may hold NUL bytes:
// images for documents and tests.
var binaryDataExtensions = map[string]bool{".png": true, ".jpg": true, ".jpeg": true, ".gif": true, ".ico": true, ".webp": true}

// The repository holds source only: no tracked file is larger than 1 MiB,
// none is a compiled program (ELF, Mach-O, PE), and none holds NUL bytes
// unless it is an image.
func TestTreeHoldsSourceOnly(t *testing.T) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git work tree (%v): nothing to check", err)
	}
	n := 0
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		path := filepath.Join(root, name)
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, a symlink or a submodule
		}
		n++
		if fi.Size() > maxTrackedFileBytes {
			t.Errorf("%s: %d bytes, more than %d: keep large files out of the repository", name, fi.Size(), maxTrackedFileBytes)
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
			continue
		}
		if kind := executableFormat(b); kind != "" {
			t.Errorf("%s is a compiled program (%s): build outputs belong in .gitignore", name, kind)
			continue
		}
		if bytes.IndexByte(b, 0) >= 0 && !binaryDataExtensions[strings.ToLower(filepath.Ext(name))] {
			t.Errorf("%s holds NUL bytes: a binary file that is not an image", name)
		}
	}
	if n < 100 {
		t.Errorf("checked %d tracked files, want the whole repository", n)
	}
}

// executableFormat names the executable format b starts with, or "".
func executableFormat(b []byte) string {
	if len(b) < 4 {
		return ""
	}
	switch {
	case bytes.HasPrefix(b, []byte("\x7fELF")):
		return "ELF"
	case bytes.HasPrefix(b, []byte("MZ")) && len(b) >= 0x40:
		off := int(binary.LittleEndian.Uint32(b[0x3c:]))
		if off >= 0 && off+4 <= len(b) && string(b[off:off+4]) == "PE\x00\x00" {
			return "PE"
		}
	}
	switch binary.BigEndian.Uint32(b) {
	case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe, 0xcafebabe:
		return "Mach-O"
	}
	return ""
}

func TestExecutableFormatRecognisesPrograms(t *testing.T) {
	pe := make([]byte, 0x80)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x40)
	copy(pe[0x40:], "PE\x00\x00")
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"an ELF binary":             {[]byte("\x7fELF\x02\x01\x01\x00"), "ELF"},
		"a 64-bit Mach-O binary":    {[]byte{0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1}, "Mach-O"},
		"a universal Mach-O binary": {[]byte{0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 2}, "Mach-O"},
		"a PE binary":               {pe, "PE"},
		"text that starts with MZ":  {[]byte("MZ is not a program without its PE header, even in a long enough text file."), ""},
		"Go source":                 {[]byte("package main\n"), ""},
		"an empty file":             {nil, ""},
	} {
		if got := executableFormat(tc.b); got != tc.want {
			t.Errorf("%s: executableFormat = %q, want %q", name, got, tc.want)
		}
	}
}

// What the Makefile and the programs under hack/ build is ignored by git,
// so that it cannot be committed by accident.
func TestBuildOutputsAreIgnored(t *testing.T) {
	if err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skipf("not a git work tree (%v): nothing to check", err)
	}
	for _, path := range []string{
		"bin/watchgate",         // make build
		"bin/kubectl-watchgate", // make build, make plugin
		"bin/plugin/kubectl-watchgate_v1_linux_amd64.tar.gz", // make plugin-dist
		"cmd/kubectl-watchgate/kubectl-watchgate",            // go build in cmd/kubectl-watchgate
		"bin/demo",                               // make demo (hack/demo.sh)
		"watchgate",                              // go build .
		"hack/bench/bench",                       // go build in hack/bench (make bench uses go run)
		"hack/demo/demo",                         // go build in hack/demo
		"hack/testbin/etcd/etcd",                 // go build in hack/testbin/etcd (hack/testbin.sh builds into its cache)
		"hack/tools/bin/controller-gen",          // tools
		"test/e2e/testdata/bareproxy/bareproxy",  // go build of the bare proxy
		"proxy/proxy.test",                       // go test -c
		"proxy/cpu.out", "cover.html", "x.pprof", // profiles and coverage
	} {
		if err := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", path).Run(); err != nil {
			t.Errorf("%s is not ignored by .gitignore (git check-ignore: %v)", path, err)
		}
	}
}
