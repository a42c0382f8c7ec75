package inject

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/metadata"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Options configure the webhook and the CA publisher.
type Options struct {
	// Target is watchgate's Service, where routed pods are pointed.
	Target Target
	// ExcludedNamespaces are never routed and get no ConfigMap; always
	// include kube-system and watchgate's own namespace.
	ExcludedNamespaces []string
	// PublishTo are namespaces that get the ConfigMap whatever their labels,
	// even excluded ones: watchgate's own, for `kubectl watchgate top`.
	PublishTo []string
	// CA is the bundle published in watchgate-root-ca.crt. Required.
	CA *CASource
	// WebhookServer serves the webhook (at WebhookPath); nil runs only the
	// publisher. SetupWithManager adds it to the manager.
	WebhookServer webhook.Server
	// Limits bound what admission reviews may cost; zero fields take the
	// defaults.
	Limits AdmissionLimits
}

// Pieces are what SetupWithManager added.
type Pieces struct {
	Injector  *PodInjector
	Publisher *CAPublisher
	Unrouted  *UnroutedPods
}

// SetupWithManager adds the CA publisher and UnroutedPods (leader only),
// the CA file watcher, and, with opts.WebhookServer, the injection webhook
// to mgr. It loads the
// CA once and fails if it cannot.
func SetupWithManager(mgr ctrl.Manager, opts Options) (*Pieces, error) {
	if opts.CA == nil {
		return nil, errors.New("inject: a CA source is required")
	}
	if opts.Target.Host == "" || opts.Target.Port < 1 || opts.Target.Port > 65535 {
		return nil, fmt.Errorf("inject: target %q:%d: need a host and a port in 1-65535", opts.Target.Host, opts.Target.Port)
	}
	if _, err := opts.CA.Load(); err != nil {
		return nil, fmt.Errorf("inject: %w", err)
	}
	local, err := newLocalCache(mgr)
	if err != nil {
		return nil, fmt.Errorf("inject: cache: %w", err)
	}
	if err := mgr.Add(replicaCache{local}); err != nil {
		return nil, err
	}
	if err := mgr.Add(opts.CA); err != nil {
		return nil, err
	}
	p := &Pieces{Publisher: &CAPublisher{
		Client: mgr.GetClient(), Local: local, CA: opts.CA,
		ExcludedNamespaces: opts.ExcludedNamespaces, PublishTo: opts.PublishTo,
	}}
	if err := p.Publisher.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("inject: publisher: %w", err)
	}
	meta, err := metadata.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("inject: %w", err)
	}
	p.Unrouted = &UnroutedPods{
		Pods: meta.Resource(corev1.SchemeGroupVersion.WithResource("pods")), Namespaces: local,
		ExcludedNamespaces: opts.ExcludedNamespaces, Recorder: mgr.GetEventRecorder("watchgate"),
	}
	if err := mgr.Add(p.Unrouted); err != nil {
		return nil, err
	}
	if opts.WebhookServer != nil {
		p.Injector = &PodInjector{
			Reader: local, Target: opts.Target, ExcludedNamespaces: opts.ExcludedNamespaces,
			Limits: opts.Limits,
		}
		opts.WebhookServer.Register(WebhookPath, p.Injector)
		// Not a readiness check: the proxy's readiness must not depend on
		// the webhook (failurePolicy Ignore covers a webhook that is down).
		if err := mgr.Add(opts.WebhookServer); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// newLocalCache is the injector's own cache, holding only what it reads:
// namespaces' and labelled pods' metadata (names and labels; every other
// field is dropped before it is stored), and the published ConfigMaps
// (selected by name). Nothing else of the cluster is cached, so a tenant
// who creates many or large pods grows no replica's memory unless the
// pods carry the label, and then only by their names.
func newLocalCache(mgr ctrl.Manager) (cache.Cache, error) {
	return cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(),
		Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Namespace{}: {Transform: keepNameAndLabels},
			&corev1.Pod{}: {
				Label:     labels.SelectorFromSet(labels.Set{LabelInject: ValueEnabled}),
				Transform: keepNameAndLabels,
			},
			&corev1.ConfigMap{}: {
				Field:     fields.OneTermEqualSelector("metadata.name", ConfigMapName),
				Transform: cache.TransformStripManagedFields(),
			},
		},
	})
}

// replicaCache runs the injector's cache as the manager runs its own: on
// every replica, leader or not, started and synced before the manager
// starts its other runnables. The webhook server runs on every replica and
// reads this cache on whichever one kube-apiserver calls; a bare cache.Cache
// is a leader-election runnable to the manager, started on the leader
// only, and the other replicas would answer every pod "namespace unknown:
// the cache is not started" and admit it unrouted (failurePolicy Ignore).
type replicaCache struct{ cache.Cache }

// GetCache puts c in the manager's group of caches (hasCache).
func (c replicaCache) GetCache() cache.Cache { return c.Cache }

// keepNameAndLabels strips a metadata-only object down to what the
// injector reads.
func keepNameAndLabels(in any) (any, error) {
	m, ok := in.(*metav1.PartialObjectMetadata)
	if !ok {
		return in, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: m.Labels, DeletionTimestamp: m.DeletionTimestamp,
	}}, nil
}
