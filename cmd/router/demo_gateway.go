package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/loadgen"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
)

// replayGateway replays reqs through a fake gateway (router/extproc/fakegw) in front of c's
// endpoint picker, as an Envoy with the reference configuration (deploy/envoy/envoy.yaml) would
// send them: the gateway asks the picker over ext_proc and forwards to the engine it names. The
// client never sees the router's estimate, so the estimate columns come from the picker's own
// closed loop (its prefixmesh_extproc_estimate_* metrics).
func replayGateway(ctx context.Context, cfg demoConfig, c *demoCluster, name string, reqs []loadgen.Request, stdout io.Writer) (loadgen.Summary, error) {
	if c.eppAddr == "" {
		return loadgen.Summary{}, errors.New("the router serves no endpoint picker")
	}
	cc, err := grpc.NewClient(c.eppAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return loadgen.Summary{}, err
	}
	defer cc.Close()
	gw := fakegw.New(extprocv3.NewExternalProcessorClient(cc), fakegw.Config{
		RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadgen.Summary{}, err
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(stdout, "[%s] fake gateway on http://%s, endpoint picker %s\n", name, ln.Addr(), c.eppAddr)
	s, err := replay(ctx, cfg, c, name, "http://"+ln.Addr().String(), reqs, stdout)
	if err != nil {
		return s, err
	}
	// The picker ends a request once it has echoed the response's last chunk: wait for the
	// count to reach what was replayed (bounded) before reading it.
	want := float64(s.Requests - s.Errors)
	var fams map[string]*dto.MetricFamily
	err = pollUntil(ctx, 10*time.Second, c, func() bool {
		fams, err = scrapeMetrics(ctx, http.DefaultClient, "http://"+c.httpAddr+"/metrics")
		return err == nil && single(fams, "prefixmesh_extproc_estimate_compared_total") >= want
	})
	if err != nil {
		return s, fmt.Errorf("read the endpoint picker's metrics: %w", err)
	}
	if n := single(fams, "prefixmesh_extproc_estimate_compared_total"); n > 0 {
		s.EstimateExact = single(fams, "prefixmesh_extproc_estimate_exact_total") / n
		s.EstimateCompared = int(n)
		s.EstimateMAE = firstHistogram(fams["prefixmesh_extproc_estimate_abs_error_tokens"]).GetSampleSum() / n
	}
	return s, nil
}
