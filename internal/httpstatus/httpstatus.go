// Package httpstatus records the status code an http.Handler wrote, for metrics and request logs.
// Writer wraps a ResponseWriter; Unwrap lets http.ResponseController reach the connection's Flush,
// so streaming (SSE) handlers work through it.
package httpstatus

import "net/http"

// ClientClosed is reported when nothing was written: the client went away first (nginx's 499).
const ClientClosed = 499

// Writer records the first status written through it.
type Writer struct {
	http.ResponseWriter
	code   int
	broken string // why the response was cut after it began; "" when it was not
}

// Wrap returns a Writer over w.
func Wrap(w http.ResponseWriter) *Writer { return &Writer{ResponseWriter: w} }

// WriteHeader records code (the first one only) and passes it on.
func (s *Writer) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200 and passes b on.
func (s *Writer) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap is for http.ResponseController.
func (s *Writer) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// MarkBroken records that the response was cut after its status was sent (a stream broken off
// mid-way), with a short cause for metrics; the status stays what the client saw.
func (s *Writer) MarkBroken(cause string) { s.broken = cause }

// Broken is the cause given to MarkBroken, "" when the response was not cut.
func (s *Writer) Broken() string { return s.broken }

// Status is the recorded code, ClientClosed when nothing was written.
func (s *Writer) Status() int {
	if s.code == 0 {
		return ClientClosed
	}
	return s.code
}
