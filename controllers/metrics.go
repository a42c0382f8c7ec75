package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	policyLoadsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_policy_loads_total",
		Help: "Policies compiled from WatchBudgets and swapped into this replica's engine. No labels.",
	})
	budgetsLoaded = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watchgate_budgets",
		Help: "WatchBudgets in this replica's last compiled policy, by state (Ready: enforced; Invalid: left out, see the budget's Ready condition). One series per state (2).",
	}, []string{"state"})
	statusWritesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_replica_status_writes_total",
		Help: "Writes of this replica's entry in WatchBudget status, by result (success, error). One series per result (2).",
	}, []string{"result"})
	throttleEventsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_throttle_events_total",
		Help: "Identities starting to be throttled, by what became of the Event on the WatchBudget (recorded; dropped: queue full or budget gone). One series per result (2).",
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(policyLoadsTotal, budgetsLoaded, statusWritesTotal, throttleEventsTotal)
}
