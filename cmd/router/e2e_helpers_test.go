package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// startE2ECluster starts a demo cluster of real daemons for an end-to-end test with the
// prefixmesh policy, its daemons' logs in the test's temporary directory, and returns it with a
// context bounding the test (5 minutes); both end with the test.
func startE2ECluster(t *testing.T, cfg demoConfig) (context.Context, *demoCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	logs, err := os.Create(filepath.Join(dir, "daemons.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logs.Close() })
	cl, err := startDemoCluster(ctx, cfg, "prefixmesh", filepath.Join(dir, "cluster"), logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.stop)
	return ctx, cl
}
