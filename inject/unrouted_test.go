package inject

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNotRouted(t *testing.T) {
	labelled := map[string]string{LabelInject: ValueEnabled}
	pod := func(ns string, labels, annotations map[string]string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", Labels: labels, Annotations: annotations}}
	}
	excluded := []string{"kube-system", "watchgate-system"}
	for name, tc := range map[string]struct {
		pod      *metav1.PartialObjectMetadata
		nsLabels map[string]string
		want     bool
	}{
		"a pod of a labelled namespace without the webhook's status is not routed": {
			pod: pod("team", nil, nil), nsLabels: labelled, want: true,
		},
		"a labelled pod of a plain namespace without the webhook's status is not routed": {
			pod: pod("team", labelled, map[string]string{"other": "x"}), want: true,
		},
		"a routed pod is": {
			pod: pod("team", nil, map[string]string{AnnotationStatus: StatusInjected}), nsLabels: labelled,
		},
		"a pod the webhook skipped was answered": {
			pod: pod("team", nil, map[string]string{AnnotationStatus: StatusSkipped}), nsLabels: labelled,
		},
		"a pod that opted out never asked": {
			pod: pod("team", map[string]string{LabelInject: ValueDisabled}, nil), nsLabels: labelled,
		},
		"a pod of a plain namespace never asked": {
			pod: pod("team", nil, nil),
		},
		"an excluded namespace is never routed, whatever its label": {
			pod: pod("watchgate-system", nil, nil), nsLabels: labelled,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := NotRouted(tc.pod, tc.nsLabels, excluded); got != tc.want {
				t.Errorf("NotRouted = %v, want %v", got, tc.want)
			}
		})
	}
}
