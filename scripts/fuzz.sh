#!/usr/bin/env bash
# Fuzzes every parser that sees untrusted bytes (the cargo-fuzz crate in fuzz/), one target at
# a time, each for a bounded time, and prints per target the executions, wall time and crashes.
# Not part of the test suite (scripts/test.sh); see the README's "Fuzzing" section.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET (or FUZZ_SECONDS) defaults to 300. Targets default to all of them:
#   request_body kv_events pick_report prometheus chat_template
# Environment:
#   FUZZ_SANITIZER  none (default) or address: cargo fuzz's -Zsanitizer; `none` keeps
#                   libFuzzer's coverage guidance, only ASan is left out
#   FUZZ_TIMEOUT    seconds one input may take before it counts as a crash (default 10)
#   FUZZ_RSS_MB     memory limit of the fuzzing process (default 2048)
#   FUZZ_ARGS       extra libFuzzer flags (e.g. -runs=1000 or -seed=1)
#
# Every run continues the target's corpus in fuzz/corpus/<target> (seeded from the committed
# fuzz/seeds/<target>); crashes land in fuzz/artifacts/<target>/, the libFuzzer log in
# fuzz/logs/<target>/fuzz-0.log (all three gitignored). Builds use rust stable with
# RUSTC_BOOTSTRAP=1 (cargo fuzz needs -Z flags), debug assertions and overflow checks on.
# Fuzzing runs under `nice -n 19`, one libFuzzer job with one worker. Exit status: 1 when any
# target crashed (or its run failed), 0 otherwise.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$root/fuzz"
seconds=${1:-${FUZZ_SECONDS:-300}}
[[ $# -gt 0 ]] && shift
all=(request_body kv_events pick_report prometheus chat_template)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")
sanitizer=${FUZZ_SANITIZER:-none}
timeout_s=${FUZZ_TIMEOUT:-10}
rss_mb=${FUZZ_RSS_MB:-2048}

[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "seconds per target must be a positive integer, got '$seconds'" >&2; exit 2; }
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
  exit 2
fi

# Per-target libFuzzer settings: input size limit and dictionary.
max_len() {
  case $1 in
    request_body | chat_template) echo 16384 ;;
    *) echo 4096 ;;
  esac
}
dict() {
  case $1 in
    request_body) echo "$fuzz/dicts/json_request.dict" ;;
    chat_template) echo "$fuzz/dicts/chat_template.dict" ;;
    kv_events) echo "$fuzz/dicts/kv_events.dict" ;;
    prometheus) echo "$fuzz/dicts/prometheus.dict" ;;
  esac
}

export RUSTC_BOOTSTRAP=1
echo "== building ${targets[*]} (sanitizer: $sanitizer)"
# `cargo fuzz build` takes one target or none (= all of them).
build_target=()
[[ ${#targets[@]} -eq 1 ]] && build_target=("${targets[0]}")
(cd "$fuzz" && nice -n 19 cargo fuzz build -O -a --sanitizer "$sanitizer" "${build_target[@]}")
triple=$(rustc -vV | sed -n 's/^host: //p')
bin_dir="$fuzz/target/$triple/release"

status=0
results=()
for t in "${targets[@]}"; do
  bin="$bin_dir/$t"
  [[ -x $bin ]] || { echo "no binary $bin (build failed?)" >&2; exit 1; }
  corpus="$fuzz/corpus/$t"
  artifacts="$fuzz/artifacts/$t"
  logs="$fuzz/logs/$t"
  mkdir -p "$corpus" "$artifacts" "$logs"
  if [[ -d $fuzz/seeds/$t ]]; then
    cp -n "$fuzz/seeds/$t"/* "$corpus"/ 2>/dev/null || true
  fi
  rm -f "$logs"/fuzz-*.log
  # libFuzzer's findings: crash-, timeout-, oom-, leak- files. A slow-unit- file is an input
  # that took over 10 s once (-report_slow_units): under a loaded machine a nice-19 fuzzer
  # is starved for seconds, so it is counted apart, not as a crash.
  findings() { find "$artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l; }
  slow() { find "$artifacts" -type f -name 'slow-unit-*' | wc -l; }
  before=$(findings)
  slow_before=$(slow)
  flags=(-jobs=1 -workers=1 -max_total_time="$seconds" -timeout="$timeout_s" -rss_limit_mb="$rss_mb"
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$artifacts/")
  d=$(dict "$t")
  [[ -n $d ]] && flags+=(-dict="$d")
  # shellcheck disable=SC2206
  flags+=(${FUZZ_ARGS:-})
  echo "== fuzzing $t for ${seconds}s"
  start=$(date +%s)
  rc=0
  # -jobs=1: one child process, its output in $logs/fuzz-0.log (libFuzzer writes it to the cwd).
  (cd "$logs" && nice -n 19 "$bin" "${flags[@]}" "$corpus" >"$logs/supervisor.log" 2>&1) || rc=$?
  wall=$(($(date +%s) - start))
  log="$logs/fuzz-0.log"
  [[ -f $log ]] || log="$logs/supervisor.log"
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  execs=${execs:-0}
  crashes=$(($(findings) - before))
  slow_units=$(($(slow) - slow_before))
  [[ $slow_units -gt 0 ]] && echo "-- $t: $slow_units slow unit(s) (over 10 s once) in $artifacts"
  rate=$((execs / (wall > 0 ? wall : 1)))
  if [[ $crashes -gt 0 ]] || ! grep -q 'Done [0-9]* runs' "$log"; then
    status=1
    echo "!! $t: crashed or stopped early (exit $rc); see $log and $artifacts"
    grep -m1 -A3 'panicked at\|ERROR: libFuzzer\|ERROR: AddressSanitizer' "$log" || tail -5 "$log"
  fi
  results+=("$(printf '%-14s %14s %8s %10s %8s' "$t" "$execs" "${wall}s" "$rate" "$crashes")")
done

echo
printf '%-14s %14s %8s %10s %8s\n' target execs wall execs/s crashes
printf '%s\n' "${results[@]}"
exit $status
