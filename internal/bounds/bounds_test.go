package bounds

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestBounds(t *testing.T) {
	p := field.NewPath("x")
	for name, tc := range map[string]struct {
		errs field.ErrorList
		want string // "" for none
	}{
		"a count of 0":                           {NonNegative(p, 0), ""},
		"a negative count":                       {NonNegative(p, -1), "x: Invalid value: -1: must be 0 or more"},
		"a negative duration":                    {NonNegative(p, -time.Second), `x: Invalid value: "-1s": must be 0 or more`},
		"a rate of 0.5":                          {NonNegative(p, 0.5), ""},
		"a negative rate":                        {NonNegative(p, -0.5), "x: Invalid value: -0.5: must be a number, 0 or more"},
		"a rate that is not a number":            {NonNegative(p, math.NaN()), "x: Invalid value: NaN: must be a number, 0 or more"},
		"an infinite rate":                       {NonNegative(p, math.Inf(1)), "x: Invalid value: +Inf: must be a number, 0 or more"},
		"the least of a range":                   {Within(p, 1, 1, 100), ""},
		"the most of a range":                    {Within(p, 100, 1, 100), ""},
		"under a range":                          {Within(p, 0, 1, 100), "x: Invalid value: 0: must be at least 1"},
		"over a range":                           {Within(p, 101, 1, 100), "x: Invalid value: 101: must be at most 100"},
		"a duration over a range":                {Within(p, time.Hour, 0, 10*time.Minute), `x: Invalid value: "1h0m0s": must be at most 10m0s`},
		"a rate that is not a number in a range": {Within(p, math.NaN(), 0, 1), "x: Invalid value: NaN: must be at least 0"},
	} {
		t.Run(name, func(t *testing.T) {
			got := ""
			if len(tc.errs) > 1 {
				t.Fatalf("%d errors, want at most one: %v", len(tc.errs), tc.errs)
			}
			if len(tc.errs) == 1 {
				got = tc.errs[0].Error()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
