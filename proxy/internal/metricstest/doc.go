// Package metricstest reads metrics in tests.
package metricstest
