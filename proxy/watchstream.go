package proxy

import (
	"context"
	"errors"
	"io"
	"mime"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/ratelimit"
)

// watchState follows one admitted watch from its decision to its end and
// reports that end to the engine exactly once (end), however the watch
// ended: the API server closed it, answered an error, died, the client left,
// or the proxy closed it on shutdown.
//
// The request's goroutine owns it; stop may be called from any goroutine.
type watchState struct {
	engine   Engine
	clock    clock.PassiveClock
	log      *sampledLogger
	c        *classification
	decision ratelimit.Decision
	started  time.Time
	// clientCtx is the client's request context; cancel cancels the
	// upstream request's context, derived from it.
	clientCtx context.Context
	cancel    context.CancelFunc

	stopped      atomic.Bool  // the proxy closed the watch (shutdown)
	upstreamCode atomic.Int32 // the API server's status code; 0 before it answered
	transportErr atomic.Bool  // no answer from the API server
	errorEvent   atomic.Bool  // an ERROR event went by

	body    *watchBody // set when a 200 stream starts
	endOnce sync.Once
}

// stop ends the watch cleanly from the client's point of view: the stream
// ends as if the API server had closed it (client-go simply watches again),
// and the watch counts as closed, not failed.
func (ws *watchState) stop() {
	ws.stopped.Store(true)
	ws.cancel()
}

// clientGone reports whether the watch ended because of the client or the
// proxy rather than the API server.
func (ws *watchState) clientGone() bool {
	return ws.stopped.Load() || ws.clientCtx.Err() != nil
}

// end waits for the stream reader and reports the watch's lifetime and
// outcome to the engine; only the first call does anything.
func (ws *watchState) end() {
	ws.endOnce.Do(func() {
		outcome := ratelimit.OutcomeClosed
		if b := ws.body; b != nil {
			_ = b.Close()
			<-b.done
			if b.readErr != nil && !ws.clientGone() {
				outcome = ratelimit.OutcomeError
			}
		}
		code := ws.upstreamCode.Load()
		switch {
		case ws.errorEvent.Load(), code != 0 && code != 200:
			outcome = ratelimit.OutcomeError
		case ws.transportErr.Load() && !ws.clientGone():
			outcome = ratelimit.OutcomeError
		}
		now := ws.clock.Now()
		ws.engine.WatchEnded(now, ws.decision.Watch, now.Sub(ws.started), outcome)
		label := "closed"
		if outcome == ratelimit.OutcomeError {
			label = "error"
		}
		watchesEnded.WithLabelValues(label).Inc()
	})
}

// sawError is called for every ERROR event in the stream. A Status with
// code 410 teaches the engine that the request's resourceVersion is stale.
func (ws *watchState) sawError(raw []byte) {
	ws.errorEvent.Store(true)
	obj, err := runtime.Decode(metaCodecs.UniversalDeserializer(), raw)
	if err != nil {
		return
	}
	status, ok := obj.(*metav1.Status)
	if !ok || status.Code != 410 {
		return
	}
	rv := ws.c.ResourceVersion
	if rv == "" || rv == "0" {
		return // never too old; the 410 is about something else
	}
	ws.engine.StaleVersionSeen(ws.clock.Now(), ws.c.Info.APIGroup, ws.c.Info.Resource, rv)
	staleVersionsLearned.Inc()
	ws.log.Info("Learned stale resourceVersion", "group", ws.c.Info.APIGroup, "resource", ws.c.Info.Resource,
		"resourceVersion", rv, "message", status.Message)
}

// streamSerializerFor returns how to read a watch stream of the given
// Content-Type (JSON or protobuf), or false for anything else (the stream
// then passes unread).
func streamSerializerFor(contentType, contentEncoding string) (runtime.StreamSerializerInfo, bool) {
	if contentEncoding != "" && contentEncoding != "identity" {
		return runtime.StreamSerializerInfo{}, false
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return runtime.StreamSerializerInfo{}, false
	}
	info, ok := runtime.SerializerInfoForMediaType(metaCodecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil || info.StreamSerializer.Framer == nil {
		return runtime.StreamSerializerInfo{}, false
	}
	return *info.StreamSerializer, true
}

// watchBody wraps the API server's watch response body. The bytes pass to
// the client unchanged, chunk by chunk, as the reverse proxy reads them;
// each chunk is also handed through a pipe to a goroutine that decodes the
// frames with apimachinery's framer and streaming decoder and reports ERROR
// events. Nothing is held back: the pipe hands over one chunk at a time,
// and a stream the decoder cannot read (garbage, a frame over 16 MiB) is
// simply no longer inspected.
type watchBody struct {
	ws       *watchState
	upstream io.ReadCloser
	pw       *io.PipeWriter // nil when the stream is not inspected
	teeing   bool
	done     chan struct{} // closed when the decoder has finished
	readErr  error         // first read error other than io.EOF
	closing  sync.Once
}

func newWatchBody(ws *watchState, upstream io.ReadCloser, info runtime.StreamSerializerInfo, inspect bool) *watchBody {
	b := &watchBody{ws: ws, upstream: upstream, done: make(chan struct{})}
	if !inspect {
		close(b.done)
		return b
	}
	pr, pw := io.Pipe()
	b.pw, b.teeing = pw, true
	go b.decode(pr, info)
	return b
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.upstream.Read(p)
	if n > 0 && b.teeing {
		if _, werr := b.pw.Write(p[:n]); werr != nil {
			b.teeing = false // the decoder gave up; keep streaming
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if b.ws.stopped.Load() {
			return n, io.EOF // closed by the proxy: end the stream cleanly
		}
		if b.readErr == nil {
			b.readErr = err
		}
	}
	return n, err
}

func (b *watchBody) Close() error {
	var err error
	b.closing.Do(func() {
		err = b.upstream.Close()
		if b.pw != nil {
			_ = b.pw.Close()
		}
	})
	return err
}

func (b *watchBody) decode(pr *io.PipeReader, info runtime.StreamSerializerInfo) {
	defer close(b.done)
	dec := streaming.NewDecoder(info.Framer.NewFrameReader(pr), info.Serializer)
	defer func() { _ = dec.Close() }()
	for {
		var event metav1.WatchEvent
		if _, _, err := dec.Decode(nil, &event); err != nil {
			// Unblock and fail any pending and later write.
			_ = pr.CloseWithError(err)
			return
		}
		if event.Type == string(watch.Error) {
			b.ws.sawError(event.Object.Raw)
		}
	}
}
