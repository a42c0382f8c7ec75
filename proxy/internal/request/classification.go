package request

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/ratelimit"
)

// Classification is what the proxy knows about a request's target. It
// keeps the three names of the RequestInfo it was made from that budgets
// and stale versions are about, not the RequestInfo itself: an open watch
// keeps its classification, and the rest (the path split into parts, the
// selectors again) would stay with it for nothing.
type Classification struct {
	APIGroup, Resource, Namespace string
	// Verb is the budgeted verb: ratelimit.VerbWatch or VerbList; 0 for
	// everything else (which passes untouched).
	Verb ratelimit.Verb
	// From the query.
	LabelSelector, FieldSelector          string
	ResourceVersion, ResourceVersionMatch string
	// SendInitialEvents is the query's sendInitialEvents as kube-apiserver
	// reads it (sendInitialEventsParam); nil when absent.
	SendInitialEvents *bool
	// TimeoutSeconds is the watch timeout the client asked for; 0 when
	// unset or malformed.
	TimeoutSeconds int64
	// Continue is true for a list with a continue token: a further page
	// of a list begun earlier.
	Continue bool
	// QueryRefused is true when the API server refuses the query of this
	// list or watch with 400 before looking at the version (a selector,
	// timeoutSeconds or limit that does not parse).
	QueryRefused bool
}

// sendInitialEventsParam reads sendInitialEvents as kube-apiserver's
// query decoding does (runtime.Convert_Slice_string_To_Pointer_bool): nil
// when absent, false for "0" and "false" in any case, true for anything
// else, "" included.
func sendInitialEventsParam(q url.Values) *bool {
	vals := q["sendInitialEvents"]
	if len(vals) == 0 {
		return nil
	}
	if vals[0] == "0" || strings.EqualFold(vals[0], "false") {
		return &falseValue
	}
	return &trueValue
}

// trueValue and falseValue are what a *bool of a classification points
// to; never written.
var trueValue, falseValue = true, false

// FromVersion reports whether c is a watch that kube-apiserver answers
// 410 Expired when its resourceVersion is too old, whatever its
// configuration (see ratelimit.Request): an explicit version without
// sendInitialEvents and resourceVersionMatch, in a query that decodes.
func (c *Classification) FromVersion() bool {
	return c.Verb == ratelimit.VerbWatch && c.SendInitialEvents == nil && c.ResourceVersionMatch == "" &&
		c.ResourceVersion != "" && c.ResourceVersion != "0" && !c.QueryRefused
}

// AsksInitialState reports whether c asks for the collection's state
// before its changes (ratelimit.Request's initialState): a watch with
// sendInitialEvents=true, or without sendInitialEvents from no
// resourceVersion or "0".
func (c *Classification) AsksInitialState() bool {
	if c.SendInitialEvents != nil {
		return *c.SendInitialEvents
	}
	return c.ResourceVersion == "" || c.ResourceVersion == "0"
}

// NewRequestInfoFactory knows kube-apiserver's URL layout: /api for the
// core group, /apis for the others, ?watch=true and the legacy /watch/
// paths.
func NewRequestInfoFactory() *request.RequestInfoFactory {
	return &request.RequestInfoFactory{
		APIPrefixes:          sets.NewString("api", "apis"),
		GrouplessAPIPrefixes: sets.NewString("api"),
	}
}

// classify parses r and returns its classification and the RequestInfo
// it was made from. Only collection-level watches and lists of a
// resource (not of a subresource) are budgeted; a watch of one object by
// name is budgeted like a watch with fieldSelector metadata.name=<name>,
// which is what it is.
func classify(f *request.RequestInfoFactory, r *http.Request, logs *sampledlog.Logger) (*Classification, *request.RequestInfo, error) {
	q := r.URL.Query()
	info, queryOK, err := requestInfo(f, r, q, logs)
	if err != nil {
		return nil, nil, err
	}
	c := &Classification{
		APIGroup:             info.APIGroup,
		Resource:             info.Resource,
		Namespace:            info.Namespace,
		LabelSelector:        q.Get("labelSelector"),
		FieldSelector:        q.Get("fieldSelector"),
		ResourceVersion:      q.Get("resourceVersion"),
		ResourceVersionMatch: q.Get("resourceVersionMatch"),
	}
	c.SendInitialEvents = sendInitialEventsParam(q)
	c.QueryRefused = !queryOK
	c.Continue = q.Get("continue") != ""
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
	return c, info, nil
}

