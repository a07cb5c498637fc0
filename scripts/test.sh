#!/usr/bin/env bash
# The project's test command (README "run the tests"; .ci/run calls it): format, vet, generated
# code up to date, then every package's tests with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

# Issue 11: the KV-event conformance publisher (node/kvevents/testdata/conformance_pub.py) runs on
# Debian's /usr/bin/python3 with python3-zmq and python3-msgpack; install them in CI when missing.
if [ "${CI:-}" = "true" ] && ! /usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null; then
  echo "== apt-get install python3-zmq python3-msgpack (issue 11)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 python3-zmq python3-msgpack >/dev/null
fi

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
