package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/inject"
)

func TestTheCAConfigMapIsThePublishers(t *testing.T) {
	if caConfigMap != inject.ConfigMapName || caKey != inject.ConfigMapKey {
		t.Errorf("the plugin reads %s[%s], the publisher writes %s[%s]", caConfigMap, caKey, inject.ConfigMapName, inject.ConfigMapKey)
	}
}

func TestTableRanksByTheSortedFigureWithinEachBudget(t *testing.T) {
	reports := []topv1alpha1.TopReport{
		{Replica: "watchgate-0", Budgets: []topv1alpha1.BudgetTop{
			{Name: "b", Identities: []topv1alpha1.IdentityFigures{{User: "x", Rejections: 1, Opens: 9}}},
			{Name: "a", Identities: []topv1alpha1.IdentityFigures{{User: "y", Rejections: 5, Opens: 1}}},
		}},
		{Replica: "watchgate-1", Budgets: []topv1alpha1.BudgetTop{
			{Name: "a", Identities: []topv1alpha1.IdentityFigures{{User: "z", Rejections: 2, Opens: 7}, {User: "w", Rejections: 5, Opens: 2}}},
		}},
	}
	var out bytes.Buffer
	if err := print(&out, &topOptions{sort: "opens"}, reports); err != nil {
		t.Fatal(err)
	}
	want := `BUDGET   REPLICA       IDENTITY   REJECTIONS   OPENS   WATCHES
a        watchgate-1   z          2            7       0
a        watchgate-1   w          5            2       0
a        watchgate-0   y          5            1       0
b        watchgate-0   x          1            9       0
`
	if out.String() != want {
		t.Errorf("table by opens:\n%s\nwant\n%s", out.String(), want)
	}
	// By rejections, a tie goes by replica, then identity.
	var rows []string
	for _, r := range tableRows(reports, topv1alpha1.SortRejections) {
		rows = append(rows, r.budget+"/"+r.replica+"/"+r.f.User)
	}
	if got := strings.Join(rows, " "); got != "a/watchgate-0/y a/watchgate-1/w a/watchgate-1/z b/watchgate-0/x" {
		t.Errorf("rows by rejections: %s", got)
	}
}

func TestFlagsAreCheckedBeforeTheClusterIsAsked(t *testing.T) {
	for name, args := range map[string][]string{
		"an unknown sort":         {"--sort", "names"},
		"a limit beyond 100":      {"--limit", "101"},
		"an output but json":      {"-o", "yaml"},
		"a replica URL not https": {"--replica-url", "http://127.0.0.1:8443"},
		"an argument":             {"pods"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), append([]string{"top", "--kubeconfig", "/nonexistent"}, args...), &stdout, &stderr)
			if err == nil || strings.Contains(err.Error(), "kubeconfig") || stdout.Len() > 0 {
				t.Errorf("top %v: err %v, stdout %q; want a flag error before the kubeconfig is read", args, err, stdout.String())
			}
		})
	}
}

func TestContainerPortFollowsTheServicesTargetPort(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8080}}},
		{Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}}},
	}}}
	for target, want := range map[intstr.IntOrString]int{
		intstr.FromString("https"): 8443,
		intstr.FromInt32(9443):     9443,
		intstr.FromString("grpc"):  0,
	} {
		if got := containerPort(pod, target); got != want {
			t.Errorf("containerPort(%s) = %d, want %d", target.String(), got, want)
		}
	}
}
