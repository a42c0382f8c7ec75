package review

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// FailurePolicy says what the proxy does with a request whose token
// or impersonation it cannot review because the API server's TokenReview
// or SubjectAccessReview failed or took longer than ReviewTimeout.
type FailurePolicy string

const (
	// FailClosed answers 503 ServiceUnavailable with a Status and
	// Retry-After; nothing is forwarded. The default.
	FailClosed FailurePolicy = "Closed"
	// FailOpen forwards the request (the API server still authenticates
	// and authorizes it with the caller's own credentials) and charges it
	// to an identity the caller cannot otherwise spend: a token that could
	// not be reviewed is charged to a user of its own named by a hash of
	// the token, system:watchgate:unreviewed:<hash>, in the group
	// system:watchgate:unreviewed (impersonation headers ignored; see
	// UnreviewedCaller); an impersonation that could not be checked is
	// charged to the caller itself. Throttled reviews (the proxy's own flood protection) are
	// 429 in both policies.
	FailOpen FailurePolicy = "Open"
)

// unreviewedPrefix and unreviewedGroup name whom FailOpen charges for a
// token it could not review. "system:" names are reserved for Kubernetes
// itself.
const (
	unreviewedGroup  = "system:watchgate:unreviewed"
	unreviewedPrefix = unreviewedGroup + ":"
)

// unreviewedSalt keys UnreviewedCaller's hashes, so that they cannot be
// precomputed from a token.
var unreviewedSalt = func() (b [32]byte) {
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails
	}
	return b
}()

// UnreviewedCaller is whom FailOpen charges for a token it could not
// review: a user of the token's own, named by 64 bits of a salted hash of
// it, in unreviewedGroup. A budget governs them all by the group, but each
// token spends its own buckets, so that one caller's flood while reviews
// fail does not refuse every other caller (as one shared identity would).
// The engine bounds the identities it tracks (Options.MaxTrackedKeys), so
// a flood of random tokens costs bounded memory.
func UnreviewedCaller(token string) *user.DefaultInfo {
	h := sha256.New()
	h.Write(unreviewedSalt[:])
	h.Write([]byte(token))
	return &user.DefaultInfo{Name: unreviewedPrefix + hex.EncodeToString(h.Sum(nil)[:8]), Groups: []string{unreviewedGroup}}
}

// IsUnreviewed reports whether u is an UnreviewedCaller.
func IsUnreviewed(u user.Info) bool { return strings.HasPrefix(u.GetName(), unreviewedPrefix) }

// Kind is one kind of review, as FailurePolicy.Failed names
// it to the client, the logs and the metrics.
type Kind struct {
	label       string // the metrics label: token, impersonation, access
	throttled   string // the 429 message
	unavailable string // what the 503 message says is unavailable
	failOpen    string // the log message under FailOpen
	failClosed  string // the log message under FailClosed
}

var (
	// Token is the TokenReview of a caller's bearer token.
	Token = Kind{
		label: "token", throttled: "too many new tokens to review, please try again later", unavailable: "authentication",
		failOpen: "Cannot review token; forwarding as unreviewed (fail open)", failClosed: "Cannot review token",
	}
	// Impersonation is the SubjectAccessReview of a caller's right to
	// impersonate the user and groups it names.
	Impersonation = Kind{
		label: "impersonation", throttled: "too many impersonation checks, please try again later", unavailable: "the impersonation check",
		failOpen: "Cannot check impersonation; charging the caller (fail open)", failClosed: "Cannot check impersonation",
	}
	// Access is the SubjectAccessReview of a caller of the top endpoint,
	// which always fails closed.
	Access = Kind{
		label: "access", throttled: "too many access checks, please try again later", unavailable: "the access check",
		failClosed: "Cannot check access to the top endpoint",
	}
)

// Failed answers a request whose review of kind k ended with err
// (non-nil), the one place where the policy is applied: 429 with
// Retry-After when reviews are throttled (in both policies), nothing when
// the client left, 503 with Retry-After under FailClosed. Under FailOpen
// it answers nothing and returns true: the caller forwards the request,
// charged as FailOpen says. keysAndValues go to the log line.
func (p FailurePolicy) Failed(w http.ResponseWriter, r *http.Request, k Kind, err error, log *sampledlog.Logger, keysAndValues ...any) (forward bool) {
	switch {
	case errors.Is(err, ErrThrottled):
		answer.WriteStatus(w, r, apierrors.NewTooManyRequests(k.throttled, 1))
		return false
	case r.Context().Err() != nil:
		return false // the client left
	case p == FailOpen:
		log.Info(k.failOpen, append(keysAndValues, "err", err.Error())...)
		reviewFailOpen.WithLabelValues(k.label).Inc()
		return true
	default:
		log.Info(k.failClosed, append(keysAndValues, "err", err.Error())...)
		answer.WriteStatus(w, r, answer.ServiceUnavailable(k.unavailable+" is unavailable, please try again later", 1))
		return false
	}
}
