#!/usr/bin/env bash
# checkproto.sh regenerates every proto/prefixmesh/v1/*.proto into the tree and fails, listing the
# files, if the committed generated Go (or anything else under proto/) differs from what the
# pinned generators produce. CI runs it; fix a failure with scripts/genproto.sh and commit.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

"$repo/scripts/genproto.sh"

# Generated files whose .proto is gone are stale too.
stale=()
shopt -s nullglob
for gen in proto/prefixmesh/v1/*.pb.go; do
	base="${gen%_grpc.pb.go}"
	base="${base%.pb.go}"
	[ -f "$base.proto" ] || stale+=("$gen")
done
shopt -u nullglob
if [ "${#stale[@]}" -gt 0 ]; then
	echo "checkproto: generated files without a .proto (delete them):" >&2
	printf '  %s\n' "${stale[@]}" >&2
	exit 1
fi

changed="$(git status --porcelain --untracked-files=all -- proto/)"
if [ -n "$changed" ]; then
	echo "checkproto: generated code under proto/ is out of date or uncommitted:" >&2
	echo "$changed" >&2
	echo "checkproto: run scripts/genproto.sh and commit the result" >&2
	exit 1
fi
echo "checkproto: proto/ is up to date" >&2
