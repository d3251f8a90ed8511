#!/usr/bin/env bash
# Issue #15's tables, in one command (docs/benchmarks.md, "Agentic traffic at every load").
# SIMULATED: virtual-time replays of simulated GB200 workers (docs/virtual-time.md).
#
# 1. The planner with `--slo-cost` on two workloads — the first 1,500 requests of the Mooncake
#    conversation trace and the synthetic agentic sessions (closed loop, long contexts) — at
#    four load levels from light to saturated, on 4 workers: agg, disagg and conditional at
#    every split, conditional under isl_bounding at every threshold pair of the sweep and under
#    slo_cost. Each writes policies.md: every mode at its best split and bars (a) and (b).
# 2. A prefill worker continuing decode (agg:decode_pool_full) against the behaviour before it
#    (prefill_continues_decode false) on a saturated decode pool: data/agentic_long_outputs.json
#    on 3 prefill : 1 decode.
# 3. slo_cost with its timing model off by 2x (every prefill and decode coefficient doubled),
#    learning on and off, against the correct model.
#
# Usage: scripts/bench-agentic.sh [OUT]   (default runs/bench-agentic; OUT/bench-agentic.md
# collects every table). JOBS (default 1) sets the planner's threads. About 10 minutes on the
# shared 2-core development machine with JOBS=1.
#
# The 16 default sessions never saturate 4 workers; scripts/bench-agentic-saturated.sh plans
# 16 to 256 sessions (about 8 more minutes, so it is a separate command).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${1:-runs/bench-agentic}
jobs=${JOBS:-1}
mkdir -p "$out"

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release --locked -p switchyard-replay
plan="nice -n 5 target/release/switchyard-plan --workers 4 --slo-ttft-ms 2000 --slo-itl-ms 25
  --load-levels 0.5,1,2,4 --sweep-thresholds 0,1024,2048,4096,8192,16384 --sweep-ratios 0.7,1.0
  --slo-cost --jobs $jobs --max-minutes 12 --quiet"
replay="nice -n 5 target/release/switchyard-replay --slo-ttft-ms 2000 --slo-itl-ms 25"

report=$out/bench-agentic.md
{
  echo "# Agentic traffic at every load (virtual time, simulated)"
  echo
  echo "Command: \`scripts/bench-agentic.sh $out\` ($(git rev-parse --short HEAD), $(date -u +%FT%TZ))."
  echo
} > "$report"

for w in mooncake agentic; do
  case $w in
    mooncake) args="--max-requests 1500" ;;
    agentic) args="--agentic" ;;
  esac
  echo "== planner: $w"
  # shellcheck disable=SC2086
  $plan $args --out "$out/plan-$w" > /dev/null
  { echo "## $w ($args)"; echo; cat "$out/plan-$w/policies.md"; echo; } >> "$report"
done

echo "== prefill worker continuing decode"
{
  echo "## A prefill worker continuing decode (data/agentic_long_outputs.json, 3 prefill : 1 decode)"
  echo
} >> "$report"
for on in true false; do
  # shellcheck disable=SC2086
  $replay --agentic --agentic-config data/agentic_long_outputs.json --workers 4 --prefill-workers 3 \
    --modes disagg,conditional --conditional-disagg-config "{\"policy\": \"slo_cost\", \"prefill_continues_decode\": $on}" \
    --out "$out/prefill-decodes-$on" > /dev/null
  { echo "prefill_continues_decode $on:"; echo; cat "$out/prefill-decodes-$on/comparison.md"; echo; } >> "$report"
done

echo "== slo_cost with its model off by 2x"
x2='"prefill_iteration_ms": 39.0, "prefill_ms_per_token": 0.02978, "prefill_attention_ms_per_token_pair": 1.084e-6, "decode_step_ms": 32.56, "decode_step_ms_per_stream": 0.0326'
{
  echo "## slo_cost with its timing model off by 2x"
  echo
  echo "| workload | split | load | model | learn_timing | goodput req/s | bypass |"
  echo "|---|---|---|---|---|---|---|"
} >> "$report"
for case in "mooncake:--max-requests 1500:3:2" "mooncake:--max-requests 1500:2:4" "agentic:--agentic:1:2" "agentic:--agentic:1:4"; do
  IFS=: read -r name args p level <<< "$case"
  for model in correct x2; do
    for learn in false true; do
      cfg="{\"policy\": \"slo_cost\", \"learn_timing\": $learn"
      [[ $model == x2 ]] && cfg="$cfg, $x2"
      cfg="$cfg}"
      dir=$out/model-$name-$p-$level-$model-$learn
      # shellcheck disable=SC2086
      $replay $args --workers 4 --prefill-workers "$p" --modes conditional --load-levels "$level" \
        --conditional-disagg-config "$cfg" --out "$dir" > /dev/null
      row=$(sed -n 3p "$dir/comparison.md" | awk -F'|' '{gsub(/ /,"",$11); gsub(/^ +| +$/,"",$12); print $11 " | " $12}')
      echo "| $name | $p:$((4 - p)) | ${level}× | $model | $learn | $row |" >> "$report"
    done
  done
done

echo "wrote $report"
cat "$report"
