package httpstatus

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestWriter(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing written", func(http.ResponseWriter) {}, ClientClosed},
		{"implicit 200", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, http.StatusOK},
		{"first code wins", func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot); w.WriteHeader(http.StatusOK) }, http.StatusTeapot},
	} {
		rec := httptest.NewRecorder()
		sw := Wrap(rec)
		c.write(sw)
		if sw.Status() != c.want {
			t.Errorf("%s: status %d, want %d", c.name, sw.Status(), c.want)
		}
	}
	rec := httptest.NewRecorder()
	if err := http.NewResponseController(Wrap(rec)).Flush(); err != nil || !rec.Flushed {
		t.Fatalf("flush through the wrapper: %v", err)
	}
}
