package frontdoor

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The pooled buffer stays with the body until the handler and every open reader let go.
func TestReqBodyReleasedByLastHolder(t *testing.T) {
	want := bytes.Repeat([]byte("x"), 5000)
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(want))
	rb, err := readBodyPooled(httptest.NewRecorder(), r, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rb.buf == nil || !bytes.Equal(rb.b, want) {
		t.Fatalf("body not read into a pooled buffer: pooled=%v len=%d", rb.buf != nil, len(rb.b))
	}
	rd := rb.open()
	rb.release() // the handler returns while the Transport still holds the reader
	if rb.buf == nil {
		t.Fatal("buffer returned to the pool while a reader still holds it")
	}
	got, _ := io.ReadAll(rd)
	if !bytes.Equal(got, want) {
		t.Fatal("reader saw a different body")
	}
	_ = rd.Close()
	_ = rd.Close() // a second Close must not release twice
	if rb.buf != nil || rb.refs.Load() != 0 {
		t.Fatalf("buffer not released after the last holder: refs=%d", rb.refs.Load())
	}
}

// A short body (Content-Length less than sent) is an error, not a truncated prompt.
func TestReqBodyShort(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader([]byte("abc")))
	r.ContentLength = 10
	if _, err := readBodyPooled(httptest.NewRecorder(), r, 1<<20, nil); err == nil {
		t.Fatal("a body shorter than its Content-Length was accepted")
	}
}

// A Close from another goroutine during Reads (as the Transport may do) is safe under the race
// detector, and Reads after it see the end.
func TestReqBodyConcurrentClose(t *testing.T) {
	rb := newReqBody(bytes.Repeat([]byte("y"), 1<<16))
	rd := rb.open()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			if _, err := rd.Read(buf); err != nil {
				return
			}
		}
	}()
	_ = rd.Close()
	<-done
	if n, err := rd.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("Read after Close = %d, %v; want 0, EOF", n, err)
	}
	rb.release()
	if rb.refs.Load() != 0 {
		t.Fatalf("refs = %d after every holder let go", rb.refs.Load())
	}
}

// newReqBody holds b (not pooled) with one reference, the caller's.
func newReqBody(b []byte) *reqBody {
	rb := &reqBody{b: b}
	rb.refs.Store(1)
	return rb
}
