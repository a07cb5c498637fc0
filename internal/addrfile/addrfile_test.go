package addrfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "addrs")
	if err := Write(p, "grpc=127.0.0.1:1", "http=127.0.0.1:2"); err != nil {
		t.Fatal(err)
	}
	m, err := Read(p)
	if err != nil || m["grpc"] != "127.0.0.1:1" || m["http"] != "127.0.0.1:2" || len(m) != 2 {
		t.Fatalf("Read = %v, %v", m, err)
	}
	if err := os.WriteFile(p, []byte("grpc=x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("partial line: %v", err)
	}
	if err := os.WriteFile(p, []byte("grpc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil {
		t.Fatal("field without = accepted")
	}
}
