package ratelimit

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseVersion holds parseVersion to kube-apiserver's parser,
// strconv.ParseUint(rv, 10, 64), with "" and every spelling of 0 not
// explicit.
func FuzzParseVersion(f *testing.F) {
	for _, rv := range []string{"", "0", "00", "1", "0001", "123456", "18446744073709551615", "18446744073709551616",
		"000018446744073709551615", "99999999999999999999",
		"9999999999999999999", "0009999999999999999999", "999999999999999999x", "10000000000000000000", "-1", "+1", "1e3", "0x10", "1_000", " 1", "١"} {
		f.Add(rv)
	}
	f.Add(strings.Repeat("0", 1<<12) + "42")
	f.Fuzz(func(t *testing.T, rv string) {
		v, ok := parseVersion(rv)
		want, err := strconv.ParseUint(rv, 10, 64)
		if wantOK := err == nil && want != 0; ok != wantOK || ok && v != want {
			t.Fatalf("parseVersion(%q) = %d, %v; strconv.ParseUint = %d, %v", rv, v, ok, want, err)
		}
	})
}
