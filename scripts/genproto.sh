#!/usr/bin/env bash
# genproto.sh regenerates the Go code for proto/prefixmesh/v1/*.proto (or only the .proto files
# named as arguments) into proto/prefixmesh/v1/, next to the sources (paths=source_relative).
#
# The plugins are pinned so that every engineer and CI produce byte-identical output:
#   protoc-gen-go       the google.golang.org/protobuf version in go.mod (runtime and generator
#                       must agree, and go.mod is the single place that version is chosen);
#   protoc-gen-go-grpc  PROTOC_GEN_GO_GRPC_VERSION below.
# Both are installed into <repo>/.cache/bin (gitignored), never into the user's GOBIN. protoc
# itself comes from Debian's protobuf-compiler package; it is installed when missing and apt is
# available (as root in CI images).
#
# Usage: scripts/genproto.sh [proto/prefixmesh/v1/foo.proto ...]
set -euo pipefail

PROTOC_GEN_GO_GRPC_VERSION=v1.5.1
# The protoc that produced the committed code (Debian bookworm's protobuf-compiler). Its version
# is written into every .pb.go header, so another protoc makes checkproto.sh report a diff.
EXPECTED_PROTOC_VERSION=3.21.12

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bin="$repo/.cache/bin"
mkdir -p "$bin"

die() { echo "genproto: $*" >&2; exit 1; }

# protoc: from Debian when missing.
if ! command -v protoc >/dev/null 2>&1; then
	command -v apt-get >/dev/null 2>&1 || die "protoc not found and apt-get unavailable; install protobuf-compiler"
	sudo=""
	if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
	echo "genproto: installing protobuf-compiler" >&2
	$sudo apt-get update -qq >&2
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >&2
fi

protoc_version="$(protoc --version | awk '{print $2}')"
if [ "$protoc_version" != "$EXPECTED_PROTOC_VERSION" ]; then
	echo "genproto: warning: protoc $protoc_version, expected $EXPECTED_PROTOC_VERSION; generated headers will differ" >&2
fi

# install_plugin NAME PACKAGE VERSION: go install PACKAGE@VERSION into .cache/bin unless the
# binary there was already built from exactly that version (recorded in a stamp file).
install_plugin() {
	local name="$1" pkg="$2" ver="$3" stamp="$bin/.$1.version"
	if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$ver" ]; then
		return
	fi
	echo "genproto: installing $pkg@$ver" >&2
	GOBIN="$bin" GOFLAGS=-mod=mod go install "$pkg@$ver"
	echo "$ver" >"$stamp"
}

protobuf_version="$(go list -m -f '{{.Version}}' google.golang.org/protobuf)"
[ -n "$protobuf_version" ] || die "google.golang.org/protobuf not found in go.mod"
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$protobuf_version"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

if [ "$#" -gt 0 ]; then
	files=("$@")
else
	shopt -s nullglob
	files=(proto/prefixmesh/v1/*.proto)
	shopt -u nullglob
fi
[ "${#files[@]}" -gt 0 ] || die "no .proto files under proto/prefixmesh/v1"

# Import paths are relative to proto/, so "prefixmesh/v1/x.proto" imports resolve and the
# generated files land beside their sources.
rel=()
for f in "${files[@]}"; do
	case "$f" in
	"$repo"/*) f="${f#"$repo"/}" ;;
	esac
	case "$f" in
	proto/*.proto) rel+=("${f#proto/}") ;;
	*) die "$f: expected a path under proto/ ending in .proto" ;;
	esac
	[ -f "proto/${rel[-1]}" ] || die "$f: no such file"
done

PATH="$bin:$PATH" protoc \
	--proto_path=proto \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go_out=proto --go_opt=paths=source_relative \
	--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	"${rel[@]}"

echo "genproto: generated Go for ${rel[*]} (protoc $protoc_version, protoc-gen-go $protobuf_version, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION)" >&2
