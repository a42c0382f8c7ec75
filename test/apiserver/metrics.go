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
	return SumBy(families, family, "", match)[""]
}

// SumBy is Sum for each value of label: the values of the counters or
// gauges in family whose labels include every pair in match, added up by
// their value of label ("" adds them all).
func SumBy(families map[string]*dto.MetricFamily, family, label string, match map[string]string) map[string]float64 {
	out := map[string]float64{}
	each(families, family, label, match, func(key string, m *dto.Metric) {
		switch {
		case m.Counter != nil:
			out[key] += m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[key] += m.GetGauge().GetValue()
		case m.Untyped != nil:
			out[key] += m.GetUntyped().GetValue()
		}
	})
	return out
}

// HistogramBy is SumBy for histograms: their observation counts and sums
// added up by their value of label.
func HistogramBy(families map[string]*dto.MetricFamily, family, label string, match map[string]string) (map[string]uint64, map[string]float64) {
	count, sum := map[string]uint64{}, map[string]float64{}
	each(families, family, label, match, func(key string, m *dto.Metric) {
		if h := m.GetHistogram(); h != nil {
			count[key] += h.GetSampleCount()
			sum[key] += h.GetSampleSum()
		}
	})
	return count, sum
}

// each calls f with every metric of family whose labels include every
// pair in match, and its value of label ("" when label is "").
func each(families map[string]*dto.MetricFamily, family, label string, match map[string]string, f func(key string, m *dto.Metric)) {
	fam := families[family]
	if fam == nil {
		return
	}
next:
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if have[k] != v {
				continue next
			}
		}
		key := ""
		if label != "" {
			key = have[label]
		}
		f(key, m)
	}
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
