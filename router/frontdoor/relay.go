package frontdoor

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// relayBufBytes is the copy buffer: 32 KiB, io.Copy's size; an SSE chunk is a few hundred bytes,
// so each Read returns whatever chunks have arrived and is flushed at once.
const relayBufBytes = 32 << 10

// relayBufs pools copy buffers: a 32 KiB allocation per request was most of the front door's
// garbage (BenchmarkProxy).
var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufBytes); return &b }}

// errClientGone marks a relay that stopped because writing to the client failed.
var errClientGone = errors.New("client went away")

// relay copies first (bytes already read from body, in buf or not) and then body to w as it
// arrives through buf, flushing after every read when streaming, and shows every piece to o;
// onRead (the idle watchdog's reset) is called after every read that returned bytes. It returns
// errClientGone when the client stopped reading, the upstream's read error when the upstream
// broke off, and nil at the upstream's clean end.
func relay(w http.ResponseWriter, body io.Reader, first, buf []byte, o *requests.Observer, onRead func()) error {
	rc := http.NewResponseController(w)
	put := func(p []byte) error {
		onRead()
		o.Write(p)
		if _, werr := w.Write(p); werr != nil {
			return errClientGone
		}
		if o.Stream() {
			if ferr := rc.Flush(); ferr != nil {
				return errClientGone
			}
		}
		return nil
	}
	if len(first) > 0 {
		if err := put(first); err != nil {
			return err
		}
	}
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if perr := put(buf[:n]); perr != nil {
				return perr
			}
		}
		if errors.Is(err, io.EOF) {
			o.Finish()
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// writeSSEError ends a stream that broke off upstream with an OpenAI-shaped error event, the way
// engines report a failure after streaming began.
func writeSSEError(w http.ResponseWriter, code, msg string) {
	b, _ := json.Marshal(openai.NewErrorBody(http.StatusServiceUnavailable, code, "", msg))
	_, _ = io.WriteString(w, "data: ")
	_, _ = w.Write(b)
	_, _ = io.WriteString(w, "\n\n")
	_ = http.NewResponseController(w).Flush()
}
