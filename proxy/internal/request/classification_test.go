package request

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestClassify(t *testing.T) {
	type want struct {
		verb                        ratelimit.Verb
		group, resource, namespace  string
		labels, fields, rv, rvMatch string
		sendInitialEvents           *bool
		timeoutSeconds              int64
	}
	for name, tc := range map[string]struct {
		url  string
		want want
	}{
		"a core watch by query": {
			url:  "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=42&labelSelector=app%3Dx&timeoutSeconds=300",
			want: want{verb: ratelimit.VerbWatch, resource: "pods", namespace: "ns", labels: "app=x", rv: "42", timeoutSeconds: 300},
		},
		"a grouped watch across namespaces": {
			url:  "/apis/apps/v1/deployments?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
			want: want{verb: ratelimit.VerbWatch, group: "apps", resource: "deployments", rvMatch: "NotOlderThan", sendInitialEvents: &trueValue},
		},
		"a legacy /watch/ path": {
			url:  "/api/v1/watch/namespaces/ns/configmaps?resourceVersion=7",
			want: want{verb: ratelimit.VerbWatch, resource: "configmaps", namespace: "ns", rv: "7"},
		},
		"a legacy watch of one object is a watch by name": {
			url:  "/api/v1/watch/namespaces/ns/configmaps/one",
			want: want{verb: ratelimit.VerbWatch, resource: "configmaps", namespace: "ns", fields: "metadata.name=one"},
		},
		"a list": {
			url:  "/apis/watchgate.io/v1alpha1/watchbudgets?limit=500&fieldSelector=metadata.name%3Dx",
			want: want{verb: ratelimit.VerbList, group: "watchgate.io", resource: "watchbudgets", fields: "metadata.name=x"},
		},
		"a get is not budgeted":               {url: "/api/v1/namespaces/ns/pods/p", want: want{resource: "pods", namespace: "ns"}},
		"a subresource is not budgeted":       {url: "/api/v1/namespaces/ns/pods/p/log?follow=true", want: want{resource: "pods", namespace: "ns"}},
		"a non-resource path is not budgeted": {url: "/version", want: want{}},
		"sendInitialEvents=false": {
			url:  "/api/v1/pods?watch=true&sendInitialEvents=FALSE&resourceVersionMatch=NotOlderThan",
			want: want{verb: ratelimit.VerbWatch, resource: "pods", rvMatch: "NotOlderThan", sendInitialEvents: &falseValue},
		},
		"sendInitialEvents is true for anything but 0 and false, as the API server reads it": {
			url:  "/api/v1/pods?watch=true&sendInitialEvents=&resourceVersionMatch=NotOlderThan",
			want: want{verb: ratelimit.VerbWatch, resource: "pods", rvMatch: "NotOlderThan", sendInitialEvents: &trueValue},
		},
		"a malformed timeout is ignored": {
			url:  "/api/v1/pods?watch=true&timeoutSeconds=soon",
			want: want{verb: ratelimit.VerbWatch, resource: "pods"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, _, err := classify(NewRequestInfoFactory(), httptest.NewRequest(http.MethodGet, tc.url, nil), logtest.Discard())
			if err != nil {
				t.Fatal(err)
			}
			got := want{c.Verb, c.APIGroup, c.Resource, c.Namespace, c.LabelSelector, c.FieldSelector,
				c.ResourceVersion, c.ResourceVersionMatch, c.SendInitialEvents, c.TimeoutSeconds}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// FuzzClassification: on arbitrary paths and queries classification never
// panics, and its RequestInfo is exactly RequestInfoFactory's, also where
// the proxy parses the query first to keep the factory from logging it.
func FuzzClassification(f *testing.F) {
	for _, seed := range [][2]string{
		{"/api/v1/namespaces/ns/configmaps", "watch=true&resourceVersion=42"},
		{"/api/v1/watch/namespaces/ns/pods/p", "labelSelector=a%3Db"},
		{"/apis/apps/v1/deployments", "labelSelector=%3D%3D%3D&watch=1"},
		{"/api/v1/pods", "fieldSelector=metadata.name%3Dx"},
		{"/api/v1/pods", "watch=maybe&limit=x"},
		{"/apis/g/v/namespaces/n/r/name/sub", "watch=true"},
		{"/version", "x=1"},
		{"//api/v1/../pods", "%zz"},
	} {
		f.Add(http.MethodGet, seed[0], seed[1])
	}
	f.Add(http.MethodDelete, "/api/v1/namespaces/ns/pods", "labelSelector=%21%21")
	factory := NewRequestInfoFactory()
	f.Fuzz(func(t *testing.T, method, path, query string) {
		if method == "" {
			method = http.MethodGet
		}
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{}}
		want, werr := factory.NewRequestInfo(r)
		c, info, err := classify(factory, r, logtest.Discard())
		if (err != nil) != (werr != nil) {
			t.Fatalf("classify error %v, factory error %v", err, werr)
		}
		if err != nil {
			return
		}
		if !reflect.DeepEqual(info, want) {
			t.Fatalf("classified %#v, the factory says %#v", info, want)
		}
		if c.APIGroup != info.APIGroup || c.Resource != info.Resource || c.Namespace != info.Namespace {
			t.Fatalf("classification %+v does not name the RequestInfo's target %#v", c, info)
		}
		if c.Verb != 0 && (info.Verb != "watch" && info.Verb != "list" || !info.IsResourceRequest || info.Subresource != "") {
			t.Fatalf("budgeted verb %v for %#v", c.Verb, info)
		}
	})
}

// Issue 9 finding 6: an unparsable selector never reaches klog through the
// factory; the proxy logs it sampled and cut to maxLoggedValueBytes.
func TestUnparsableSelectorLogIsBounded(t *testing.T) {
	var lines []string
	logs := sampledlog.New(logtest.Func(func(msg string) { lines = append(lines, msg) }), 1000, 1000)
	var klogged bytes.Buffer
	klog.SetOutput(&klogged)
	klog.LogToStderr(false)
	t.Cleanup(func() { klog.LogToStderr(true) })
	huge := strings.Repeat("!", 1<<20)
	r := httptest.NewRequest(http.MethodGet, "/api/v1/pods?watch=true&labelSelector="+url.QueryEscape(huge), nil)
	c, info, err := classify(NewRequestInfoFactory(), r, logs)
	if err != nil {
		t.Fatal(err)
	}
	if info.Verb != "watch" || info.LabelSelector != huge || c.LabelSelector != huge {
		t.Errorf("verb %q, selector of %d bytes; want watch with the selector as sent", info.Verb, len(info.LabelSelector))
	}
	klog.Flush()
	if klogged.Len() != 0 {
		t.Errorf("klog got %d bytes from the factory, want none", klogged.Len())
	}
	if len(lines) != 1 || len(lines[0]) > 4*sampledlog.MaxValueBytes {
		t.Errorf("proxy logged %d lines (%d bytes in all), want one bounded line", len(lines), len(strings.Join(lines, "")))
	}
}

// Only a watch from an explicit version without sendInitialEvents and
// resourceVersionMatch can be answered locally from the stale memory, and
// only such watches are held for another from the same version.
func TestFromVersion(t *testing.T) {
	for query, want := range map[string]bool{
		"watch=true&resourceVersion=42":                                                           true,
		"watch=true&resourceVersion=42&allowWatchBookmarks=true&timeoutSeconds=300":               true,
		"watch=true&resourceVersion=42&sendInitialEvents=true&resourceVersionMatch=NotOlderThan":  false,
		"watch=true&resourceVersion=42&sendInitialEvents=false&resourceVersionMatch=NotOlderThan": false,
		"watch=true&resourceVersion=42&resourceVersionMatch=Exact":                                false,
		"watch=true&resourceVersion=42&resourceVersionMatch=NotOlderThan":                         false,
		"watch=true&resourceVersion=42&sendInitialEvents=true":                                    false,
		"watch=true&resourceVersion=42&sendInitialEvents=":                                        false,
		"watch=true&resourceVersion=0":                                                            false,
		"watch=true":                                                                              false,
		"resourceVersion=42":                                                                      false, // a list
	} {
		c, _, err := classify(NewRequestInfoFactory(), httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns/configmaps?"+query, nil), logtest.Discard())
		if err != nil {
			t.Fatal(err)
		}
		if got := c.FromVersion(); got != want {
			t.Errorf("%s: fromVersion %v, want %v", query, got, want)
		}
	}
}
