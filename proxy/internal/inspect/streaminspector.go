package inspect

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/watchgate/watchgate/proxy/internal/answer"
)

// MaxInspectedFrameBytes is the largest watch event, in bytes of its frame,
// that the proxy inspects: 4 MiB. kube-apiserver stores objects of at most
// 1.5 MiB (etcd's default --max-request-bytes) and a JSON event of such an
// object, with base64 data and its envelope, stays well below 4 MiB. A
// larger frame (only a misbehaving aggregated API server sends one) ends
// inspection of that stream: its bytes, and all that follow, pass through
// untouched and nothing more is buffered. apimachinery's JSON framer reads
// a whole value before any size check, which is why the proxy frames the
// stream itself.
const MaxInspectedFrameBytes = 4 << 20

// Framing is how a watch stream separates its events.
type Framing uint8

const (
	// jsonFraming: a sequence of JSON values with optional whitespace
	// between them, as json.Decoder reads them (apimachinery's JSON framer).
	JSONFraming Framing = iota + 1
	// lengthPrefixedFraming: each frame is a 4-byte big-endian length and
	// that many bytes (apimachinery's length-delimited framer, protobuf).
	LengthPrefixedFraming
)

// Sink is told about every event of an inspected stream.
type Sink interface {
	SawEvent()                   // a frame that is not an ERROR event
	SawError(obj runtime.Object) // an ERROR event, with its decoded object
}

// InitialEventsEndSink is a Sink that is also told when the bookmark that
// ends a watch-list's initial events goes by: a BOOKMARK event whose
// object carries the annotation k8s.io/initial-events-end "true"
// (metav1.InitialEventsAnnotationKey). SawInitialEventsEnd comes before
// that frame's SawEvent.
type InitialEventsEndSink interface {
	Sink
	SawInitialEventsEnd()
}

// Stream finds the ERROR events of a watch stream as its bytes go
// by, without decoding the others. It frames the stream itself, cheaply
// (JSON: string and nesting state only; protobuf: the length prefix), and
// decodes with apimachinery's serializer only frames that can be an ERROR
// event: those whose bytes hold the text ERROR (JSON also when they hold a
// \u escape of one of its letters). Whitespace and key order do not matter:
// a candidate is fully decoded.
//
// Frames that lie within one chunk are inspected in place; only a frame
// cut by a chunk boundary is copied, into a pooled buffer released as soon
// as the frame ends. A frame over MaxInspectedFrameBytes, or bytes that
// cannot be a watch stream, end inspection for good (off). It differs from
// apimachinery's decoder only in that a malformed frame that cannot be an
// ERROR event is skipped rather than ending inspection.
//
// Not safe for concurrent use: the reading goroutine owns it.
type Stream struct {
	Framing    Framing
	serializer runtime.Serializer
	sink       Sink
	endSink    InitialEventsEndSink // sink, when it listens for the end of initial events
	off        bool
	sawFrame   bool // a whole frame went by

	frameLen int     // bytes of the current frame seen so far
	buf      *[]byte // the current frame's earlier chunks; nil when it lies in one chunk

	// JSON state between chunks.
	inFrame, inString, escaped, inScalar bool
	depth                                int

	// Protobuf state between chunks: header bytes seen, payload bytes due.
	header  [4]byte
	nHeader int
	due     int
}

// NewStream returns a Stream that frames a watch stream as f, decodes its
// candidate ERROR events with s and tells sink what it finds.
func NewStream(f Framing, s runtime.Serializer, sink Sink) *Stream {
	endSink, _ := sink.(InitialEventsEndSink)
	return &Stream{Framing: f, serializer: s, sink: sink, endSink: endSink}
}

// frameBuffers recycles the buffers of frames cut by a chunk boundary.
var frameBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 32<<10); return &b }}

// write inspects the next chunk of the stream; p is not retained.
func (s *Stream) Write(p []byte) {
	if s.off {
		return
	}
	if s.Framing == JSONFraming {
		s.writeJSON(p)
	} else {
		s.writeLengthPrefixed(p)
	}
}

