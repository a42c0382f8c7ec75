package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// +kubebuilder:rbac:groups=watchgate.io,resources=watchbudgets,verbs=get;list;watch;create;patch;delete

// AutoUpdateAnnotation marks whether watchgate keeps a bootstrapped budget's
// spec up to date, as API Priority and Fairness's
// apf.kubernetes.io/autoupdate-spec does for its bootstrap FlowSchemas:
// "true" (set when watchgate creates it) keeps it up to date, "false"
// means an operator took it over. A suggested budget without it (or with
// a value that is no boolean) is kept up to date only while it was never
// edited (metadata.generation 1); a mandatory one always is.
const AutoUpdateAnnotation = "watchgate.io/autoupdate-spec"

// BootstrapLabel marks the budgets an install bootstraps; its value is the
// install's namespace, so that installs sharing the CRD never delete each
// other's budgets.
const BootstrapLabel = "watchgate.io/bootstrap"

// fieldOwnerBootstrap is the field manager of the spec of bootstrapped
// budgets.
const fieldOwnerBootstrap = "watchgate-bootstrap"

// BootstrapBudget is one budget watchgate keeps in place (--bootstrap-budgets).
type BootstrapBudget struct {
	// Name of the WatchBudget.
	Name string `json:"name"`
	// Mandatory budgets are restored when deleted and their spec when
	// edited, whatever their AutoUpdateAnnotation says; the others
	// (suggested) are created when missing and kept up to date until an
	// operator takes them over.
	Mandatory bool `json:"mandatory,omitempty"`
	// Labels are added to the budget's metadata.
	Labels map[string]string `json:"labels,omitempty"`
	// Spec is the budget's spec, as JSON: only the fields set here are
	// watchgate's (server-side apply); the API server defaults the others.
	Spec map[string]any `json:"spec"`
}

// WatchBudget is b as the object it keeps in place (before the API server
// defaults it), for tests and tools that read the chart's budgets.
func (b *BootstrapBudget) WatchBudget() (*v1alpha1.WatchBudget, error) {
	raw, err := json.Marshal(b.Spec)
	if err != nil {
		return nil, err
	}
	wb := &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: b.Name, Labels: b.Labels}}
	if err := json.Unmarshal(raw, &wb.Spec); err != nil {
		return nil, fmt.Errorf("budget %s: spec: %w", b.Name, err)
	}
	return wb, nil
}

// Budget is b as the proxy enforces it (WatchBudget, then ToBudget), for
// tests and tools that read the chart's budgets.
func (b *BootstrapBudget) Budget() (ratelimit.Budget, error) {
	wb, err := b.WatchBudget()
	if err != nil {
		return ratelimit.Budget{}, err
	}
	budget, err := ToBudget(wb)
	if err != nil {
		return ratelimit.Budget{}, fmt.Errorf("budget %s: %w", b.Name, err)
	}
	return budget, nil
}

// ParseBootstrapBudgets reads --bootstrap-budgets: a JSON list of
// BootstrapBudgets. It rejects unknown fields (in the spec too), names
// that are no DNS subdomain, a name given twice, and an Exempt budget
// without subjects (which would exempt everyone). Empty means none.
func ParseBootstrapBudgets(s string) ([]BootstrapBudget, error) {
	if s == "" {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.DisallowUnknownFields()
	var out []BootstrapBudget
	if err := d.Decode(&out); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var errs []error
	for i, b := range out {
		if msgs := validation.IsDNS1123Subdomain(b.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("budget %d: name %q: %v", i, b.Name, msgs))
			continue
		}
		if seen[b.Name] {
			errs = append(errs, fmt.Errorf("budget %s: given twice", b.Name))
		}
		seen[b.Name] = true
		raw, err := json.Marshal(b.Spec)
		if err != nil {
			return nil, err
		}
		var spec v1alpha1.WatchBudgetSpec
		sd := json.NewDecoder(bytes.NewReader(raw))
		sd.DisallowUnknownFields()
		if err := sd.Decode(&spec); err != nil {
			errs = append(errs, fmt.Errorf("budget %s: spec: %w", b.Name, err))
			continue
		}
		if spec.Enforcement == v1alpha1.EnforcementExempt && len(spec.Subjects) == 0 {
			errs = append(errs, fmt.Errorf("budget %s: an Exempt budget needs subjects (none would exempt everyone)", b.Name))
		}
	}
	return out, errors.Join(errs...)
}

// BootstrapReconciler keeps an install's default budgets in place, the way
// kube-apiserver keeps API Priority and Fairness's bootstrap
// configuration: it creates every budget of Budgets that is missing (again
// after a deletion), keeps the spec of the mandatory ones as Budgets say,
// and that of the suggested ones too unless an operator took one over
// (AutoUpdateAnnotation "false", or an edit of a budget without the
// annotation). A budget it bootstrapped (BootstrapLabel = Install) that
// is no longer in Budgets and still auto-updated is deleted. It runs on
// the leader only.
//
// It writes the spec with server-side apply as field manager
// watchgate-bootstrap, forcing ownership: an edit of a field it sets is
// undone unless the budget is taken over; a field it does not set keeps
// whatever an operator gave it. Nothing else in the chart or in Helm
// writes these budgets, so `helm upgrade` neither re-creates them nor
// touches a taken-over one.
type BootstrapReconciler struct {
	// Client reads WatchBudgets (normally from the manager's cache) and
	// writes them.
	Client client.Client
	// Budgets are the budgets to keep.
	Budgets []BootstrapBudget
	// Install names this install (its namespace): the value of
	// BootstrapLabel on the budgets it creates. Without one it deletes
	// nothing.
	Install string
}

