package proxy

import (
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/watchgate/watchgate/ratelimit"
)

// classification is what the proxy knows about a request's target.
type classification struct {
	Info *request.RequestInfo
	// Verb is the budgeted verb: ratelimit.VerbWatch or VerbList; 0 for
	// everything else (which passes untouched).
	Verb ratelimit.Verb
	// From the query.
	LabelSelector, FieldSelector          string
	ResourceVersion, ResourceVersionMatch string
	SendInitialEvents                     bool
	// TimeoutSeconds is the watch timeout the client asked for; 0 when
	// unset or malformed.
	TimeoutSeconds int64
}

// newRequestInfoFactory knows kube-apiserver's URL layout: /api for the
// core group, /apis for the others, ?watch=true and the legacy /watch/
// paths.
func newRequestInfoFactory() *request.RequestInfoFactory {
	return &request.RequestInfoFactory{
		APIPrefixes:          sets.NewString("api", "apis"),
		GrouplessAPIPrefixes: sets.NewString("api"),
	}
}

// classify parses r. Only collection-level watches and lists of a
// resource (not of a subresource) are budgeted; a watch of one object by
// name is budgeted like a watch with fieldSelector metadata.name=<name>,
// which is what it is.
func classify(f *request.RequestInfoFactory, r *http.Request) (*classification, error) {
	info, err := f.NewRequestInfo(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	c := &classification{
		Info:                 info,
		LabelSelector:        q.Get("labelSelector"),
		FieldSelector:        q.Get("fieldSelector"),
		ResourceVersion:      q.Get("resourceVersion"),
		ResourceVersionMatch: q.Get("resourceVersionMatch"),
	}
	c.SendInitialEvents, _ = strconv.ParseBool(q.Get("sendInitialEvents"))
	if t, err := strconv.ParseInt(q.Get("timeoutSeconds"), 10, 64); err == nil && t > 0 {
		c.TimeoutSeconds = t
	}
	if info.IsResourceRequest && info.Subresource == "" {
		switch info.Verb {
		case "watch":
			c.Verb = ratelimit.VerbWatch
		case "list":
			c.Verb = ratelimit.VerbList
		}
	}
	if c.Verb != 0 && info.Name != "" && c.FieldSelector == "" {
		c.FieldSelector = "metadata.name=" + info.Name
	}
	return c, nil
}

// withClassification classifies every request for the filters after it;
// a URL it cannot make sense of gets 400 without forwarding.
func withClassification(f *request.RequestInfoFactory, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := classify(f, r)
		if err != nil {
			writeStatus(w, r, apierrors.NewBadRequest("malformed request path"))
			return
		}
		next.ServeHTTP(w, r.WithContext(withClassificationValue(r.Context(), c)))
	})
}
