package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
)

// topOptions are the flags of `kubectl watchgate top`.
type topOptions struct {
	namespace   string
	service     string
	budget      string
	sort        string
	limit       int
	output      string
	caFile      string
	caNamespace string
	// replicaURLs skip discovery and port-forward: the replicas are
	// reached at these URLs directly (a replica run outside a cluster, a
	// port already forwarded, the end-to-end test without a kubelet).
	replicaURLs []string
	serverName  string
}

// defaultNamespace is the namespace docs/operators.md installs into.
const defaultNamespace = "watchgate-system"

func (o *topOptions) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.service, "service", "watchgate", "Name of watchgate's proxy Service: its selector finds the replicas, its DNS name <service>.<namespace>.svc is the name their certificate is verified for.")
	fs.StringVar(&o.budget, "budget", "", "List only this WatchBudget (the caller then needs get on its status only).")
	fs.StringVar(&o.sort, "sort", string(topv1alpha1.SortRejections), "Rank identities by rejections, opens (watches admitted) or watches (open now).")
	fs.IntVar(&o.limit, "limit", topv1alpha1.DefaultLimit, fmt.Sprintf("Identities listed per budget and replica, 1 to %d.", topv1alpha1.MaxLimit))
	fs.StringVarP(&o.output, "output", "o", "", "Output format: empty for a table, or json.")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM file of the CA to verify replicas with, instead of the ConfigMap watchgate-root-ca.crt.")
	fs.StringVar(&o.caNamespace, "ca-namespace", "", "Namespace to read the ConfigMap watchgate-root-ca.crt from; default the --namespace. The CA publisher writes it (with injection on) into watchgate's namespace and every namespace labelled watchgate.io/inject=enabled.")
	fs.StringSliceVar(&o.replicaURLs, "replica-url", nil, "Reach replicas at these https:// URLs instead of finding the Service's pods and port-forwarding to them (repeatable).")
	fs.StringVar(&o.serverName, "replica-server-name", "", "Name to verify the replicas' certificate for; default <service>.<namespace>.svc.")
}

