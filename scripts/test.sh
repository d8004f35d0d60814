#!/usr/bin/env bash
# The test command: installs what is missing, builds once, runs every test.
# End-to-end tests start real Envoy, redis-server, the state service and simulated workers
# on loopback ports; they need the release .wasm built first.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
export KVROUTE_ROOT="$root"
export PATH="$root/.cache/venv/bin:$PATH"
cargo build --workspace --all-targets
./wasm-build.sh
# The filter must not panic inside Envoy: its crate denies unwrap/expect/panic outside tests.
cargo clippy -p kvroute-filter --target wasm32-wasip1 --release
cargo test --workspace
