package top

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/utils/clock"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/ratelimit"
)

// topEngine is the part of *ratelimit.Engine the top endpoint reads.
type topEngine interface {
	Top(budget string, by ratelimit.TopOrder, n int) map[string][]ratelimit.IdentityFigures
}

// Reads of the top endpoint walk every tracked identity of the budgets
// asked for (ratelimit.Engine.Top), so the replica computes at most
// topReadsPerSecond of them for each caller, topReadBurst at once; beyond
// that the caller gets 429 with Retry-After. Each caller has a bucket of
// its own (callers past maxTopAccessAnswers share one), so that one
// reader's loop never refuses another's read.
const (
	topReadsPerSecond = 2
	topReadBurst      = 4
)

// MaxAccessAnswers bounds the access checks of the top endpoint's
// callers remembered (LRU); a handful of operators read it.
const MaxAccessAnswers = 1024

// topResource is what a caller must be allowed to get to read the top
// endpoint: the WatchBudgets' status, whose top offenders it details.
var topResource = schema.GroupResource{Group: "watchgate.io", Resource: "watchbudgets"}

// Endpoint serves topv1alpha1.Path: the identities each budget tracks
// on this replica, ranked, as a TopReport. Only callers a
// SubjectAccessReview allows to get watchbudgets/status (of the one
// budget asked for, or of every budget) may read it. It is safe for
// concurrent use.
type Endpoint struct {
	engine  topEngine // nil: the engine cannot rank, 404
	access  authorizer.Authorizer
	replica string
	clock   clock.PassiveClock
	log     *sampledlog.Logger

	// Reads is the read rate per caller (topReadsPerSecond, topReadBurst);
	// tests that read often lift it.
	Reads *ratelimit.KeyRate
}

// NewEndpoint returns the top endpoint of this replica (named replica in
// its reports) that ranks with engine when engine can rank (a
// *ratelimit.Engine can; otherwise it answers 404), and checks its callers
// with access.
func NewEndpoint(engine any, access authorizer.Authorizer, replica string, clk clock.PassiveClock, log *sampledlog.Logger) *Endpoint {
	t := &Endpoint{access: access, replica: replica, Reads: ratelimit.NewKeyRate(topReadsPerSecond, topReadBurst, MaxAccessAnswers), clock: clk, log: log}
	t.engine, _ = engine.(topEngine)
	return t
}