// validate checks the flags that need no cluster.
func (o *topOptions) validate() error {
	var errs []string
	if !slices.Contains(topv1alpha1.Sorts, topv1alpha1.Sort(o.sort)) {
		errs = append(errs, fmt.Sprintf("--sort: want one of %v", topv1alpha1.Sorts))
	}
	if o.limit < 1 || o.limit > topv1alpha1.MaxLimit {
		errs = append(errs, fmt.Sprintf("--limit: want 1 to %d", topv1alpha1.MaxLimit))
	}
	if o.output != "" && o.output != "json" {
		errs = append(errs, "--output: want json or nothing (a table)")
	}
	for _, u := range o.replicaURLs {
		if p, err := url.Parse(u); err != nil || p.Scheme != "https" || p.Host == "" {
			errs = append(errs, fmt.Sprintf("--replica-url %q: want https://host:port", u))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// query is the top endpoint's path and query for the options.
func (o *topOptions) query() string {
	v := url.Values{}
	v.Set(topv1alpha1.ParamSort, o.sort)
	v.Set(topv1alpha1.ParamLimit, strconv.Itoa(o.limit))
	if o.budget != "" {
		v.Set(topv1alpha1.ParamBudget, o.budget)
	}
	return topv1alpha1.Path + "?" + v.Encode()
}

// runTop is `kubectl watchgate top`.
func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kubectl watchgate top", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var o topOptions
	o.bind(fs)
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&loading.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file; default $KUBECONFIG or ~/.kube/config.")
	overrides := &clientcmd.ConfigOverrides{}
	clientcmd.BindOverrideFlags(overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	fs.Usage = func() {
		fmt.Fprintf(stderr, "kubectl watchgate top lists, per budget and replica, the identities with the most rejections, watch opens or open watches.\n\nUsage:\n  kubectl watchgate top [flags]\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return exitCode(2)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := o.validate(); err != nil {
		return err
	}
	o.namespace = overrides.Context.Namespace
	if o.namespace == "" {
		o.namespace = defaultNamespace
	}
	if o.caNamespace == "" {
		o.caNamespace = o.namespace
	}
	if o.serverName == "" {
		o.serverName = o.service + "." + o.namespace + ".svc"
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	c, err := newCluster(cfg)
	if err != nil {
		return err
	}
	reports, errs := collect(ctx, c, &o)
	for _, err := range errs {
		fmt.Fprintln(stderr, "error:", err)
	}
	if len(reports) == 0 && len(errs) > 0 {
		return exitCode(1)
	}
	if err := print(stdout, &o, reports); err != nil {
		return err
	}
	if len(errs) > 0 {
		return exitCode(1)
	}
	return nil
}

// collect reads every replica's report, at most maxParallel at once. A
// replica that cannot be read is an error of its own; the others are
// still reported.
func collect(ctx context.Context, c *cluster, o *topOptions) ([]topv1alpha1.TopReport, []error) {
	ca, err := c.caBundle(ctx, o)
	if err != nil {
		return nil, []error{err}
	}
	client, err := c.replicaClient(ca, o.serverName)
	if err != nil {
		return nil, []error{err}
	}
	var targets []replica
	if len(o.replicaURLs) > 0 {
		for _, u := range o.replicaURLs {
			targets = append(targets, replica{name: u, url: strings.TrimSuffix(u, "/")})
		}
	} else {
		targets, err = c.replicas(ctx, o.namespace, o.service)
		if err != nil {
			return nil, []error{err}
		}
	}
	const maxParallel = 4
	var (
		mu      sync.Mutex
		reports []topv1alpha1.TopReport
		errs    []error
		wg      sync.WaitGroup
		slots   = make(chan struct{}, maxParallel)
	)
	for _, r := range targets {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			rep, err := c.read(ctx, client, r, o.query())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("replica %s: %w", r.name, err))
				return
			}
			reports = append(reports, *rep)
		})
	}
	wg.Wait()
	slices.SortFunc(reports, func(a, b topv1alpha1.TopReport) int { return strings.Compare(a.Replica, b.Replica) })
	return reports, errs
}

// print writes the reports as a table, or with -o json as a v1 List.
func print(w io.Writer, o *topOptions, reports []topv1alpha1.TopReport) error {
	if o.output == "json" {
		list := struct {
			APIVersion string                  `json:"apiVersion"`
			Kind       string                  `json:"kind"`
			Items      []topv1alpha1.TopReport `json:"items"`
		}{"v1", "List", reports}
		if list.Items == nil {
			list.Items = []topv1alpha1.TopReport{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "    ")
		return enc.Encode(list)
	}
	rows := tableRows(reports, topv1alpha1.Sort(o.sort))
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No identities found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 6, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "BUDGET\tREPLICA\tIDENTITY\tREJECTIONS\tOPENS\tWATCHES")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", r.budget, r.replica, r.f.User, r.f.Rejections, r.f.Opens, r.f.Watches)
	}
	return tw.Flush()
}

// row is one line of the table.
type row struct {
	budget, replica string
	f               topv1alpha1.IdentityFigures
}

// tableRows flattens the reports: by budget, then the figure sorted by,
// most first, then replica and identity.
func tableRows(reports []topv1alpha1.TopReport, by topv1alpha1.Sort) []row {
	var rows []row
	for _, rep := range reports {
		for _, b := range rep.Budgets {
			for _, f := range b.Identities {
				rows = append(rows, row{b.Name, rep.Replica, f})
			}
		}
	}
	figure := func(f topv1alpha1.IdentityFigures) int64 {
		switch by {
		case topv1alpha1.SortOpens:
			return f.Opens
		case topv1alpha1.SortWatches:
			return f.Watches
		default:
			return f.Rejections
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if c := strings.Compare(a.budget, b.budget); c != 0 {
			return c
		}
		if fa, fb := figure(a.f), figure(b.f); fa != fb {
			if fa > fb {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.replica, b.replica); c != 0 {
			return c
		}
		return strings.Compare(a.f.User, b.f.User)
	})
	return rows
}
