package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "watchgate.io", Version: "v1alpha1"}

	// SchemeGroupVersion is GroupVersion under the name generated code
	// (applyconfiguration/utils.go) expects.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers the types of this package with a scheme.
	// (apimachinery's, not controller-runtime's deprecated scheme.Builder,
	// so that importing the API types does not import controller-runtime).
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &WatchBudget{}, &WatchBudgetList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
