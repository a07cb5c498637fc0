package node

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// latencyBuckets span 25 µs (a peek of a short prompt on loopback) to ~0.6 s (a stalled client or a
// huge summary stream), ×2.5 per bucket: twelve buckets keep the series count small per method.
var latencyBuckets = prometheus.ExponentialBuckets(25e-6, 2.5, 12)

// metrics are the server's Prometheus series. The cache's own counters are read from the tree at
// scrape time (treeCollector), so lookups made in process (the simulated engine) count too.
type metrics struct {
	requests      *prometheus.CounterVec   // by method and code
	latency       *prometheus.HistogramVec // seconds, by method and code
	evictedBlocks prometheus.Counter       // blocks evicted through the Evict RPC
}

func newMetrics(reg *prometheus.Registry, tree Tree) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prefixmesh", Subsystem: "node", Name: "grpc_requests_total",
			Help: "gRPC requests handled by the node agent, by method and status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "prefixmesh", Subsystem: "node", Name: "grpc_request_duration_seconds",
			Help:    "Time to handle a gRPC request (a whole stream for streaming methods), by method and status code.",
			Buckets: latencyBuckets,
		}, []string{"method", "code"}),
		evictedBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "prefixmesh", Subsystem: "node", Name: "grpc_evicted_blocks_total",
			Help: "KV blocks evicted from the node's prefix cache through the NodeCache.Evict RPC.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.evictedBlocks, newTreeCollector(tree)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register collector: %w", err)
		}
	}
	return m, nil
}

// treeCollector exports the tree's counters and sizes at scrape time. Reading them takes the
// tree's lock briefly, once per scrape.
type treeCollector struct {
	tree                                           Tree
	hits, misses, hitTokens                        *prometheus.Desc
	entries, cachedBlocks, snapshots, summarySeq   *prometheus.Desc
	snapEvictions, snapLookups, snapHits, snapSave *prometheus.Desc
}

var _ prometheus.Collector = (*treeCollector)(nil)

func newTreeCollector(tree Tree) *treeCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("prefixmesh_node_cache_"+name, help, nil, nil)
	}
	return &treeCollector{
		tree:          tree,
		hits:          d("hits_total", "Prefix cache lookups that matched at least one token."),
		misses:        d("misses_total", "Prefix cache lookups that matched nothing."),
		hitTokens:     d("matched_tokens_total", "Prompt tokens matched, summed over lookups that hit."),
		entries:       d("entries", "Entries in the prefix cache tree."),
		cachedBlocks:  d("cached_blocks", "KV blocks held by the prefix cache (full blocks)."),
		snapshots:     d("snapshots", "SSM snapshot entries, spilled ones included."),
		summarySeq:    d("summary_seq", "Sequence number of the latest change in the summary journal."),
		snapEvictions: d("snapshot_evictions_total", "SSM snapshot entries removed by eviction."),
		snapLookups:   d("snapshot_lookups_total", "SSM snapshot index lookups."),
		snapHits:      d("snapshot_hits_total", "SSM snapshot index lookups that found an anchor."),
		snapSave:      d("snapshot_saves_total", "SSM snapshots registered."),
	}
}

// Describe implements prometheus.Collector.
func (c *treeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.hitTokens, c.entries, c.cachedBlocks,
		c.snapshots, c.summarySeq, c.snapEvictions, c.snapLookups, c.snapHits, c.snapSave} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *treeCollector) Collect(ch chan<- prometheus.Metric) {
	hs := c.tree.HitStats()
	entries, blocks := c.tree.Stats()
	ss := c.tree.SnapshotStats()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(c.hits, hs.Hits)
	counter(c.misses, hs.Misses)
	counter(c.hitTokens, hs.HitTokens)
	gauge(c.entries, float64(entries))
	gauge(c.cachedBlocks, float64(blocks))
	gauge(c.snapshots, float64(c.tree.SnapshotCount()))
	gauge(c.summarySeq, float64(c.tree.SummaryHead()))
	counter(c.snapEvictions, ss.Evictions)
	counter(c.snapLookups, ss.Lookups)
	counter(c.snapHits, ss.Hits)
	counter(c.snapSave, ss.Saves)
}

// methodLabel turns "/prefixmesh.v1.NodeCache/Lookup" into "prefixmesh.v1.NodeCache/Lookup".
func methodLabel(full string) string { return strings.TrimPrefix(full, "/") }

// observe records one finished call in the metrics and the log. Client mistakes (InvalidArgument
// and friends) are logged at debug level, server faults at error level.
func (s *Server) observe(ctx context.Context, method string, start time.Time, err error) {
	code := status.Code(err)
	elapsed := time.Since(start)
	if s.metrics != nil {
		l := prometheus.Labels{"method": methodLabel(method), "code": code.String()}
		s.metrics.requests.With(l).Inc()
		s.metrics.latency.With(l).Observe(elapsed.Seconds())
	}
	level := slog.LevelDebug
	switch code {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		level = slog.LevelError
	}
	if s.log.Enabled(ctx, level) {
		attrs := []slog.Attr{slog.String("method", method), slog.String("code", code.String()), slog.Duration("elapsed", elapsed)}
		if err != nil {
			attrs = append(attrs, slog.String("err", err.Error()))
		}
		s.log.LogAttrs(ctx, level, "grpc request", attrs...)
	}
}

// recovered turns a handler panic into codes.Internal so one bad request cannot take the node's
// cache (and every engine sequence holding refs in it) down with it. Validation should make this
// unreachable; FuzzValidate checks that it does.
func (s *Server) recovered(ctx context.Context, method string, p any) error {
	s.log.LogAttrs(ctx, slog.LevelError, "grpc handler panic", slog.String("method", method),
		slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
	return status.Errorf(codes.Internal, "%s: internal error", method)
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, s.recovered(ctx, info.FullMethod, p)
		}
		s.observe(ctx, info.FullMethod, start, err)
	}()
	return handler(ctx, req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	ctx := ss.Context()
	defer func() {
		if p := recover(); p != nil {
			err = s.recovered(ctx, info.FullMethod, p)
		}
		s.observe(ctx, info.FullMethod, start, err)
	}()
	return handler(srv, ss)
}
