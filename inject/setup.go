package inject

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Options configure the webhook and the CA publisher.
type Options struct {
	// Target is watchgate's Service, where routed pods are pointed.
	Target Target
	// ExcludedNamespaces are never routed and get no ConfigMap; always
	// include kube-system and watchgate's own namespace.
	ExcludedNamespaces []string
	// CA is the bundle published in watchgate-root-ca.crt. Required.
	CA *CASource
	// WebhookServer serves the webhook (at WebhookPath); nil runs only the
	// publisher. SetupWithManager adds it to the manager.
	WebhookServer webhook.Server
}

// Pieces are what SetupWithManager added.
type Pieces struct {
	Injector  *PodInjector
	Publisher *CAPublisher
}

// SetupWithManager adds the CA publisher (leader only), the CA file watcher,
// and, with opts.WebhookServer, the injection webhook to mgr. It loads the
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
	local, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(),
		Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:       {Label: labels.SelectorFromSet(labels.Set{LabelInject: ValueEnabled})},
			&corev1.ConfigMap{}: {Field: fields.OneTermEqualSelector("metadata.name", ConfigMapName)},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("inject: cache: %w", err)
	}
	if err := mgr.Add(local); err != nil {
		return nil, err
	}
	if err := mgr.Add(opts.CA); err != nil {
		return nil, err
	}
	p := &Pieces{Publisher: &CAPublisher{
		Client: mgr.GetClient(), Namespaces: mgr.GetCache(), Local: local, CA: opts.CA,
		ExcludedNamespaces: opts.ExcludedNamespaces,
	}}
	if err := p.Publisher.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("inject: publisher: %w", err)
	}
	if opts.WebhookServer != nil {
		p.Injector = &PodInjector{
			Reader: mgr.GetCache(), Target: opts.Target, ExcludedNamespaces: opts.ExcludedNamespaces,
			Decoder: admission.NewDecoder(mgr.GetScheme()),
		}
		opts.WebhookServer.Register(WebhookPath, &webhook.Admission{Handler: p.Injector})
		// Not a readiness check: the proxy's readiness must not depend on
		// the webhook (failurePolicy Ignore covers a webhook that is down).
		if err := mgr.Add(opts.WebhookServer); err != nil {
			return nil, err
		}
	}
	return p, nil
}
