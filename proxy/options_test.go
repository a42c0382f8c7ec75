package proxy

import (
	"math"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
)

// Every bound of Options, once: each row sets one field (or a pair) and
// names the path Validate reports, or none when the value is accepted. The
// zero Options is valid; Upstream and Engine are NewServer's to require.
func TestOptionsValidateBounds(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for name, tc := range map[string]struct {
		opts Options
		// want is the path of the one error, "" for none.
		want string
	}{
		"the zero value: every default":                     {Options{}, ""},
		"a bind address without a port":                     {Options{BindAddress: "8443"}, "bindAddress"},
		"a bind address with port 0 (any free port)":        {Options{BindAddress: "127.0.0.1:0"}, ""},
		"a certificate without its key":                     {Options{CertFile: "c"}, "keyFile"},
		"a key without its certificate":                     {Options{KeyFile: "k"}, "certFile"},
		"a negative header timeout":                         {Options{ReadHeaderTimeout: -1}, "readHeaderTimeout"},
		"a negative header size":                            {Options{MaxHeaderBytes: -1}, "maxHeaderBytes"},
		"a negative stream count":                           {Options{MaxConcurrentStreams: -1}, "maxConcurrentStreams"},
		"a negative token cache TTL":                        {Options{TokenCacheTTL: -1}, "tokenCacheTTL"},
		"a negative negative-token cache TTL":               {Options{TokenCacheNegativeTTL: -1}, "tokenCacheNegativeTTL"},
		"a negative token cache size":                       {Options{TokenCacheSize: -1}, "tokenCacheSize"},
		"a negative impersonation cache TTL":                {Options{ImpersonationCacheTTL: -1}, "impersonationCacheTTL"},
		"a negative negative-impersonation cache TTL":       {Options{ImpersonationCacheNegativeTTL: -1}, "impersonationCacheNegativeTTL"},
		"a negative impersonation cache size":               {Options{ImpersonationCacheSize: -1}, "impersonationCacheSize"},
		"a negative review rate":                            {Options{ReviewsPerSecond: -1}, "reviewsPerSecond"},
		"a review rate that is not a number":                {Options{ReviewsPerSecond: nan}, "reviewsPerSecond"},
		"an infinite review rate":                           {Options{ReviewsPerSecond: inf}, "reviewsPerSecond"},
		"a negative review burst":                           {Options{ReviewBurst: -1}, "reviewBurst"},
		"a negative review concurrency":                     {Options{MaxConcurrentReviews: -1}, "maxConcurrentReviews"},
		"a negative TokenReview rate per client":            {Options{TokenReviewsPerClientPerSecond: -1}, "tokenReviewsPerClientPerSecond"},
		"an infinite TokenReview rate per client":           {Options{TokenReviewsPerClientPerSecond: inf}, "tokenReviewsPerClientPerSecond"},
		"a negative TokenReview burst per client":           {Options{TokenReviewClientBurst: -1}, "tokenReviewClientBurst"},
		"an impersonation review rate that is not a number": {Options{ImpersonationReviewsPerCallerPerSecond: nan}, "impersonationReviewsPerCallerPerSecond"},
		"a negative impersonation review burst":             {Options{ImpersonationReviewCallerBurst: -1}, "impersonationReviewCallerBurst"},
		"a negative count of review requesters":             {Options{ReviewRequestersTracked: -1}, "reviewRequestersTracked"},
		"a negative review timeout":                         {Options{ReviewTimeout: -1}, "reviewTimeout"},
		"a failure policy that does not exist":              {Options{ReviewFailurePolicy: "Sometimes"}, "reviewFailurePolicy"},
		"fail open":                                         {Options{ReviewFailurePolicy: FailOpen}, ""},
		"a negative key refresh interval":                   {Options{ServiceAccountKeysRefreshInterval: -1}, "serviceAccountKeysRefreshInterval"},
		"a negative reject delay":                           {Options{MaxRejectDelay: -1}, "maxRejectDelay"},
		"a negative count of delayed rejections":            {Options{MaxDelayedRejections: -1}, "maxDelayedRejections"},
		"a negative stale watch delay":                      {Options{MaxStaleWatchDelay: -1}, "maxStaleWatchDelay"},
		"a negative drain delay":                            {Options{ShutdownDrainDelay: -1}, "shutdownDrainDelay"},
		"a negative grace period":                           {Options{ShutdownGracePeriod: -1}, "shutdownGracePeriod"},
		"a grace period of 10m, the most":                   {Options{ShutdownGracePeriod: 10 * time.Minute}, ""},
		"a grace period over 10m":                           {Options{ShutdownGracePeriod: 10*time.Minute + 1}, "shutdownGracePeriod"},
		"a negative sweep interval":                         {Options{SweepInterval: -1}, "sweepInterval"},
		"a negative probe interval":                         {Options{UpstreamProbeInterval: -1}, "upstreamProbeInterval"},
		"a negative watch cap":                              {Options{MaxWatches: -1}, "maxWatches"},
		"a negative cap per caller":                         {Options{MaxWatches: 10, MaxWatchesPerIdentity: -1}, "maxWatchesPerIdentity"},
		"a cap per caller over the watch cap":               {Options{MaxWatches: 10, MaxWatchesPerIdentity: 11}, "maxWatchesPerIdentity"},
		"a cap per caller equal to the watch cap":           {Options{MaxWatches: 10, MaxWatchesPerIdentity: 10}, ""},
		"a cap per caller without a watch cap":              {Options{MaxWatchesPerIdentity: 11}, ""},
		"a negative watch-open rate":                        {Options{WatchOpensPerIdentityPerSecond: -1}, "watchOpensPerIdentityPerSecond"},
		"a watch-open rate that is not a number":            {Options{WatchOpensPerIdentityPerSecond: nan}, "watchOpensPerIdentityPerSecond"},
		"an infinite watch-open rate":                       {Options{WatchOpensPerIdentityPerSecond: inf}, "watchOpensPerIdentityPerSecond"},
		"a negative watch-open burst":                       {Options{WatchOpenBurstPerIdentity: -1}, "watchOpenBurstPerIdentity"},
		"a memory mark of 0: the default":                   {Options{MemoryHighWaterPercent: 0}, ""},
		"a memory mark of 1%, the least":                    {Options{MemoryHighWaterPercent: 1}, ""},
		"a memory mark of 100%: never":                      {Options{MemoryHighWaterPercent: 100}, ""},
		"a memory mark over 100%":                           {Options{MemoryHighWaterPercent: 101}, "memoryHighWaterPercent"},
		"a negative memory mark":                            {Options{MemoryHighWaterPercent: -1}, "memoryHighWaterPercent"},
		"a negative connection cap":                         {Options{MaxConnections: -1}, "maxConnections"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := tc.opts.Validate()
			switch {
			case tc.want == "" && len(errs) != 0:
				t.Errorf("Validate() = %v, want no error", errs)
			case tc.want != "" && (len(errs) != 1 || errs[0].Field != tc.want):
				t.Errorf("Validate() = %v, want one error for %s", errs, tc.want)
			}
		})
	}
}

