package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/ratelimit"
)

func decided(d ratelimit.Decision) *enginetest.Engine {
	return &enginetest.Engine{DecideFunc: func(*ratelimit.Request) ratelimit.Decision { return d }}
}

func TestAdmissionAnswers(t *testing.T) {
	const watchURL = "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=42"
	for name, tc := range map[string]struct {
		decision      ratelimit.Decision
		url           string
		wantForwarded bool
		wantCode      int
		wantHeader    string
		wantMinDelay  time.Duration
	}{
		"an allowed watch is forwarded and names its budget": {
			decision: ratelimit.Decision{Allowed: true, Budget: "b"}, url: watchURL,
			wantForwarded: true, wantCode: 200, wantHeader: "allow; budget=b",
		},
		"a request no budget governs is forwarded without a header": {
			decision: ratelimit.Decision{Allowed: true}, url: watchURL,
			wantForwarded: true, wantCode: 200,
		},
		"a rate-limited watch gets 429 after a bounded delay": {
			decision: ratelimit.Decision{Reason: ratelimit.ReasonRateLimited, RetryAfter: 3 * time.Second, Budget: "b", Enforcement: ratelimit.Enforce},
			url:      watchURL, wantCode: 429, wantHeader: "reject; reason=RateLimited; budget=b; retry-after=3", wantMinDelay: 50 * time.Millisecond,
		},
		"a rate-limited list gets 429 too": {
			decision: ratelimit.Decision{Reason: ratelimit.ReasonRateLimited, RetryAfter: 500 * time.Millisecond, Budget: "b"},
			url:      "/api/v1/configmaps", wantCode: 429, wantHeader: "reject; reason=RateLimited; budget=b; retry-after=1", wantMinDelay: 50 * time.Millisecond,
		},
		"a dry-run rejection is forwarded and says what would have happened": {
			decision: ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonTooManyWatches, RetryAfter: time.Second, Budget: "b", Enforcement: ratelimit.DryRun},
			url:      watchURL, wantForwarded: true, wantCode: 200, wantHeader: "dryrun-reject; reason=TooManyWatches; budget=b",
		},
		"a stale watch gets 200 with the ERROR event": {
			decision: ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "b"},
			url:      watchURL, wantCode: 200, wantHeader: "reject; reason=StaleResourceVersion; budget=b",
		},
	} {
		t.Run(name, func(t *testing.T) {
			forwarded := false
			engine := decided(tc.decision)
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				forwarded = true
			}))
			start := time.Now()
			resp, body := get(t, px, "alice", tc.url)
			if forwarded != tc.wantForwarded || resp.StatusCode != tc.wantCode || resp.Header.Get(answer.DecisionHeader) != tc.wantHeader {
				t.Fatalf("forwarded %v, HTTP %d, %s %q; want %v, %d, %q (body %s)", forwarded, resp.StatusCode, answer.DecisionHeader,
					resp.Header.Get(answer.DecisionHeader), tc.wantForwarded, tc.wantCode, tc.wantHeader, body)
			}
			if elapsed := time.Since(start); elapsed < tc.wantMinDelay {
				t.Errorf("answered after %v, want at least %v", elapsed, tc.wantMinDelay)
			}
			if elapsed := time.Since(start); elapsed > 2*time.Second {
				t.Errorf("answered after %v: the delay is not bounded", elapsed)
			}
			if tc.wantCode == 429 {
				var s metav1.Status
				wantSecs := tc.wantHeader[strings.LastIndex(tc.wantHeader, "=")+1:]
				if err := json.Unmarshal(body, &s); err != nil || s.Reason != metav1.StatusReasonTooManyRequests || s.Details == nil ||
					fmt.Sprint(s.Details.RetryAfterSeconds) != wantSecs || resp.Header.Get("Retry-After") != wantSecs {
					t.Errorf("429: Retry-After %q, body %s; want %s seconds in both", resp.Header.Get("Retry-After"), body, wantSecs)
				}
			}
			reqs, _, _ := engine.Snapshot()
			if len(reqs) != 1 || reqs[0].User != "alice" || reqs[0].Resource != "configmaps" {
				t.Errorf("engine asked %+v, want one request of alice for configmaps", reqs)
			}
		})
	}
}

func TestRequestsOutsideBudgetsAreNotDecided(t *testing.T) {
	engine := &enginetest.Engine{}
	px := newTestProxy(t, engine, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, path := range []string{"/api/v1/namespaces/ns/pods/p", "/version", "/api/v1/namespaces/ns/pods/p/log"} {
		if resp, _ := get(t, px, "alice", path); resp.StatusCode != 200 || resp.Header.Get(answer.DecisionHeader) != "" {
			t.Errorf("%s: HTTP %d, header %q", path, resp.StatusCode, resp.Header.Get(answer.DecisionHeader))
		}
	}
	if reqs, _, _ := engine.Snapshot(); len(reqs) != 0 {
		t.Errorf("engine asked about %+v", reqs)
	}
}

// The stale answer reads, with client-go's own decoders, exactly like the
// API server's, in JSON and protobuf.
func TestTooOldAnswerInTheClientsFraming(t *testing.T) {
	for accept, wantType := range map[string]string{
		"application/json": "application/json",
		"":                 "application/json",
		"application/vnd.kubernetes.protobuf, application/json": "application/vnd.kubernetes.protobuf;stream=watch",
	} {
		t.Run(wantType+" for "+accept, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/api/v1/pods?watch=true&resourceVersion=42", nil)
			if accept != "" {
				req.Header.Set("Accept", accept)
			}
			rec := httptest.NewRecorder()
			answer.WriteTooOld(rec, req, "42")
			if rec.Code != 200 || rec.Header().Get("Content-Type") != wantType {
				t.Fatalf("HTTP %d %q, want 200 %q", rec.Code, rec.Header().Get("Content-Type"), wantType)
			}
			info, ok := streamtest.ReferenceStreamInfo(rec.Header().Get("Content-Type"))
			if !ok {
				t.Fatal("no decoder for the answer's content type")
			}
			dec := restclientwatch.NewDecoder(streaming.NewDecoder(info.Framer.NewFrameReader(readCloser{bytes.NewReader(rec.Body.Bytes())}), info.Serializer),
				answer.MetaCodecs.UniversalDeserializer())
			typ, obj, err := dec.Decode()
			if err != nil {
				t.Fatal(err)
			}
			s, ok := obj.(*metav1.Status)
			if typ != watch.Error || !ok || s.Code != 410 || s.Reason != metav1.StatusReasonExpired || !strings.HasPrefix(s.Message, "too old resource version: 42 (") {
				t.Fatalf("event %v %#v, want ERROR with Status 410 Expired \"too old resource version: 42 (...)\"", typ, obj)
			}
			if _, _, err := dec.Decode(); err == nil {
				t.Error("more than one event")
			}
		})
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