// WithTop answers every request under topv1alpha1.PathPrefix with top,
// after authentication, and hands every other request to next: the
// paths kube-apiserver never serves are never forwarded. The path is
// matched as the API server would read it once cleaned, so that no
// spelling of it ("//.watchgate/…", "/api/../.watchgate/…") slips past to
// be forwarded.
func WithTop(top http.Handler, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/.watchgate") && isTopPath(r.URL.Path) {
			top.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isTopPath reports whether p, cleaned, is under topv1alpha1.PathPrefix.
func isTopPath(p string) bool {
	p = path.Clean("/" + p)
	return p+"/" == topv1alpha1.PathPrefix || strings.HasPrefix(p, topv1alpha1.PathPrefix)
}

// ServeHTTP answers GET topv1alpha1.Path for an authenticated caller
// (authn.WithAuthentication ran): 404 for any other path under the prefix, 405
// for another method, 400 for a bad query, 403 unless a
// SubjectAccessReview allows the caller to get watchbudgets/status, 429
// or 503 when that review is throttled or fails (never forwarded, under
// either ReviewFailurePolicy), 429 beyond topReadsPerSecond.
func (t *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if path.Clean("/"+r.URL.Path) != topv1alpha1.Path || t.engine == nil {
		answer.WriteStatus(w, r, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource",
		}})
		return
	}
	if r.Method != http.MethodGet {
		answer.WriteStatus(w, r, apierrors.NewMethodNotSupported(topResource, r.Method))
		return
	}
	caller, ok := request.CallerFrom(r.Context())
	if !ok {
		answer.WriteStatus(w, r, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	if review.IsUnreviewed(caller) {
		answer.WriteStatus(w, r, answer.ServiceUnavailable("authentication is unavailable, please try again later", 1))
		return
	}
	q, err := parseTopQuery(r)
	if err != nil {
		answer.WriteStatus(w, r, apierrors.NewBadRequest(err.Error()))
		return
	}
	decision, _, err := t.access.Authorize(r.Context(), &authorizer.AttributesRecord{
		User: caller, Verb: "get", ResourceRequest: true,
		APIGroup: topResource.Group, Resource: topResource.Resource, Subresource: "status", Name: q.budget,
	})
	switch {
	case err != nil:
		review.FailClosed.Failed(w, r, review.Access, err, t.log, "caller", sampledlog.Bounded(caller.GetName()))
		return
	case decision != authorizer.DecisionAllow:
		answer.WriteStatus(w, r, apierrors.NewForbidden(topResource, q.budget, fmt.Errorf( //nolint:staticcheck // kube-apiserver's RBAC denial, word for word: clients see it in the Status message
			"User %q cannot get resource \"watchbudgets/status\" in API group %q at the cluster scope", caller.GetName(), topResource.Group)))
		return
	}
	if wait, ok := t.Reads.Allow(t.clock.Now(), caller.GetName()); !ok {
		secs := answer.RetryAfterSeconds(wait)
		answer.WriteStatus(w, r, apierrors.NewTooManyRequests(fmt.Sprintf("too many reads of the top endpoint on this replica, please try again in %ds", secs), secs))
		return
	}
	report := t.report(q)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := json.NewEncoder(w).Encode(report); err != nil && r.Context().Err() == nil {
		t.log.Info("Cannot write the top report", "err", err.Error())
	}
}

// topQuery is a parsed query of topv1alpha1.Path.
type topQuery struct {
	budget string
	sort   topv1alpha1.Sort
	limit  int
}

// parseTopQuery reads the query's budget, sort and limit, with their
// defaults; an error names the parameter that is wrong.
func parseTopQuery(r *http.Request) (topQuery, error) {
	v := r.URL.Query()
	q := topQuery{budget: v.Get(topv1alpha1.ParamBudget), sort: topv1alpha1.SortRejections, limit: topv1alpha1.DefaultLimit}
	if q.budget != "" {
		if errs := validation.IsDNS1123Subdomain(q.budget); len(errs) > 0 {
			return q, fmt.Errorf("%s: not a WatchBudget name: %s", topv1alpha1.ParamBudget, strings.Join(errs, "; "))
		}
	}
	if s := v.Get(topv1alpha1.ParamSort); s != "" {
		q.sort = topv1alpha1.Sort(s)
		if !slices.Contains(topv1alpha1.Sorts, q.sort) {
			return q, fmt.Errorf("%s: want one of %v", topv1alpha1.ParamSort, topv1alpha1.Sorts)
		}
	}
	if s := v.Get(topv1alpha1.ParamLimit); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > topv1alpha1.MaxLimit {
			return q, fmt.Errorf("%s: want a number from 1 to %d", topv1alpha1.ParamLimit, topv1alpha1.MaxLimit)
		}
		q.limit = n
	}
	return q, nil
}

// topOrders maps the wire's sorts to the engine's orders.
var topOrders = map[topv1alpha1.Sort]ratelimit.TopOrder{
	topv1alpha1.SortRejections: ratelimit.ByRejections,
	topv1alpha1.SortOpens:      ratelimit.ByOpens,
	topv1alpha1.SortWatches:    ratelimit.ByWatches,
}

// report asks the engine for q's ranking, budgets by name.
func (t *Endpoint) report(q topQuery) *topv1alpha1.TopReport {
	ranked := t.engine.Top(q.budget, topOrders[q.sort], q.limit)
	rep := &topv1alpha1.TopReport{Replica: t.replica, Sort: q.sort, Limit: q.limit, Budgets: make([]topv1alpha1.BudgetTop, 0, len(ranked))}
	rep.Kind, rep.APIVersion = topv1alpha1.Kind, topv1alpha1.APIVersion
	for name, ids := range ranked {
		b := topv1alpha1.BudgetTop{Name: name, Identities: make([]topv1alpha1.IdentityFigures, len(ids))}
		for i, f := range ids {
			b.Identities[i] = topv1alpha1.IdentityFigures{User: f.User, Rejections: f.Rejections, Opens: f.Opens, Watches: f.Watches}
		}
		rep.Budgets = append(rep.Budgets, b)
	}
	slices.SortFunc(rep.Budgets, func(a, b topv1alpha1.BudgetTop) int { return strings.Compare(a.Name, b.Name) })
	return rep
}
