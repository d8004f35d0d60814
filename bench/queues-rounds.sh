#!/usr/bin/env bash
# kvroute against the peers, each with and without its router queue, on the production-shaped
# trace: ROUNDS rounds, every variant once per round (each variant that needs other stack
# settings is its own run), then one table with the medians over the rounds.
#
#   bench/queues-rounds.sh SPEED ROUNDS OUT     e.g. bench/queues-rounds.sh 1.25 3 bench/results/queues-1.25x
#
# VARIANTS picks the runs of a round (default all: queue none flow_control router_queue
# sglang_queue); FIRST_ROUND numbers the rounds from another start, so that rounds run later
# merge with earlier ones (the table is made from every report in the runs' folder).
#
# Needs the release binaries (cargo build --release -p kvroute-state -p kvroute-sim -p
# kvroute-bench; ./wasm-build.sh), the test fixtures (scripts/setup.sh) and the real SGLang
# router (.cache/venv/bin/pip install sglang-router). ~48 min a round on 2 cores.
set -euo pipefail
speed=${1:?speed}; rounds=${2:?rounds}; out=${3:?out dir}
cd "$(dirname "$0")/.."
runs=bench/results/tmp/$(basename "$out")   # each run's own report, logs and stack (gitignored)
export KVROUTE_ROOT=$PWD PATH=$PWD/.cache/venv/bin:$PATH
run() { # NAME ARGS...: one run of the trace at $speed into $runs/rROUND-NAME
  local name=$1; shift
  target/release/kvroute-bench stack --workload trace --trace bench/traces/production.jsonl \
    --max-input-tokens 32768 --output-tokens 4096 --time-scale 0.25 --workers 4 --max-duration-s 150 \
    --speed "$speed" --prompt-mode chat --tokenizer-dir "$(cat .cache/tokenizer-dir)" \
    --sglang-router .cache/venv/bin/sglang-router --no-progress --out "$runs/r$round-$name" "$@" \
    > "$runs/r$round-$name.log" 2>&1 || echo "  $name failed: see $runs/r$round-$name.log"
  grep -E '^  [a-z]' "$runs/r$round-$name.log" || true
}
# The peers' queues as their sources and docs define them (bench/README.md, "Queues against
# queues"): llm-d's flow control, Dynamo's router queue, the real SGLang router's own.
flow_control=(--scheduling-set max_engine_waiting=6 --scheduling-set max_kv_usage=0.8 --scheduling-set max_unstarted=0
  --scheduling-set 'wait_when="all_saturated"' --scheduling-set 'order="fifo"')
router_queue=(--scheduling-set max_unstarted_tokens=2049 --scheduling-set max_engine_waiting=0 --scheduling-set max_unstarted=0
  --scheduling-set max_kv_usage=1.0 --scheduling-set 'wait_when="all_saturated"' --scheduling-set 'order="fifo"')
variants=${VARIANTS:-queue none flow_control router_queue sglang_queue}
first=${FIRST_ROUND:-1}
mkdir -p "$out" "$runs"
for round in $(seq "$first" $((first + rounds - 1))); do
  echo "round $round"
  for v in $variants; do
    case $v in
      queue) run queue --scheduling --variant queue --policies kvroute ;;
      none) run none --policies kvroute,sglang_router,llmd_default,dynamo_kv ;;
      flow_control) run flow_control --scheduling --variant flow_control "${flow_control[@]}" --policies llmd_default ;;
      router_queue) run router_queue --scheduling --variant router_queue "${router_queue[@]}" --policies dynamo_kv ;;
      sglang_queue) run sglang_queue --variant queue --policies sglang_router --sglang-router-arg=--max-concurrent-requests --sglang-router-arg=32 ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
  done
done
# Every round's reports, in round order (a round's runs in the order they ran).
mapfile -t reports < <(printf "%s\n" "$runs"/r*/report.json | sort -V)
target/release/kvroute-bench report "${reports[@]}" --out "$out"
