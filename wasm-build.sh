#!/usr/bin/env bash
# Builds the kvroute proxy-wasm filter (filter/) to a .wasm module for Envoy / ngx_wasm_module.
#   - adds the rustup target wasm32-wasip1 if it is missing
#   - cargo build --release for wasm32-wasip1
#   - runs wasm-opt -Oz when binaryen is installed (optional; the module works without it)
#   - prints the artifact path and size
# Env: CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
cd "$root"

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "wasm-build: rustup target add wasm32-wasip1" >&2
  rustup target add wasm32-wasip1
fi

cargo build -p kvroute-filter --release --target wasm32-wasip1

out="${CARGO_TARGET_DIR:-$root/target}/wasm32-wasip1/release/kvroute_filter.wasm"
if command -v wasm-opt >/dev/null 2>&1; then
  wasm-opt -Oz --strip-debug "$out" -o "$out.opt" && mv "$out.opt" "$out"
  echo "wasm-build: optimized with $(wasm-opt --version)" >&2
fi
size=$(wc -c <"$out")
echo "$out"
echo "size: $size bytes ($((size / 1024)) KiB)" >&2
