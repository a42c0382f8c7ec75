package authn

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics of authentication and impersonation checks. No label holds a
// user name, a token or a client address: every label is an enum.
var (
	localVerifications = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_local_token_verifications_total",
		Help: "Bearer tokens by local service-account verification result: valid (no TokenReview), forged " +
			"(the issuer's JWT with a bad signature, 401 without TokenReview), revoked (validly signed, but its service account, " +
			"pod or node is gone or has another UID, 401 without TokenReview), reviewed (not verifiable locally, TokenReview).",
	}, []string{"result"})

	keyRefreshes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_service_account_key_refreshes_total",
		Help: "Fetches of the API server's service-account issuer keys (/openid/v1/jwks), by result (ok, error).",
	}, []string{"result"})

	boundObjectLookupErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_bound_object_lookup_errors_total",
		Help: "Metadata GETs of a service account, pod or node named by a service-account token that failed; " +
			"the token is then reviewed with a TokenReview.",
	})

	boundObjectWatchRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_bound_object_watch_restarts_total",
		Help: "Watches of the objects service-account tokens are bound to that failed (an error, 410 Gone) and started again from now, " +
			"by resource (serviceaccounts, pods, nodes); the objects looked up before are looked up again.",
	}, []string{"resource"})

	boundObjectDeletions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_bound_object_deletions_total",
		Help: "Objects looked up for service-account tokens that the proxy's watch saw deleted or re-created under another UID, " +
			"by resource (serviceaccounts, pods, nodes); their tokens are refused from then on.",
	}, []string{"resource"})

	credentialsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_credentials_refused_total",
		Help: "Requests refused with 400 because the proxy and the API server could read their credential headers " +
			"differently, by reason (ambiguous).",
	}, []string{"reason"})
)

func init() {
	metrics.Registry.MustRegister(localVerifications, keyRefreshes, boundObjectLookupErrors, boundObjectWatchRestarts, boundObjectDeletions, credentialsRefused)
}
