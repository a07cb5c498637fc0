package requests

import "github.com/prometheus/client_golang/prometheus"

// LatencyBuckets span a cached short prompt (ms) to a long generation (minutes): the doors'
// TTFT and latency histograms and EstimateAccuracy's predicted TTFT, so their quantiles compare.
var LatencyBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 14)

// newInexactCounter counts the requests the router's tokenizer refused to tokenize exactly
// (routed by load, without a prefix estimate), by reason (internal/tokenizer.InexactReason). Its
// name keeps the front door's subsystem, where the series began, so dashboards and alerts read
// it unchanged; it counts the front door's and the endpoint picker's requests.
func newInexactCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prefixmesh", Subsystem: "frontdoor", Name: "tokenize_inexact_total",
		Help: "Requests the router cannot tokenize exactly on purpose (routed by load, without a prefix estimate), by reason: no_chat_template, template_feature, number_format, big_integer, python_whitespace, python_repr, tokenizer_feature."},
		[]string{"reason"})
}
