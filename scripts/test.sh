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
# Nothing that runs inside Envoy's Wasm VM may panic: the filter and the core it links both
# deny unwrap/expect/panic/indexing outside tests.
cargo clippy -p kvroute-core -p kvroute-filter --target wasm32-wasip1 --release
cargo test --workspace
