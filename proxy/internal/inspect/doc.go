// Package inspect reads watch streams as they pass through the proxy, to
// find the ERROR events that teach the engine a stale resourceVersion and
// make a watch's end a failure. Stream frames JSON lines and
// length-prefixed protobuf itself, in the relay's read, without a
// goroutine or a buffer per idle watch and without holding the stream
// back; it decodes with apimachinery's serializer only frames that can
// be ERROR events, and stops at a frame over MaxInspectedFrameBytes. Gzip
// inflates a gzip-encoded stream (one member per flush) into a Stream:
// every member until the first frame, then only the member that ends the
// stream, within MaxInflatedBytesPerStream and the held bytes SharedBytes
// shares among callers. FramingFor says which streams are read at all:
// a new stream format is added there and in Stream.
//
// A Sink that is also an InitialEventsEndSink is told when the bookmark
// that ends a watch-list's initial events goes by.
//
// It does not copy the stream, end the watch or talk to the engine: it
// reports events to a Sink. The relay (proxy's watchBody) is its one user.
package inspect
