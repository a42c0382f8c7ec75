package answer

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// The proxy speaks only the meta types (Status, WatchEvent), in JSON and
// protobuf, the way kube-apiserver does.
var (
	metaScheme = newMetaScheme()
	MetaCodecs = serializer.NewCodecFactory(metaScheme)
	// statusVersion is the group version Status is written in ("v1").
	StatusVersion = schema.GroupVersion{Version: "v1"}
)

func newMetaScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, StatusVersion)
	return s
}

// WriteStatus answers with err's Status in the media type the client accepts
// (JSON when it accepts nothing the proxy speaks), with Retry-After when the
// Status carries retryAfterSeconds, as kube-apiserver does.
func WriteStatus(w http.ResponseWriter, r *http.Request, err *apierrors.StatusError) {
	status := err.Status()
	if d := status.Details; d != nil && d.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(d.RetryAfterSeconds)))
	}
	info, ok := runtime.SerializerInfoForMediaType(MetaCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if _, negotiated, nerr := negotiation.NegotiateOutputMediaType(r, MetaCodecs, negotiation.DefaultEndpointRestrictions); nerr == nil {
		info, ok = negotiated, true
	}
	var body bytes.Buffer
	if ok {
		if eerr := MetaCodecs.EncoderForVersion(info.Serializer, StatusVersion).Encode(&status, &body); eerr != nil {
			ok = false
		}
	}
	if !ok { // cannot happen with the meta scheme; answer without a body
		w.WriteHeader(int(status.Code))
		return
	}
	w.Header().Set("Content-Type", info.MediaType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(status.Code))
	_, _ = w.Write(body.Bytes())
}

// shuttingDownMessage answers requests that come while the proxy closes.
const ShuttingDownMessage = "watchgate is shutting down, please try again"

// ServiceUnavailable is the 503 Status the proxy answers when it cannot
// serve a request now (shutting down, near its memory limit, API server or
// reviews unreachable), with details.retryAfterSeconds, so that
// WriteStatus adds Retry-After and client-go retries after that long.
func ServiceUnavailable(message string, retryAfterSeconds int) *apierrors.StatusError {
	e := apierrors.NewServiceUnavailable(message)
	e.ErrStatus.Details = &metav1.StatusDetails{RetryAfterSeconds: int32(retryAfterSeconds)}
	return e
}

// DecisionHeader names the decision, its reason and the budget on every
// response to a request a budget governs or the watch guard refused, e.g.
//
//	X-Watchgate-Decision: allow; budget=agents
//	X-Watchgate-Decision: reject; reason=RateLimited; budget=agents; retry-after=2
//	X-Watchgate-Decision: dryrun-reject; reason=TooManyWatches; budget=agents
//	X-Watchgate-Decision: reject; reason=FairShare; retry-after=5
const DecisionHeader = "X-Watchgate-Decision"

// FormatDecision is DecisionHeader's value: the decision, then the reason,
// the budget and the retry-after in seconds, each when set.
func FormatDecision(decision, reason, budget string, retryAfterSeconds int) string {
	var b strings.Builder
	b.Grow(len(decision) + len(reason) + len(budget) + len("; reason=; budget=; retry-after=") + 10)
	b.WriteString(decision)
	if reason != "" {
		b.WriteString("; reason=")
		b.WriteString(reason)
	}
	if budget != "" {
		b.WriteString("; budget=")
		b.WriteString(budget)
	}
	if retryAfterSeconds > 0 {
		b.WriteString("; retry-after=")
		b.WriteString(strconv.Itoa(retryAfterSeconds))
	}
	return b.String()
}

// tooOldMessage is the message of a locally answered stale watch. It starts
// like kube-apiserver's watch cache message, because browser front-ends only
// recognise the text "too old" to trigger their resync.
func tooOldMessage(resourceVersion string) string {
	return fmt.Sprintf("too old resource version: %s (answered by watchgate: the API server declared it too old)", resourceVersion)
}

// WriteTooOld answers a watch exactly as kube-apiserver answers one from an
// expired resourceVersion: HTTP 200, a watch stream in the framing the client
// negotiated (JSON or protobuf), one ERROR event whose object is a Status
// 410 Expired, then the end of the stream.
func WriteTooOld(w http.ResponseWriter, r *http.Request, resourceVersion string) {
	info, err := negotiation.NegotiateOutputMediaTypeStream(r, MetaCodecs, negotiation.DefaultEndpointRestrictions)
	if err != nil {
		info, _ = runtime.SerializerInfoForMediaType(MetaCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	}
	status := apierrors.NewResourceExpired(tooOldMessage(resourceVersion)).Status()
	var body bytes.Buffer
	enc := restclientwatch.NewEncoder(
		streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&body), info.StreamSerializer.Serializer),
		MetaCodecs.EncoderForVersion(info.Serializer, StatusVersion))
	if err := enc.Encode(&watch.Event{Type: watch.Error, Object: &status}); err != nil {
		WriteStatus(w, r, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", watchContentType(info.MediaType))
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body.Bytes())
}

// watchContentType is the Content-Type kube-apiserver gives a watch stream
// of mediaType (handlers/watch.go): JSON as is, others with ";stream=watch".
func watchContentType(mediaType string) string {
	switch mediaType {
	case runtime.ContentTypeJSON:
		return mediaType
	case runtime.ContentTypeCBOR:
		return runtime.ContentTypeCBORSequence
	default:
		return mediaType + ";stream=watch"
	}
}

// RetryAfterSeconds is d in whole seconds for Retry-After, rounded up, at
// least 1.
func RetryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
