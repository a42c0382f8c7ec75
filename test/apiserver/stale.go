package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// StaleVersion reproduces the seed incident's precondition in namespace ns
// (created if missing): it creates ConfigMap "first", churns the given
// number of other ConfigMaps in ns, and waits until etcd has compacted past
// the first one's resourceVersion, so that a watch from that version is
// answered "too old". It returns the item's (now stale) resourceVersion.
// It needs Options.StaleVersions; it gives up after timeout.
func (e *Env) StaleVersion(ctx context.Context, ns string, churn int, timeout time.Duration) (string, error) {
	cs := e.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	first, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "first-"}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		for j := 0; j < churn; j++ {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "churn-"}, Data: map[string]string{"i": strconv.Itoa(j)}}
			if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return "", err
			}
		}
		ev, err := e.WatchOnce(ctx, e.Config, "/api/v1/namespaces/"+ns+"/configmaps", first.ResourceVersion)
		if err != nil {
			return "", err
		}
		if ev.Code == http.StatusGone {
			return first.ResourceVersion, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("resourceVersion %s did not go stale within %s (is StaleVersions set?)", first.ResourceVersion, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// WatchAnswer is what a single watch request got.
type WatchAnswer struct {
	// HTTPStatus and ContentType of the response.
	HTTPStatus  int
	ContentType string
	// Events received before the stream ended or the wait ran out.
	Events []metav1.WatchEvent
	// Closed is true when the server ended the stream.
	Closed bool
	// Code is the Status code of the first ERROR event, 0 if none.
	Code int
	// Status is the first ERROR event's Status.
	Status metav1.Status
}

// WatchOnce opens a JSON watch on path from resourceVersion with cfg's
// credentials, and reads it until it closes or for at most 2 seconds.
func (e *Env) WatchOnce(ctx context.Context, cfg *rest.Config, path, resourceVersion string) (WatchAnswer, error) {
	return WatchFor(ctx, cfg, path, resourceVersion, 2*time.Second)
}

// WatchFor is WatchOnce with a chosen wait.
func WatchFor(ctx context.Context, cfg *rest.Config, path, resourceVersion string, wait time.Duration) (WatchAnswer, error) {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return WatchAnswer{}, err
	}
	q := url.Values{"watch": {"true"}, "resourceVersion": {resourceVersion}}
	u := strings.TrimRight(cfg.Host, "/") + path + "?" + q.Encode()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return WatchAnswer{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return WatchAnswer{}, err
	}
	defer resp.Body.Close()
	ans := WatchAnswer{HTTPStatus: resp.StatusCode, ContentType: resp.Header.Get("Content-Type")}
	if resp.StatusCode != http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(&ans.Status)
		ans.Code = int(ans.Status.Code)
		return ans, nil
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var ev metav1.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			// EOF before the deadline: the server closed the stream.
			ans.Closed = ctx.Err() == nil
			return ans, nil
		}
		ans.Events = append(ans.Events, ev)
		if ev.Type == "ERROR" && ans.Code == 0 {
			if err := json.Unmarshal(ev.Object.Raw, &ans.Status); err != nil {
				return ans, fmt.Errorf("decode ERROR event: %w", err)
			}
			ans.Code = int(ans.Status.Code)
		}
	}
}