// requestInfo is f.NewRequestInfo(r), computed with one parse of the
// query (q) instead of the factory's several, and without the line the
// factory logs through klog, outside the proxy's log sampling and with the
// whole query in it, when the query of a collection GET does not parse (a
// malformed selector, a watch=maybe).
//
// The factory reads the query in two places only: for a GET or HEAD of a
// collection it decodes the query into ListOptions (to tell a watch from a
// list and to read a name from fieldSelector=metadata.name=...), and for a
// list, watch or deletecollection it copies the selectors as sent. So the
// proxy asks the factory about the path alone, then does those two things
// itself exactly as the factory does (listQuery): decoding fails exactly
// where the factory's decoding fails (an integer that does not parse in
// timeoutSeconds or limit, a selector that does not parse), and on failure
// the factory's fallback applies (the watch parameter read loosely, no
// name). FuzzClassification checks the result against the factory's.
//
// queryOK is false when the query of a collection GET does not decode.
func requestInfo(f *request.RequestInfoFactory, r *http.Request, q url.Values, logs *sampledlog.Logger) (info *request.RequestInfo, queryOK bool, err error) {
	if r.URL.RawQuery == "" {
		info, err = f.NewRequestInfo(r)
		return info, true, err
	}
	info, err = f.NewRequestInfo(&http.Request{Method: r.Method, URL: &url.URL{Path: r.URL.Path}})
	if err != nil {
		// The same error; the factory's message names the whole URL.
		info, err = f.NewRequestInfo(r)
		return info, true, err
	}
	queryOK = true
	switch info.Verb {
	case "list":
		// A GET of a collection: the query says list or watch.
		watch, name, perr := listQuery(q)
		if perr != nil {
			queryOK = false
			logs.Info("Cannot parse the query of a request", "path", sampledlog.Bounded(r.URL.Path),
				"query", sampledlog.Bounded(r.URL.RawQuery), "err", sampledlog.Bounded(perr.Error()))
			watch, name = false, ""
			if vals := q["watch"]; len(vals) > 0 {
				switch strings.ToLower(vals[0]) {
				case "false", "0":
				default:
					watch = true
				}
			}
		}
		if watch {
			info.Verb = "watch"
		}
		if name != "" {
			info.Name = name
		}
		copySelectors(info, q)
	case "deletecollection":
		copySelectors(info, q)
	}
	return info, queryOK, nil
}

// listQuery reads q as metainternalversionscheme.ParameterCodec decodes it
// into ListOptions, but only what the factory uses: watch (only absent,
// "0" and "false" in any case are false), the name of a fieldSelector that
// requires metadata.name to equal a valid path segment, and whether
// decoding fails at all.
func listQuery(q url.Values) (watch bool, name string, err error) {
	if len(q) == 0 {
		return false, "", nil
	}
	for _, key := range [...]string{"timeoutSeconds", "limit"} {
		if vals := q[key]; len(vals) > 0 {
			if _, err := strconv.ParseInt(vals[0], 10, 64); err != nil {
				return false, "", err
			}
		}
	}
	if vals := q["labelSelector"]; len(vals) > 0 && vals[0] != "" {
		if _, err := labels.Parse(vals[0]); err != nil {
			return false, "", err
		}
	}
	if vals := q["fieldSelector"]; len(vals) > 0 && vals[0] != "" {
		sel, err := fields.ParseSelector(vals[0])
		if err != nil {
			return false, "", err
		}
		if n, ok := sel.RequiresExactMatch("metadata.name"); ok && len(content.IsPathSegmentName(n)) == 0 {
			name = n
		}
	}
	if vals := q["watch"]; len(vals) > 0 {
		watch = vals[0] != "0" && !strings.EqualFold(vals[0], "false")
	}
	return watch, name, nil
}

// copySelectors sets info's selectors to the query's, as sent, as the
// factory does for a list, watch or deletecollection whose verb did not
// come from the path.
func copySelectors(info *request.RequestInfo, q url.Values) {
	if vals := q["fieldSelector"]; len(vals) > 0 {
		info.FieldSelector = vals[0]
	}
	if vals := q["labelSelector"]; len(vals) > 0 {
		info.LabelSelector = vals[0]
	}
}

// WithClassification classifies every request for the filters after it;
// a URL it cannot make sense of gets 400 without forwarding.
func WithClassification(f *request.RequestInfoFactory, logs *sampledlog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := classify(f, r, logs)
		if err != nil {
			answer.WriteStatus(w, r, apierrors.NewBadRequest("malformed request path"))
			return
		}
		st, r := StateOf(r)
		st.classification = c
		next.ServeHTTP(w, r)
	})
}
