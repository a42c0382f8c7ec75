package e2e

import (
	"bytes"
	"encoding/json"
	"net/url"
	"reflect"
	"testing"
)

// What the proxy does not budget or read passes unharmed: a CBOR Accept
// (kube-apiserver 1.37 serves CBOR only with CBORServingAndStorage on; the
// test bed's answer, whatever it is, must be the same through the proxy)
// and the sharded list and watch parameter of 1.36 (shardSelector), on a
// list and on a watch. The same status, Content-Type and, for lists, the
// same body as directly.
func TestCBORAndShardedRequestsPassUnharmed(t *testing.T) {
	ns := uniqueName("passthrough")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	p := startProxy(t, generous("everyone", 100))
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	for name, tc := range map[string]struct {
		query  url.Values
		accept string
	}{
		"a CBOR list":                {url.Values{}, "application/cbor"},
		"a CBOR watch":               {url.Values{"watch": {"true"}, "timeoutSeconds": {"1"}}, "application/cbor"},
		"a sharded list":             {url.Values{"shardSelector": {"shardRange(object.metadata.uid, '0x0', '0x8000000000000000')"}}, "application/json"},
		"a sharded watch":            {url.Values{"watch": {"true"}, "timeoutSeconds": {"1"}, "shardSelector": {"shardRange(object.metadata.uid, '0x0', '0x8000000000000000')"}}, "application/json"},
		"a malformed shard selector": {url.Values{"shardSelector": {"nonsense("}}, "application/json"},
	} {
		t.Run(name, func(t *testing.T) {
			target := path + "?" + tc.query.Encode()
			headers := map[string]string{"Accept": tc.accept}
			direct, directBody := rawGet(t, nil, sa.Token, target, headers)
			via, viaBody := rawGet(t, p, sa.Token, target, headers)
			t.Logf("directly: HTTP %d %s, %d bytes", direct.StatusCode, direct.Header.Get("Content-Type"), len(directBody))
			if direct.StatusCode != via.StatusCode || direct.Header.Get("Content-Type") != via.Header.Get("Content-Type") {
				t.Errorf("directly HTTP %d %q, through the proxy HTTP %d %q", direct.StatusCode, direct.Header.Get("Content-Type"),
					via.StatusCode, via.Header.Get("Content-Type"))
			}
			if tc.query.Get("watch") == "" && !bytes.Equal(directBody, viaBody) && !sameExceptResourceVersion(directBody, viaBody) {
				t.Errorf("bodies differ:\ndirectly %s\nthrough  %s", directBody, viaBody)
			}
		})
	}
}

// sameExceptResourceVersion reports whether two JSON list bodies differ
// at most in the list's resourceVersion (the lists were made at two
// moments, and kube-apiserver's own writes move the version).
func sameExceptResourceVersion(a, b []byte) bool {
	var x, y map[string]any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	for _, m := range []map[string]any{x, y} {
		if meta, ok := m["metadata"].(map[string]any); ok {
			delete(meta, "resourceVersion")
		}
	}
	return reflect.DeepEqual(x, y)
}