// Validate's message is the same every time, in the order of Options'
// fields, each naming the field and the value.
func TestOptionsValidateIsInFieldOrder(t *testing.T) {
	o := &Options{
		SweepInterval: -1, ReadHeaderTimeout: -1, MaxRejectDelay: -1, ShutdownGracePeriod: time.Hour,
		TokenCacheSize: -1, MaxWatches: -1, ReviewBurst: -1,
		ReviewsPerSecond: -1, ImpersonationReviewsPerCallerPerSecond: math.NaN(),
	}
	want := strings.Join([]string{
		`readHeaderTimeout: Invalid value: "-1ns": must be 0 or more`,
		`tokenCacheSize: Invalid value: -1: must be 0 or more`,
		`reviewsPerSecond: Invalid value: -1: must be a number, 0 or more`,
		`reviewBurst: Invalid value: -1: must be 0 or more`,
		`impersonationReviewsPerCallerPerSecond: Invalid value: NaN: must be a number, 0 or more`,
		`maxRejectDelay: Invalid value: "-1ns": must be 0 or more`,
		`shutdownGracePeriod: Invalid value: "1h0m0s": must be at most 10m0s`,
		`sweepInterval: Invalid value: "-1ns": must be 0 or more`,
		`maxWatches: Invalid value: -1: must be 0 or more`,
	}, "\n")
	for range 20 {
		var got []string
		for _, e := range o.Validate() {
			got = append(got, e.Error())
		}
		if s := strings.Join(got, "\n"); s != want {
			t.Fatalf("Validate() =\n%s\nwant\n%s", s, want)
		}
	}
}

// NewServer requires what Validate does not check: the API server and the
// engine, which are dependencies rather than settings.
func TestNewServerRequiresUpstreamAndEngine(t *testing.T) {
	_, err := NewServer(Options{CertFile: "c"})
	if err == nil {
		t.Fatal("NewServer accepted options without an upstream or engine")
	}
	for _, want := range []string{"upstream: Required value", "engine: Required value", "keyFile: Required value"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if errs := (&Options{Upstream: &rest.Config{Host: "https://x"}, Engine: &enginetest.Engine{}}).Validate(); len(errs) != 0 {
		t.Errorf("minimal options rejected: %v", errs)
	}
}