// stop ends inspection of this stream.
func (s *Stream) stop() {
	s.off = true
	s.Release()
}

// Release returns the frame buffer to the pool.
func (s *Stream) Release() {
	if s.buf != nil {
		*s.buf = (*s.buf)[:0]
		if cap(*s.buf) <= 1<<20 {
			frameBuffers.Put(s.buf)
		}
		s.buf = nil
	}
}

// keep adds part of a frame that continues in the next chunk.
func (s *Stream) keep(part []byte) {
	if len(part) == 0 {
		return
	}
	if s.buf == nil {
		s.buf = frameBuffers.Get().(*[]byte)
	}
	if b := *s.buf; len(b)+len(part) > cap(b) {
		// Double, not append's 1.25×: a frame of n bytes allocates < 2n.
		grown := make([]byte, len(b), min(max(2*cap(b), len(b)+len(part)), MaxInspectedFrameBytes))
		copy(grown, b)
		*s.buf = grown
	}
	*s.buf = append(*s.buf, part...)
}

// atFrameStart reports whether the bytes seen so far end at the end of a
// frame (or between JSON values), so that the next byte starts a frame.
func (s *Stream) atFrameStart() bool {
	if s.Framing == JSONFraming {
		return !s.inFrame
	}
	return s.nHeader == 0
}

// grow counts n more bytes of the current frame and stops inspection when
// the frame is over the limit.
func (s *Stream) grow(n int) bool {
	s.frameLen += n
	if s.frameLen > MaxInspectedFrameBytes {
		s.stop()
		return false
	}
	return true
}

// frameEnded handles a complete frame: last is its part in this chunk.
func (s *Stream) frameEnded(last []byte) {
	frame := last
	if s.buf != nil {
		s.keep(last)
		frame = *s.buf
	}
	s.frameLen = 0
	s.sawFrame = true
	s.event(frame)
	if !s.off {
		s.Release()
	}
}

var (
	errorText            = []byte(string(watch.Error))
	bookmarkText         = []byte(string(watch.Bookmark))
	initialEventsEndText = []byte(metav1.InitialEventsAnnotationKey)
)

// event decodes frame only when it can be an ERROR event, or, for an
// endSink, the bookmark that ends the initial events (a frame that holds
// the annotation's key).
func (s *Stream) event(frame []byte) {
	if s.Framing == LengthPrefixedFraming {
		// The type is the frame's first field: no need to look further
		// (an object whose data holds the text ERROR is not decoded).
		if typ, ok := protobufEventType(frame); ok && !bytes.Equal(typ, errorText) {
			// The API server builds a bookmark's object, metadata only:
			// the annotation's key in a BOOKMARK frame is the annotation.
			if s.endSink != nil && bytes.Equal(typ, bookmarkText) && bytes.Contains(frame, initialEventsEndText) {
				s.endSink.SawInitialEventsEnd()
			}
			s.sink.SawEvent()
			return
		}
	}
	errorCandidate := bytes.Contains(frame, errorText) || s.Framing == JSONFraming && escapesErrorLetter(frame)
	endCandidate := s.endSink != nil && s.Framing == JSONFraming && bytes.Contains(frame, initialEventsEndText)
	if !errorCandidate && !endCandidate {
		s.sink.SawEvent()
		return
	}
	var ev metav1.WatchEvent
	if _, _, err := s.serializer.Decode(frame, nil, &ev); err != nil {
		if !errorCandidate {
			s.sink.SawEvent() // skipped, as any frame that cannot be an ERROR event
			return
		}
		s.stop() // as apimachinery's decoder: an unreadable event ends inspection
		return
	}
	if ev.Type != string(watch.Error) {
		if endCandidate && ev.Type == string(watch.Bookmark) && endsInitialEvents(ev.Object.Raw) {
			s.endSink.SawInitialEventsEnd()
		}
		s.sink.SawEvent()
		return
	}
	obj, err := runtime.Decode(answer.MetaCodecs.UniversalDeserializer(), ev.Object.Raw)
	if err != nil {
		obj = nil
	}
	s.sink.SawError(obj)
}

