#!/usr/bin/env bash
# Fails when a tracked file outside data/ is over 1 MiB: build outputs and fetched artefacts belong
# in .cache/ or dist/ (git-ignored), and data the tests need lives under data/ with its source.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
bad=0
while IFS= read -r -d '' f; do
  case "$f" in data/*) continue ;; esac
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$limit" ]; then
    echo "tracked file over 1 MiB outside data/: $f ($size bytes)"
    bad=1
  fi
done < <(git ls-files -z)
exit "$bad"
