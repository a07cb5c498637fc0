#!/usr/bin/env bash
# The project's test command (README "run the tests"; .ci/run calls it): format, vet, generated
# code up to date, then every package's tests with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$bad" ]; then
  echo "gofmt would change:"; echo "$bad"; exit 1
fi

echo "== go vet"
go vet ./...

if [ -x scripts/checkproto.sh ]; then
  echo "== generated protobuf code is up to date"
  scripts/checkproto.sh
fi

if [ -x scripts/checkchart.sh ]; then
  echo "== helm chart"
  scripts/checkchart.sh
fi

echo "== go test -race"
go test -race -count=1 -timeout 30m ./...
