package routerd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeDrainsStreams: when serve's context ends (SIGTERM), a completion streaming through
// the front door runs to its end, and the router exits well before --drain-timeout even though
// a node agent holds a Pins Watch stream open (the drain ends it).
func TestServeDrainsStreams(t *testing.T) {
	const drainTimeout = 20 * time.Second
	c := startCluster(t, []nodeSpec{{id: "node-0", kvBlocks: 256, decodePerSec: 40}}, "--drain-timeout=20s")
	c.eventually("node-0 follows the pin table", func() error {
		return metricIs(c.nodes["node-0"]["http"], "prefixmesh_node_pins_connected", "1")
	})
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": prompt(5000, 40), "max_tokens": 40, "stream": true})
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.router["http"]+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() { // the first event: the stream is in flight (40 tokens at 40/s: about a second)
		t.Fatalf("no first event: %v", sc.Err())
	}
	start := time.Now()
	stopped := make(chan time.Duration, 1)
	go func() {
		c.stopRouter()
		stopped <- time.Since(start)
	}()
	var last string
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			last = line
		}
	}
	if err := sc.Err(); err != nil || last != "data: [DONE]" {
		t.Fatalf("stream cut by the drain: last line %q, %v", last, err)
	}
	select {
	case took := <-stopped:
		if took >= drainTimeout {
			t.Fatalf("drain took %v, the whole --drain-timeout: something held it", took)
		}
		t.Logf("router drained in %v", took)
	case <-time.After(clusterWait):
		t.Fatal("router did not stop")
	}
}
