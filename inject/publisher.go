package inject

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// ManagedByLabel marks the ConfigMaps the publisher owns.
const managedBy = "watchgate"

// What the publisher reads, it reads from its own cache (newLocalCache):
// namespaces' and labelled pods' metadata, and ConfigMaps named
// watchgate-root-ca.crt. RBAC cannot narrow a list or watch by label, so
// namespaces and pods are readable cluster-wide; the cache asks only for
// labelled pods, and for metadata only.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
//
// The ConfigMaps: every verb but create is limited to the one name (a list
// or watch with the field selector metadata.name is authorized against
// resourceNames). Kubernetes cannot limit create by resourceNames (the
// name is not part of the request's URL), so create is granted for every
// ConfigMap name in every namespace.
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=watchgate-root-ca.crt,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=create

// CAPublisher keeps ConfigMapName, holding CA's bundle under ConfigMapKey,
// in every namespace that is labelled LabelInject=enabled or has a pod so
// labelled (leader only). Like kube-root-ca.crt, it never deletes the
// ConfigMap: routed pods may still mount it after the label is gone.
type CAPublisher struct {
	// Client writes ConfigMaps.
	Client client.Client
	// Local reads namespaces' and labelled pods' metadata and the
	// published ConfigMaps: a cache of its own, restricted to those (see
	// newLocalCache), so that watchgate does not cache every pod and
	// ConfigMap of the cluster.
	Local cache.Cache
	// CA is the bundle to publish.
	CA *CASource
	// ExcludedNamespaces get no ConfigMap, unless PublishTo names them.
	ExcludedNamespaces []string
	// PublishTo get the ConfigMap whatever their labels: watchgate's own
	// namespace, where `kubectl watchgate top` reads the CA with a Role in
	// that namespace only.
	PublishTo []string
}

// Reconcile publishes the CA in one namespace.
func (p *CAPublisher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	always := slices.Contains(p.PublishTo, name)
	if !always && slices.Contains(p.ExcludedNamespaces, name) {
		return reconcile.Result{}, nil
	}
	ns := metadataOf("Namespace")
	if err := p.Local.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ns.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	need := always || ns.Labels[LabelInject] == ValueEnabled
	if !need {
		pods := &metav1.PartialObjectMetadataList{}
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := p.Local.List(ctx, pods, client.InNamespace(name), client.MatchingLabels{LabelInject: ValueEnabled}, client.Limit(1)); err != nil {
			return reconcile.Result{}, err
		}
		need = len(pods.Items) > 0
	}
	if !need {
		return reconcile.Result{}, nil
	}
	ca := p.CA.Current()
	if len(ca) == 0 {
		return reconcile.Result{}, fmt.Errorf("no CA bundle loaded")
	}
	cm := &corev1.ConfigMap{}
	err := p.Local.Get(ctx, types.NamespacedName{Namespace: name, Name: ConfigMapName}, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: ConfigMapName, Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy}},
			Data:       map[string]string{ConfigMapKey: string(ca)},
		}
		err := p.Client.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("create %s/%s: not in cache yet: %w", name, ConfigMapName, err)
		}
		return reconcile.Result{}, err
	case err != nil:
		return reconcile.Result{}, err
	}
	if bytes.Equal([]byte(cm.Data[ConfigMapKey]), ca) {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[ConfigMapKey] = string(ca)
	return reconcile.Result{}, p.Client.Patch(ctx, cm, patch)
}

// SetupWithManager watches namespaces, the labelled pods and the published
// ConfigMaps (each mapped to its namespace), and the CA's changes (every
// namespace).
func (p *CAPublisher) SetupWithManager(mgr ctrl.Manager) error {
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	everyNamespace := handler.TypedFuncs[client.Object, reconcile.Request]{
		GenericFunc: func(ctx context.Context, _ event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
			if err := p.Local.List(ctx, list); err != nil {
				return
			}
			for i := range list.Items {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
			}
		},
	}
	self := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("watchgate-ca-publisher").
		WatchesRawSource(source.Kind(p.Local, client.Object(metadataOf("Namespace")), self)).
		WatchesRawSource(source.Kind(p.Local, client.Object(metadataOf("Pod")), toNamespace)).
		WatchesRawSource(source.Kind(p.Local, client.Object(&corev1.ConfigMap{}), toNamespace)).
		WatchesRawSource(source.Channel(p.CA.Events(), everyNamespace)).
		Complete(p)
}

// metadataOf is an empty metadata-only object of a core kind.
func metadataOf(kind string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	return m
}
