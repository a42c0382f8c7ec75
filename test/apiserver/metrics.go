package apiserver

import (
	"context"
	"fmt"

	"bytes"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics reads the API server's own /metrics as the admin.
func (e *Env) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	raw, err := e.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read apiserver /metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(raw))
}

// Sum adds the values of the counters or gauges in family whose labels
// include every pair in match.
func Sum(families map[string]*dto.MetricFamily, family string, match map[string]string) float64 {
	f := families[family]
	if f == nil {
		return 0
	}
	var total float64
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// WatchRequests is the number of WATCH requests the API server has counted
// for group/resource (apiserver_request_total, verb WATCH), whatever their
// code.
func (e *Env) WatchRequests(ctx context.Context, group, resource string) (float64, error) {
	fams, err := e.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return Sum(fams, "apiserver_request_total", map[string]string{"verb": "WATCH", "group": group, "resource": resource}), nil
}
