package apiserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// ServiceAccount is a real, non-admin identity of the test API server.
type ServiceAccount struct {
	Namespace, Name string
	// Token is a bearer token issued by the TokenRequest API.
	Token string
}

// Username is the name the API server authenticates the account as.
func (sa ServiceAccount) Username() string {
	return "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
}

// ServiceAccount creates (or reuses) the namespace and service account and
// issues a bearer token for it, valid for an hour. The account has no
// permissions until a test grants some (see Grant).
func (e *Env) ServiceAccount(ctx context.Context, namespace, name string) (ServiceAccount, error) {
	cs := e.Clientset
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return ServiceAccount{}, fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return ServiceAccount{}, fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return ServiceAccount{}, fmt.Errorf("request token for %s/%s: %w", namespace, name, err)
	}
	return ServiceAccount{Namespace: namespace, Name: name, Token: tr.Status.Token}, nil
}

// Groups are the groups the API server authenticates the account in.
func (sa ServiceAccount) Groups() []string {
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"}
}

// Grant binds the service account to a new ClusterRole with the given rules
// and returns once the API server's authorizer allows them. The binding's
// name is derived from the account, so granting twice updates nothing and
// is not an error.
func (e *Env) Grant(ctx context.Context, sa ServiceAccount, rules ...rbacv1.PolicyRule) error {
	name := "watchgate-test:" + sa.Namespace + ":" + sa.Name
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := e.Clientset.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	if _, err := e.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return e.WaitAllowed(ctx, "", sa.Username(), sa.Groups(), rules...)
}

// WaitAllowed returns once the API server's authorizer allows user, in
// groups, every verb rules name on every resource (or non-resource URL) they
// name, in namespace ("" for every namespace). RBAC's authorizer reads roles
// and bindings from an informer cache, so a binding takes effect a moment
// after its create returns; tests wait here instead of racing the cache.
func (e *Env) WaitAllowed(ctx context.Context, namespace, user string, groups []string, rules ...rbacv1.PolicyRule) error {
	var specs []authorizationv1.SubjectAccessReviewSpec
	for _, r := range rules {
		for _, verb := range r.Verbs {
			for _, url := range r.NonResourceURLs {
				specs = append(specs, authorizationv1.SubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: url, Verb: verb}})
			}
			var name string
			if len(r.ResourceNames) > 0 {
				name = r.ResourceNames[0]
			}
			for _, group := range r.APIGroups {
				for _, resource := range r.Resources {
					resource, subresource, _ := strings.Cut(resource, "/")
					specs = append(specs, authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
						Namespace: namespace, Verb: verb, Group: group, Resource: resource, Subresource: subresource, Name: name,
					}})
				}
			}
		}
	}
	for _, spec := range specs {
		spec.User, spec.Groups = user, groups
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			sar, err := e.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return sar.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("wait until %s may %s: %w", user, describe(spec), err)
		}
	}
	return nil
}

func describe(spec authorizationv1.SubjectAccessReviewSpec) string {
	if a := spec.NonResourceAttributes; a != nil {
		return a.Verb + " " + a.Path
	}
	a := spec.ResourceAttributes
	return fmt.Sprintf("%s %s.%s/%s %q in namespace %q", a.Verb, a.Resource, a.Group, a.Subresource, a.Name, a.Namespace)
}

// ConfigFor returns a client config that talks to host (the API server when
// empty, or a proxy in front of it) with the bearer token and nothing else
// of the admin's credentials. caData is the CA of host's serving certificate
// (the API server's when host is empty).
func (e *Env) ConfigFor(token, host string, caData []byte) *rest.Config {
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = token
	if host != "" {
		cfg.Host = host
		cfg.TLSClientConfig = rest.TLSClientConfig{CAData: caData}
	}
	cfg.QPS, cfg.Burst = -1, -1
	return cfg
}

// WriteKubeconfig writes cfg as a kubeconfig file in dir and returns its path.
func WriteKubeconfig(cfg *rest.Config, dir string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o600)
}
