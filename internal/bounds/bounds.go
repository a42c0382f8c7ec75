package bounds

import (
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Number is what the checks take: counts, durations and rates.
type Number interface {
	~int | ~int64 | ~float64
}

// NonNegative reports v at path when it is below zero or, for a rate
// (float64), not a finite number.
func NonNegative[T Number](path *field.Path, v T) field.ErrorList {
	if f := float64(v); !(f >= 0) || math.IsInf(f, 0) {
		detail := "must be 0 or more"
		if _, rate := any(v).(float64); rate {
			detail = "must be a number, 0 or more"
		}
		return field.ErrorList{field.Invalid(path, shown(v), detail)}
	}
	return nil
}

// Within reports v at path when it is not in [least, most] (or, for a
// rate, not a number).
func Within[T Number](path *field.Path, v, least, most T) field.ErrorList {
	switch {
	case !(v >= least):
		return field.ErrorList{field.Invalid(path, shown(v), fmt.Sprintf("must be at least %v", shown(least)))}
	case v > most:
		return field.ErrorList{field.Invalid(path, shown(v), fmt.Sprintf("must be at most %v", shown(most)))}
	}
	return nil
}

// shown is v as an error shows it: a duration as "1m30s", not in
// nanoseconds.
func shown[T Number](v T) any {
	if d, ok := any(v).(time.Duration); ok {
		return d.String()
	}
	return v
}
