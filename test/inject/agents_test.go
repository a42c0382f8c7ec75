package inject

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

const agentGroup = "agents.inject.watchgate.test"

// chartBudgets renders the chart's default WatchBudgets (the Deployment's
// --bootstrap-budgets) with both switched to Enforce and compiles them as
// the controllers would.
func chartBudgets(t *testing.T) map[string]ratelimit.Budget {
	t.Helper()
	root := apiserver.RepoRoot()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile="+filepath.Join(root, "hack", "tools", "go.mod"), "helm", "template", "watchgate",
		filepath.Join(root, "charts", "watchgate"), "--namespace", "watchgate-system", "--kube-version", "1.37.2",
		"--show-only", "templates/deployment.yaml",
		"--set", "defaultBudget.enforcement=Enforce", "--set", "agentsBudget.enforcement=Enforce")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v: %s", err, stderr.String())
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args []string `json:"args"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &dep); err != nil {
		t.Fatal(err)
	}
	var flag string
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--bootstrap-budgets="); ok {
				flag = v
			}
		}
	}
	boot, err := controllers.ParseBootstrapBudgets(flag)
	if err != nil {
		t.Fatalf("the chart's --bootstrap-budgets: %v", err)
	}
	budgets := map[string]ratelimit.Budget{}
	for i := range boot {
		b, err := boot[i].Budget()
		if err != nil {
			t.Fatalf("the chart's budgets: %v", err)
		}
		budgets[b.Name] = b
	}
	for _, name := range []string{"watchgate-default", "watchgate-agents", "watchgate-exempt"} {
		if _, ok := budgets[name]; !ok {
			t.Fatalf("chart renders no budget %s: %v", name, budgets)
		}
	}
	return budgets
}

func values(m map[string]ratelimit.Budget) []ratelimit.Budget {
	var bs []ratelimit.Budget
	for _, b := range m {
		bs = append(bs, b)
	}
	return bs
}

// The rule itself, on the chart's budgets: 70 start-up watches in a
// service account's own name are all admitted, while the same 70 made on
// behalf of an impersonated service account are throttled by the
// catch-all, as they should be.
func TestChartBudgetsGovernImpersonatedUsersNotTheAgent(t *testing.T) {
	budgets := chartBudgets(t)
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy(values(budgets))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	engine.SetPolicy(now, policy)
	decide := func(user string, impersonated bool) (allowed int, budget string) {
		for i := range 70 {
			d := engine.Decide(now, &ratelimit.Request{
				User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, Verb: ratelimit.VerbWatch,
				Group: agentGroup, Resource: fmt.Sprintf("things%d", i), Impersonated: impersonated,
			})
			if d.Allowed {
				allowed++
			}
			budget = d.Budget
		}
		return allowed, budget
	}
	if n, b := decide("system:serviceaccount:cattle-system:cattle", false); n != 70 || b != "watchgate-agents" {
		t.Errorf("agent's own watches: %d of 70 allowed by %s, want 70 by watchgate-agents", n, b)
	}
	if n, b := decide("system:serviceaccount:cattle-impersonation-system:cattle-impersonation-u-abc", true); n >= 70 || b != "watchgate-default" {
		t.Errorf("impersonated watches: %d of 70 allowed by %s, want fewer by watchgate-default", n, b)
	}
}

// agentCRDs creates (once per API server) n CRDs of their own resources.
func agentCRDs(t *testing.T, n int) []schema.GroupVersionResource {
	t.Helper()
	ctx := context.Background()
	cs, err := apiextensionsclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	var gvrs []schema.GroupVersionResource
	for i := range n {
		plural := fmt.Sprintf("things%d", i)
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + agentGroup},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: agentGroup, Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: fmt.Sprintf("thing%d", i), Kind: fmt.Sprintf("Thing%d", i), ListKind: fmt.Sprintf("Thing%dList", i)},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTrue()}},
				}},
			},
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		gvrs = append(gvrs, schema.GroupVersionResource{Group: agentGroup, Version: "v1", Resource: plural})
	}
	for _, gvr := range gvrs {
		eventually(t, 60*time.Second, "CRD "+gvr.Resource+" established", func() (bool, error) {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, gvr.Resource+"."+agentGroup, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	}
	return gvrs
}

func ptrTrue() *bool { b := true; return &b }

// syncInformers starts one informer per resource with cfg, waits until all
// have synced and returns how long that took and how many 429s came back.
func syncInformers(t *testing.T, cfg *rest.Config, gvrs []schema.GroupVersionResource) (time.Duration, int64) {
	t.Helper()
	var tooMany atomic.Int64
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests {
				tooMany.Add(1)
			}
			return resp, err
		})
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	var synced []cache.InformerSynced
	for _, gvr := range gvrs {
		synced = append(synced, f.ForResource(gvr).Informer().HasSynced)
	}
	start := time.Now()
	f.Start(ctx.Done())
	syncCtx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		t.Fatalf("%d informers did not sync within 2m (%d 429s)", len(gvrs), tooMany.Load())
	}
	d := time.Since(start)
	cancel()
	f.Shutdown()
	return d, tooMany.Load()
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An agent with 70 informers on distinct resources, through watchgate with
// the chart's default budgets enforced, syncs all of them with no 429 and
// within twice the time it takes directly (plus a second, so that a
// sub-second direct sync on a loaded machine does not make the bound a coin
// toss). The one timed assertion here, because a start as fast as a
// direct one is what injection promises; its figures are logged.
func TestAgentWith70InformersStartsAsFastAsDirectly(t *testing.T) {
	gvrs := agentCRDs(t, 70)
	ns := uniqueName("agent")
	// Each start is a new agent (service account): a start that is stopped
	// within a second ends its watches "short", and the backoff rightly
	// holds back the same identity's next watches on those resources.
	agent := func(i int) apiserver.ServiceAccount {
		sa, err := env.ServiceAccount(context.Background(), ns, fmt.Sprintf("agent-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Grant(context.Background(), sa, rbacv1.PolicyRule{APIGroups: []string{agentGroup}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}); err != nil {
			t.Fatal(err)
		}
		return sa
	}
	p := startProxy(t, values(chartBudgets(t))...)
	proxiedCfg := func(sa apiserver.ServiceAccount) *rest.Config {
		cfg := env.ConfigFor(sa.Token, "https://"+p.Addr().String(), p.CA)
		// The proxy's first request with a token reviews it; warm that up.
		dc, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "RBAC for "+sa.Name, func() (bool, error) {
			_, err := dc.Resource(gvrs[0]).Namespace(ns).List(context.Background(), metav1.ListOptions{Limit: 1})
			return err == nil, err
		})
		return cfg
	}
	// Warm up: right after their CRDs are established the API server
	// itself answers some requests with 429 while it builds their storage.
	// Then the best of three each, so that one scheduling hiccup on a
	// loaded machine does not decide the comparison.
	directSA := agent(0)
	directCfg := env.ConfigFor(directSA.Token, "", nil)
	syncInformers(t, directCfg, gvrs)
	var direct, proxied time.Duration
	var directTooMany, proxiedTooMany int64
	for i := range 3 {
		d, n := syncInformers(t, directCfg, gvrs)
		directTooMany += n
		pr, m := syncInformers(t, proxiedCfg(agent(i+1)), gvrs)
		proxiedTooMany += m
		if i == 0 || d < direct {
			direct = d
		}
		if i == 0 || pr < proxied {
			proxied = pr
		}
	}
	t.Logf("70 informers synced (best of 3): direct %v, through watchgate %v", direct, proxied)
	if directTooMany != 0 || proxiedTooMany != 0 {
		t.Errorf("429s: direct %d, through watchgate %d; want none", directTooMany, proxiedTooMany)
	}
	if proxied > 2*direct+time.Second {
		t.Errorf("through watchgate %v, more than twice direct (%v) plus 1s", proxied, direct)
	}
	stats := p.Engine.Stats()
	if got := stats["watchgate-agents"].Decisions["Allowed"]; got < 70 {
		t.Errorf("watchgate-agents allowed %d requests, want >= 70: %+v", got, stats)
	}
	for name, s := range stats {
		for reason, n := range s.Decisions {
			if reason != "Allowed" && n > 0 {
				t.Errorf("budget %s decided %s %d times", name, reason, n)
			}
		}
	}
}
