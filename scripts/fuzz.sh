#!/usr/bin/env bash
# Runs every fuzz target (cargo fuzz, nightly toolchain, libFuzzer) for SECONDS each (default 600), two at a
# time, then minimises each corpus in place; prints each target's executions per second. The stable build
# replays the committed corpora as a test (e2e/tests/fuzz_corpus.rs).
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
mkdir -p fuzz/logs
cargo +nightly fuzz build -O
run() {
  local t=$1
  cargo +nightly fuzz run -O "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
    > "fuzz/logs/$t.log" 2>&1 || { echo "$t: CRASH, see fuzz/logs/$t.log and fuzz/artifacts/$t"; return 1; }
  local runs; runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "fuzz/logs/$t.log" | grep -o '[0-9]*$')
  echo "$t: ${runs} executions in ${secs} s, $((runs / secs))/s, no crash"
}
status=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run "${targets[i]}" & a=$!
  b=""
  if [ $((i + 1)) -lt ${#targets[@]} ]; then run "${targets[i+1]}" & b=$!; fi
  wait $a || status=1
  if [ -n "$b" ]; then wait $b || status=1; fi
done
for t in "${targets[@]}"; do
  cargo +nightly fuzz cmin -O "$t" > "fuzz/logs/$t.cmin.log" 2>&1 || true
done
exit $status
