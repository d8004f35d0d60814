#!/usr/bin/env bash
# kvroute demo: on a fresh machine, installs what is missing, builds the release binaries
# and the Wasm filter, then lets `kvroute-bench stack` start the state service (in-memory
# store), 4 simulated vLLM workers and Envoy with the filter on loopback ports, send
# shared-prefix chat traffic with the `random` policy and then `kvroute`, print the
# comparison and the plot's path, and stop everything it started (also on Ctrl-C:
# kvroute-bench owns every child in its own process group).
#
#   scripts/demo.sh --serve   starts the same stack and leaves it running for your own
#                             clients (prints the SDK base URLs) until Ctrl-C
#
# Env:
#   KVROUTE_DEMO_SECONDS  rough total run time (default 150; two passes plus drain)
#   KVROUTE_DEMO_OUT      results directory (default bench/results/demo)
#   KVROUTE_DEMO_SCALE    the sims' time scale (default 0.5: twice as fast as the GPU)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
seconds="${KVROUTE_DEMO_SECONDS:-150}"
out="${KVROUTE_DEMO_OUT:-bench/results/demo}"
scale="${KVROUTE_DEMO_SCALE:-0.5}"
serve=false
case "${1:-}" in
  --serve) serve=true ;;
  "") ;;
  *) echo "usage: scripts/demo.sh [--serve]" >&2; exit 2 ;;
esac

scripts/setup.sh
echo "demo: building release binaries and the filter (the first time takes several minutes)"
cargo build --release -p kvroute-state -p kvroute-sim -p kvroute-bench
./wasm-build.sh

# A real tokenizer makes chat prompts the token counts they say; without one the sims
# fall back to one token per byte (the demo still works, prompts are just ~5x longer).
tok_args=()
if tok_dir="$(tokenize/fetch-tokenizer.sh 2>/dev/null)" && [ -f "$tok_dir/tokenizer.json" ]; then
  tok_args=(--tokenizer-dir "$tok_dir")
else
  echo "demo: no tokenizer fixture (tokenize/fetch-tokenizer.sh failed); using byte fallback"
fi

if $serve; then
  exec target/release/kvroute-bench up --workers 4 --time-scale "$scale" "${tok_args[@]}"
fi

# Offered load in simulated requests/s; each pass sends for about 40% of the budget in
# simulated time, the rest is drain, resets and start-up.
rate=1.6
requests=$(awk -v s="$seconds" -v r="$rate" -v k="$scale" 'BEGIN { n = int(s * 0.4 / 2 * r / k); if (n < 24) n = 24; print n }')
echo "demo: $requests shared-prefix chat requests per policy at $rate req/s (time scale $scale)"
exec target/release/kvroute-bench stack \
  --workload shared-prefix --prompt-mode chat \
  --groups 16 --users 8 --prefix-tokens 6000 --question-tokens 200 --output-tokens 150 \
  --requests "$requests" --rate "$rate" --policies random,kvroute \
  --workers 4 --time-scale "$scale" "${tok_args[@]}" \
  --out "$out"
