package requests

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// newTransport is the pooled transport toward engines. Compression is off so bytes pass through
// unchanged, and environment proxies are ignored: engines are in-cluster addresses.
func newTransport(cfg *Config) *http.Transport {
	d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return copyConn{c}, nil
		},
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		TLSClientConfig:     cfg.UpstreamTLS,
		TLSHandshakeTimeout: cfg.ConnectTimeout,
		ForceAttemptHTTP2:   cfg.UpstreamTLS != nil,
		DisableCompression:  true,
	}
}

// copyBufBytes is copyConn's buffer: 32 KiB, io.Copy's size.
const copyBufBytes = 32 << 10

// copyBufs pools copyConn's buffers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufBytes); return &b }}

// copyConn is an upstream connection whose ReadFrom (how net/http writes a request body) copies
// through a pooled buffer: net.TCPConn's generic ReadFrom allocates a new buffer of up to 32 KiB
// for every request body it cannot splice, and a request body never can be.
type copyConn struct{ net.Conn }

func (c copyConn) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{c.Conn}, r, *bp)
}

// writerOnly hides every method of its writer but Write (io.CopyBuffer would otherwise call
// the connection's own ReadFrom).
type writerOnly struct{ io.Writer }
