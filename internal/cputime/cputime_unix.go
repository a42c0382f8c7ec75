//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Process is the CPU time this process has used, or 0 when unknown.
// Benchmarks report it per op besides ns/op: on a shared machine wall time
// also counts the time other processes held the CPU, CPU time does not.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
