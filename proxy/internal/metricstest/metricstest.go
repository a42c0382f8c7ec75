package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// CounterValue is c's current value.
func CounterValue(tb testing.TB, c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// GaugeValue is g's current value.
func GaugeValue(tb testing.TB, g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
