package requests

import (
	"bytes"
	"encoding/json"
	"time"
)

// maxUsageScanBytes bounds how much of a non-streaming response is kept to read its usage when
// the engine sent no X-Prefixmesh-Cached-Tokens header: 1 MiB holds any completion's JSON
// envelope; beyond that the response is relayed without measuring it.
const maxUsageScanBytes = 1 << 20

// maxSSELineBytes bounds one buffered SSE line while scanning for usage and the first token: an
// event longer than 1 MiB is relayed but not inspected.
const maxSSELineBytes = 1 << 20

// Observer watches a relayed response for what the router measures: the time of the first output
// token (streams) and the engine's cached_tokens (the final usage chunk of a stream, or the usage
// of a JSON body). It never changes a byte. The front door's relay and a gateway pick's
// response (GatewayPick) both show it the bytes as they pass. Not safe for concurrent use.
type Observer struct {
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

// NewObserver watches a response that is an SSE stream (stream) or a JSON body, to a request
// that arrived at start; cached is the engine's cached_tokens header (-1: none, read the
// usage); onFirst, when not nil, is called once at the first output token.
func NewObserver(stream bool, start time.Time, cached int, onFirst func()) *Observer {
	return &Observer{stream: stream, start: start, cached: cached, onFirst: onFirst}
}

// Stream reports whether the response is an SSE stream.
func (o *Observer) Stream() bool { return o.stream }

// TTFT is the time from the request's arrival to the first output token, 0 until it came (and
// for a JSON body).
func (o *Observer) TTFT() time.Duration { return o.ttft }

// Cached is the engine's cached_tokens, -1 until known.
func (o *Observer) Cached() int { return o.cached }

// Done reports whether the stream ended with data: [DONE].
func (o *Observer) Done() bool { return o.done }

// Write inspects p, a piece of the response as relayed.
func (o *Observer) Write(p []byte) {
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
func (o *Observer) event(line []byte) {
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

// Finish completes the observation of a non-streaming body, once it has all been written.
func (o *Observer) Finish() {
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
	if out, ok := quickOutput(payload); ok {
		return out
	}
	return decodeOutput(payload)
}

// decodeOutput is hasOutput's answer as encoding/json decodes the chunk (quickOutput's reference).
func decodeOutput(payload []byte) bool {
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

// CachedTokens reads usage.prompt_tokens_details.cached_tokens from a JSON response or one SSE
// chunk's payload: a disaggregated request's prefill leg's answer says what its cache saved.
func CachedTokens(b []byte) (int, bool) { return cachedTokens(b) }

// cachedTokens reads usage.prompt_tokens_details.cached_tokens from a response or chunk.
func cachedTokens(b []byte) (int, bool) {
	if n, found, ok := quickCached(b); ok {
		return n, found
	}
	return decodeCached(b)
}

// decodeCached is cachedTokens' answer as encoding/json decodes b (quickCached's reference).
func decodeCached(b []byte) (int, bool) {
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
