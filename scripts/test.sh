#!/usr/bin/env bash
# The test command: installs what is missing, builds once, runs every test.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
export KVROUTE_ROOT="$root"
export PATH="$root/.cache/venv/bin:$PATH"
cargo build --workspace --all-targets
cargo build -p kvroute-core --target wasm32-wasip1
cargo test --workspace