// endsInitialEvents reports whether a JSON bookmark's object carries the
// annotation that ends a watch-list's initial events.
func endsInitialEvents(object []byte) bool {
	var obj struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	return json.Unmarshal(object, &obj) == nil && obj.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true"
}

// protobufEventType walks the top level of a raw protobuf WatchEvent
// (metav1.WatchEvent: field 1 the type, a string; field 2 the object) and
// returns the type as the generated Unmarshal would set it (the last field
// 1 wins; nil when there is none), or false where that Unmarshal fails on
// the top level: a malformed key or length, field number 0, field 1 or 2
// not length-delimited, or a group (left to the full decode). Fields are
// skipped by their length, so the cost does not grow with the object.
func protobufEventType(frame []byte) (typ []byte, ok bool) {
	for len(frame) > 0 {
		key, n := binary.Uvarint(frame)
		// The field number as the generated code reads it: an int32.
		field, wire := int32(key>>3), key&7 //nolint:gosec // truncated as Unmarshal truncates it
		if n <= 0 || field <= 0 {
			return nil, false
		}
		frame = frame[n:]
		if (field == 1 || field == 2) && wire != 2 {
			return nil, false
		}
		switch wire {
		case 0:
			if _, n = binary.Uvarint(frame); n <= 0 {
				return nil, false
			}
			frame = frame[n:]
		case 1, 5:
			size := 8
			if wire == 5 {
				size = 4
			}
			if len(frame) < size {
				return nil, false
			}
			frame = frame[size:]
		case 2:
			l, n := binary.Uvarint(frame)
			if n <= 0 || l > uint64(len(frame)-n) {
				return nil, false
			}
			if field == 1 {
				typ = frame[n : n+int(l)]
			}
			frame = frame[n+int(l):]
		default:
			return nil, false
		}
	}
	return typ, true
}

// escapesErrorLetter reports whether frame holds a JSON \u escape of E, R
// or O, by which a type "ERROR" could be spelt without the text ERROR.
func escapesErrorLetter(frame []byte) bool {
	for {
		i := bytes.Index(frame, []byte(`\u`))
		if i < 0 || i+6 > len(frame) {
			return i >= 0 // a cut escape: be safe
		}
		if frame[i+2] == '0' && frame[i+3] == '0' && frame[i+4] == '4' {
			switch frame[i+5] {
			case '5', 'f', 'F':
				return true
			}
		}
		if frame[i+2] == '0' && frame[i+3] == '0' && frame[i+4] == '5' && frame[i+5] == '2' {
			return true
		}
		frame = frame[i+2:]
	}
}

