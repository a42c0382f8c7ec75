package inspect

import (
	"mime"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/watchgate/watchgate/proxy/internal/answer"
)

// FramingFor returns how a watch stream of the given Content-Type
// is framed, the serializer that decodes one event and whether the stream
// is gzip-encoded, or false for anything but JSON and protobuf, identity
// or gzip-encoded (the stream then passes unread).
func FramingFor(contentType, contentEncoding string) (f Framing, s runtime.Serializer, gzipped, ok bool) {
	switch {
	case contentEncoding == "" || strings.EqualFold(contentEncoding, "identity"):
	case strings.EqualFold(contentEncoding, "gzip"):
		gzipped = true
	default:
		return 0, nil, false, false
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return 0, nil, false, false
	}
	switch mediaType {
	case runtime.ContentTypeJSON:
		f = JSONFraming
	case runtime.ContentTypeProtobuf:
		f = LengthPrefixedFraming
	default:
		return 0, nil, false, false
	}
	info, found := runtime.SerializerInfoForMediaType(answer.MetaCodecs.SupportedMediaTypes(), mediaType)
	if !found || info.StreamSerializer == nil {
		return 0, nil, false, false
	}
	return f, info.StreamSerializer.Serializer, gzipped, true
}
