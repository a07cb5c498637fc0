package frontdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/openai"
)

// relayBufBytes is the copy buffer: 32 KiB, io.Copy's size; an SSE chunk is a few hundred bytes,
// so each Read returns whatever chunks have arrived and is flushed at once.
const relayBufBytes = 32 << 10

// maxSSELineBytes bounds one buffered SSE line while scanning for usage and the first token: an
// event longer than 1 MiB is relayed but not inspected.
const maxSSELineBytes = 1 << 20

// observer watches a relayed response for what the router measures: the time of the first output
// token (streams) and the engine's cached_tokens (the final usage chunk of a stream, or the usage
// of a JSON body). It never changes a byte.
type observer struct {
	stream  bool
	start   time.Time
	onFirst func() // called once, at the first output token

	ttft   time.Duration // 0 until the first token
	cached int           // -1 until known
	done   bool          // saw data: [DONE]

	line     []byte // the SSE line being assembled
	skipLine bool   // the current line overflowed maxSSELineBytes
	body     []byte // non-streaming: the body, up to maxUsageScanBytes
	bodyFull bool
}

func newObserver(stream bool, start time.Time, cached int, onFirst func()) *observer {
	return &observer{stream: stream, start: start, cached: cached, onFirst: onFirst}
}

// write inspects p, a piece of the response as relayed.
func (o *observer) write(p []byte) {
	if !o.stream {
		if !o.bodyFull {
			if len(o.body)+len(p) > maxUsageScanBytes {
				o.bodyFull, o.body = true, nil
			} else {
				o.body = append(o.body, p...)
			}
		}
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if !o.skipLine {
			if len(o.line)+len(part) > maxSSELineBytes {
				o.skipLine, o.line = true, o.line[:0]
			} else {
				o.line = append(o.line, part...)
			}
		}
		if i < 0 {
			return
		}
		if !o.skipLine {
			o.event(bytes.TrimSuffix(o.line, []byte("\r")))
		}
		o.line, o.skipLine = o.line[:0], false
		p = p[i+1:]
	}
}

// event handles one complete SSE line.
func (o *observer) event(line []byte) {
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	payload = bytes.TrimSpace(payload)
	if bytes.Equal(payload, []byte("[DONE]")) {
		o.done = true
		return
	}
	if o.ttft == 0 && hasOutput(payload) {
		o.ttft = max(time.Since(o.start), 1)
		if o.onFirst != nil {
			o.onFirst()
		}
	}
	if bytes.Contains(payload, []byte(`"cached_tokens"`)) {
		if c, ok := cachedTokens(payload); ok {
			o.cached = c
		}
	}
}

// finish completes the observation of a non-streaming body.
func (o *observer) finish() {
	if !o.stream && !o.bodyFull && o.cached < 0 {
		if c, ok := cachedTokens(o.body); ok {
			o.cached = c
		}
	}
}

// hasOutput reports whether an SSE chunk carries output text (completions' text or chat's delta
// content); the role-only first chunk of a chat stream does not.
func hasOutput(payload []byte) bool {
	if !bytes.Contains(payload, []byte(`"text"`)) && !bytes.Contains(payload, []byte(`"content"`)) {
		return false
	}
	var c struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	for _, ch := range c.Choices {
		if ch.Text != "" || ch.Delta.Content != "" {
			return true
		}
	}
	return false
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens from a response or chunk.
func cachedTokens(b []byte) (int, bool) {
	var r struct {
		Usage *struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &r) != nil || r.Usage == nil || r.Usage.Details == nil || r.Usage.Details.Cached == nil {
		return 0, false
	}
	return *r.Usage.Details.Cached, true
}

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
func relay(w http.ResponseWriter, body io.Reader, first, buf []byte, o *observer, onRead func()) error {
	rc := http.NewResponseController(w)
	put := func(p []byte) error {
		onRead()
		o.write(p)
		if _, werr := w.Write(p); werr != nil {
			return errClientGone
		}
		if o.stream {
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
			o.finish()
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
