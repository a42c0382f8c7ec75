// Package cputime reads the CPU time this process has used, which
// benchmarks report per op besides ns/op (cpu-ns/op): on a shared machine
// wall time also counts the time other processes held the CPU, CPU time
// does not. proxy's and ratelimit's benchmarks use it.
package cputime
