package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/watchgate/watchgate/ratelimit"
)

func TestClassify(t *testing.T) {
	type want struct {
		verb                        ratelimit.Verb
		group, resource, namespace  string
		labels, fields, rv, rvMatch string
		sendInitialEvents           bool
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
			want: want{verb: ratelimit.VerbWatch, group: "apps", resource: "deployments", rvMatch: "NotOlderThan", sendInitialEvents: true},
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
		"a malformed timeout is ignored": {
			url:  "/api/v1/pods?watch=true&timeoutSeconds=soon",
			want: want{verb: ratelimit.VerbWatch, resource: "pods"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := classify(newRequestInfoFactory(), httptest.NewRequest(http.MethodGet, tc.url, nil), discardLogs())
			if err != nil {
				t.Fatal(err)
			}
			got := want{c.Verb, c.Info.APIGroup, c.Info.Resource, c.Info.Namespace, c.LabelSelector, c.FieldSelector,
				c.ResourceVersion, c.ResourceVersionMatch, c.SendInitialEvents, c.TimeoutSeconds}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