// SetupWithManager registers the reconciler (leader only), and queues
// every budget of Budgets once the cache has synced, so that a missing
// one is created without waiting for an event.
func (r *BootstrapReconciler) SetupWithManager(mgr ctrl.Manager) error {
	byName := make(map[string]bool, len(r.Budgets))
	for _, b := range r.Budgets {
		byName[b.Name] = true
	}
	ours := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if byName[o.GetName()] || (r.Install != "" && o.GetLabels()[BootstrapLabel] == r.Install) {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
		}
		return nil
	})
	first := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		for _, b := range r.Budgets {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: b.Name}})
		}
		return nil
	})
	// Status writes change neither the generation nor the metadata.
	changed := predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, predicate.LabelChangedPredicate{})
	return ctrl.NewControllerManagedBy(mgr).
		Named("watchbudget-bootstrap").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		WatchesRawSource(source.Kind(mgr.GetCache(), client.Object(&v1alpha1.WatchBudget{}), ours, changed)).
		WatchesRawSource(first).
		Complete(r)
}

// Reconcile brings one budget in line with Budgets.
func (r *BootstrapReconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx).WithValues("watchBudget", req.Name)
	var want *BootstrapBudget
	for i := range r.Budgets {
		if r.Budgets[i].Name == req.Name {
			want = &r.Budgets[i]
		}
	}
	var wb v1alpha1.WatchBudget
	err := r.Client.Get(ctx, req.NamespacedName, &wb)
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	switch {
	case want == nil:
		if !found || r.Install == "" || wb.Labels[BootstrapLabel] != r.Install || !autoUpdateSet(&wb) {
			return ctrl.Result{}, nil
		}
		// No longer wanted, and nobody took it over (as of the version
		// read: a take-over since then makes it a conflict).
		err := r.Client.Delete(ctx, &wb, client.Preconditions{UID: &wb.UID, ResourceVersion: &wb.ResourceVersion})
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, nil
		case apierrors.IsConflict(err):
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if err == nil {
			log.Info("Deleted a bootstrapped budget no longer configured")
		}
		return ctrl.Result{}, err
	case !found, want.Mandatory, shouldUpdateSpec(&wb):
		// Applied against the version read: an operator's take-over that
		// the cache has not shown yet makes it a conflict, and the next
		// round reads it, rather than being overwritten.
		rv := ""
		if found {
			rv = wb.ResourceVersion
		}
		if err := r.apply(ctx, want, rv); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			return ctrl.Result{}, err
		}
		if !found {
			log.Info("Created bootstrapped budget", "mandatory", want.Mandatory)
		}
		return ctrl.Result{}, nil
	case wb.Annotations[AutoUpdateAnnotation] != "false":
		// Edited without the annotation: taken over. Say so, as API
		// Priority and Fairness does, with a patch of the annotation
		// alone (an apply without the spec would drop the spec fields
		// this field manager owns).
		patch := client.MergeFrom(wb.DeepCopy())
		if wb.Annotations == nil {
			wb.Annotations = map[string]string{}
		}
		wb.Annotations[AutoUpdateAnnotation] = "false"
		if err := r.Client.Patch(ctx, &wb, patch, client.FieldOwner(fieldOwnerBootstrap)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		log.Info("Left an edited budget to its operator", "annotation", AutoUpdateAnnotation+"=false")
	}
	return ctrl.Result{}, nil
}

// apply writes b with server-side apply, forcing ownership of its fields;
// with resourceVersion set, only over that version of the budget.
func (r *BootstrapReconciler) apply(ctx context.Context, b *BootstrapBudget, resourceVersion string) error {
	labels := map[string]any{}
	for k, v := range b.Labels {
		labels[k] = v
	}
	if r.Install != "" {
		labels[BootstrapLabel] = r.Install
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "WatchBudget",
		"metadata": map[string]any{
			"name":        b.Name,
			"labels":      labels,
			"annotations": map[string]any{AutoUpdateAnnotation: "true"},
		},
		"spec": b.Spec,
	}}
	if resourceVersion != "" {
		u.SetResourceVersion(resourceVersion)
	}
	return r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.ForceOwnership, client.FieldOwner(fieldOwnerBootstrap))
}

// shouldUpdateSpec reports whether a suggested budget is still watchgate's
// to keep: AutoUpdateAnnotation parses as true, or, without a boolean
// there, the budget was never edited (generation 1), as API Priority and
// Fairness's ensurer decides.
func shouldUpdateSpec(wb *v1alpha1.WatchBudget) bool {
	if v, err := strconv.ParseBool(wb.Annotations[AutoUpdateAnnotation]); err == nil {
		return v
	}
	return wb.Generation == 1
}

// autoUpdateSet reports whether AutoUpdateAnnotation says true.
func autoUpdateSet(o metav1.Object) bool {
	v, err := strconv.ParseBool(o.GetAnnotations()[AutoUpdateAnnotation])
	return err == nil && v
}
