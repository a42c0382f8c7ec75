package streamtest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// BenchEvents is a JSON watch stream of n MODIFIED events of ~1.2 KiB
// ConfigMaps, as kube-apiserver writes them (one compact value per line).
func BenchEvents(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%d","namespace":"bench","uid":"6f1c8a2e-4b1d-4c53-9a57-%012d","resourceVersion":"%d","creationTimestamp":"2026-12-02T17:00:00Z","labels":{"app":"bench","tier":"backend"},"annotations":{"note":"%s"},"managedFields":[{"manager":"kubectl","operation":"Update","apiVersion":"v1","time":"2026-12-02T17:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}}}}]},"data":{"k":"%s"}}}`+"\n",
			i, i, 1000+i, strings.Repeat("a", 200), strings.Repeat("v", 600))
	}
	return b.Bytes()
}

// BenchProtobufEvents is BenchEvents as a protobuf watch stream, framed
// and encoded as kube-apiserver writes it (length-prefixed raw WatchEvents
// embedding enveloped ConfigMaps).
func BenchProtobufEvents(tb testing.TB, n int) []byte {
	info, ok := k8sruntime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), k8sruntime.ContentTypeProtobuf)
	if !ok {
		tb.Fatal("no protobuf serializer")
	}
	var b bytes.Buffer
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&b), info.StreamSerializer.Serializer),
		scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion))
	for i := range n {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("cm-%d", i), Namespace: "bench", UID: types.UID(fmt.Sprintf("6f1c8a2e-4b1d-4c53-9a57-%012d", i)),
				ResourceVersion: fmt.Sprint(1000 + i), Labels: map[string]string{"app": "bench", "tier": "backend"},
				Annotations: map[string]string{"note": strings.Repeat("a", 200)},
			},
			Data: map[string]string{"k": strings.Repeat("v", 600)},
		}
		if err := enc.Encode(&watch.Event{Type: watch.Modified, Object: cm}); err != nil {
			tb.Fatal(err)
		}
	}
	return b.Bytes()
}
