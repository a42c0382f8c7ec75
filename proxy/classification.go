package proxy

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
func classify(f *request.RequestInfoFactory, r *http.Request, logs *sampledLogger) (*classification, error) {
	q := r.URL.Query()
	info, err := requestInfo(f, r, q, logs)
	if err != nil {
		return nil, err
	}
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

// requestInfo is f.NewRequestInfo(r), without the line the factory logs
// through klog, outside the proxy's log sampling and with the whole query
// in it, when the query of a collection GET does not parse (a malformed
// selector, a watch=maybe). The proxy parses such a query first, exactly
// as the factory does; when it does not parse, it logs a bounded, sampled
// line and hands the factory the only part of the query it uses then (the
// watch parameter, read as the factory reads it), and restores the
// selectors the factory copies as sent. The result is the factory's.
func requestInfo(f *request.RequestInfoFactory, r *http.Request, q url.Values, logs *sampledLogger) (*request.RequestInfo, error) {
	if (r.Method != http.MethodGet && r.Method != http.MethodHead) || r.URL.RawQuery == "" {
		return f.NewRequestInfo(r)
	}
	var opts metainternalversion.ListOptions
	perr := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts)
	if perr == nil {
		return f.NewRequestInfo(r)
	}
	reduced := *r
	u := *r.URL
	u.RawQuery = ""
	reduced.URL = &u
	// The factory parses the query only for a GET of a collection, which
	// it reads as a list when the query says nothing.
	if info, err := f.NewRequestInfo(&reduced); err != nil || info.Verb != "list" {
		return f.NewRequestInfo(r)
	}
	logs.Info("Cannot parse the query of a request", "path", boundedForLog(r.URL.Path),
		"query", boundedForLog(r.URL.RawQuery), "err", boundedForLog(perr.Error()))
	if vals := q["watch"]; len(vals) > 0 {
		switch strings.ToLower(vals[0]) {
		case "false", "0":
		default:
			u.RawQuery = "watch=true"
		}
	}
	info, err := f.NewRequestInfo(&reduced)
	if err != nil {
		return nil, err
	}
	// The factory copies the selectors as sent for a list or watch whose
	// verb came from the query, as here.
	switch info.Verb {
	case "list", "watch":
		if vals := q["fieldSelector"]; len(vals) > 0 {
			info.FieldSelector = vals[0]
		}
		if vals := q["labelSelector"]; len(vals) > 0 {
			info.LabelSelector = vals[0]
		}
	}
	return info, nil
}

// withClassification classifies every request for the filters after it;
// a URL it cannot make sense of gets 400 without forwarding.
func withClassification(f *request.RequestInfoFactory, logs *sampledLogger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := classify(f, r, logs)
		if err != nil {
			writeStatus(w, r, apierrors.NewBadRequest("malformed request path"))
			return
		}
		next.ServeHTTP(w, r.WithContext(withClassificationValue(r.Context(), c)))
	})
}