// writeJSON frames JSON values as json.Decoder does: whitespace between
// values; objects and arrays end at their matching bracket, strings at their
// unescaped quote, other tokens (numbers, true, null…) at whitespace or a
// delimiter. Brackets are not checked for matching: a candidate frame is
// decoded, anything else cannot be an ERROR event. The state lives in
// locals in the loop and goes back to s at chunk ends and frame ends.
func (s *Stream) writeJSON(p []byte) {
	start := 0 // where the current frame's bytes in p begin
	inFrame, inString, escaped, inScalar, depth := s.inFrame, s.inString, s.escaped, s.inScalar, s.depth
	i := 0
	for i < len(p) {
		if inString {
			var closed bool
			i, closed, escaped = stringEnd(p, i, escaped)
			if !closed {
				continue // the string goes on in the next chunk
			}
			inString = false
			if depth == 0 {
				goto frameEnd
			}
			continue
		}
		if depth > 0 {
			for ; i < len(p); i++ {
				c := p[i]
				if !jsonStructural[c] {
					continue
				}
				if c == '"' {
					inString = true
					break
				}
				if c == '{' || c == '[' {
					depth++
					continue
				}
				if depth--; depth == 0 {
					break
				}
			}
			if i == len(p) {
				continue
			}
			i++
			if inString {
				continue
			}
			goto frameEnd // the closing bracket
		}
		if inScalar {
			for ; i < len(p); i++ {
				switch p[i] {
				case ' ', '\t', '\r', '\n', '{', '}', '[', ']', '"', ',', ':':
				default:
					continue
				}
				break
			}
			if i == len(p) {
				continue
			}
			inScalar = false
			goto frameEnd // p[i] starts the next value (or is whitespace)
		}
		// Between values.
		for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n') {
			i++
		}
		if i == len(p) {
			continue
		}
		inFrame, start = true, i
		switch p[i] {
		case '{', '[':
			depth = 1
		case '"':
			inString = true
		case '}', ']', ',', ':':
			s.stop() // not a JSON value: not a watch stream
			return
		default:
			inScalar = true
		}
		i++
		continue

	frameEnd:
		inFrame = false
		s.inFrame, s.inString, s.escaped, s.inScalar, s.depth = false, false, false, false, 0
		if !s.endJSONFrame(p, start, i) {
			return
		}
	}
	s.inFrame, s.inString, s.escaped, s.inScalar, s.depth = inFrame, inString, escaped, inScalar, depth
	if inFrame {
		if s.grow(len(p) - start) {
			s.keep(p[start:])
		}
	}
}

// stringEnd scans a JSON string from p[i], the byte after its opening
// quote or a later one (escaped: p[i] follows a backslash), and returns
// the index just past its closing quote and true, or len(p), false and
// whether p's last byte is an unpaired backslash. Its first 16 bytes go
// byte by byte (most strings, keys above all, end there); the rest of a
// long one by its next quote, unless a backslash comes first.
func stringEnd(p []byte, i int, escaped bool) (int, bool, bool) {
	for i < len(p) {
		if escaped {
			escaped = false
			i++
			continue
		}
		for end := min(len(p), i+16); i < end; i++ {
			if c := p[i]; c == '"' {
				return i + 1, true, false
			} else if c == '\\' {
				break
			}
		}
		if i == len(p) {
			break
		}
		if p[i] == '\\' {
			escaped = true
			i++
			continue
		}
		j := bytes.IndexByte(p[i:], '"')
		span := p[i:]
		if j >= 0 {
			span = span[:j]
		}
		if k := bytes.IndexByte(span, '\\'); k >= 0 {
			escaped = true
			i += k + 1
			continue
		}
		if j < 0 {
			return len(p), false, false
		}
		return i + j + 1, true, false
	}
	return len(p), false, escaped
}

// jsonStructural marks the bytes that matter inside an object or array,
// outside strings.
var jsonStructural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// endJSONFrame ends the frame p[start:end]; it returns false when
// inspection stopped.
func (s *Stream) endJSONFrame(p []byte, start, end int) bool {
	s.inFrame = false
	if !s.grow(end - start) {
		return false
	}
	s.frameEnded(p[start:end])
	return !s.off
}

// writeLengthPrefixed frames a length-delimited stream.
func (s *Stream) writeLengthPrefixed(p []byte) {
	for len(p) > 0 && !s.off {
		if s.nHeader < 4 {
			n := copy(s.header[s.nHeader:], p)
			s.nHeader += n
			p = p[n:]
			if s.nHeader < 4 {
				return
			}
			size := binary.BigEndian.Uint32(s.header[:])
			if size > MaxInspectedFrameBytes {
				s.stop()
				return
			}
			s.due = int(size)
		}
		n := min(s.due, len(p))
		s.due -= n
		if s.due > 0 {
			s.keep(p[:n])
			return
		}
		s.nHeader = 0
		s.frameEnded(p[:n])
		p = p[n:]
	}
}

// BufferedBytes is how many bytes of an unfinished frame s holds.
func (s *Stream) BufferedBytes() int {
	if s.buf == nil {
		return 0
	}
	return len(*s.buf)
}
