package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/watchgate/watchgate/ratelimit"
)

// An agent that rebuilds one resource's cache in a loop (here: lists
// configmaps again and again) runs out of that resource's rebuilds
// (limits.listsPerMinutePerResource) and gets 429 ResourceListsLimited,
// while its lists of another resource, and the further pages of a list,
// go through. watchgate_proxy_rebuilds_total counts, per resource, the
// rebuilds the API server answered.
func TestOneResourcesRelistLoopDoesNotStarveTheAgentsOthers(t *testing.T) {
	ns := uniqueName("rebuilds")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps", "secrets"))
	b := generous("everyone", 100)
	b.Limits.ListsPerMinute, b.Limits.ListBurst = 600, 100
	b.Limits.ListsPerMinutePerResource, b.Limits.ListBurstPerResource = 6, 3
	p := startProxy(t, b)
	rebuilds := func(resource string) float64 {
		return proxyMetric(t, "watchgate_proxy_rebuilds_total", map[string]string{"group": "", "resource": resource})
	}
	cmBefore, secBefore := rebuilds("configmaps"), rebuilds("secrets")

	list := func(resource, query string) (int, string) {
		resp, body := rawGet(t, p, sa.Token, fmt.Sprintf("/api/v1/namespaces/%s/%s%s", ns, resource, query), nil)
		return resp.StatusCode, resp.Header.Get("X-Watchgate-Decision") + " " + string(body)
	}
	for i := range 3 {
		if code, got := list("configmaps", ""); code != http.StatusOK {
			t.Fatalf("configmaps list %d: %d %s", i, code, got)
		}
	}
	code, got := list("configmaps", "")
	if code != http.StatusTooManyRequests || !strings.Contains(got, "reason="+string(ratelimit.ReasonResourceListsLimited)) {
		t.Fatalf("4th configmaps list in a row: %d %s; want 429 %s", code, got, ratelimit.ReasonResourceListsLimited)
	}
	if !strings.Contains(got, ratelimit.ReasonResourceListsLimited.Text()) {
		t.Errorf("the 429's message does not say why: %s", got)
	}
	// Secrets have their own rebuilds, all of them.
	for i := range 3 {
		if code, got := list("secrets", ""); code != http.StatusOK {
			t.Errorf("secrets list %d while configmaps are limited: %d %s", i, code, got)
		}
	}
	// A further page is part of the rebuild it continues: not charged.
	// (The API server refuses a made-up continue token with 400; what
	// matters is that watchgate forwarded it.)
	if code, got := list("configmaps", "?limit=1&continue=bm90LWEtdG9rZW4"); code == http.StatusTooManyRequests {
		t.Errorf("a further configmaps page was limited: %s", got)
	}
	if n := rebuilds("configmaps") - cmBefore; n != 3 {
		t.Errorf("configmaps rebuilds counted = %v, want 3 (the limited one never reached the API server)", n)
	}
	if n := rebuilds("secrets") - secBefore; n != 3 {
		t.Errorf("secrets rebuilds counted = %v, want 3", n)
	}
}
