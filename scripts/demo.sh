#!/usr/bin/env bash
# The comparison users need, in one command: sets up a fresh machine, builds Switchyard
# (release), and runs aggregated, disaggregated and conditional serving on the real local
# stack (nats-server, control plane, simulated workers, Envoy with the wasm filter),
# replaying a slice of the Mooncake conversation trace through the gateway. Prints the
# comparison table and writes it, its JSON and the interactivity-vs-throughput plot to
# results/compare-<timestamp>/. Then, if the virtual-time replayer is built, prints the same
# comparison for the whole trace in virtual time, and the planner's answer for the same 200
# requests with every mode at its own best prefill:decode split (virtual time).
#
# Every worker is SIMULATED (a GB200 performance model, no GPU): see docs/benchmarks.md.
#
# Demo defaults (docs/benchmarks.md explains them): the first 200 trace requests (72 s of
# trace), 4 workers of 4 GPUs (1 prefill + 3 decode in disagg/conditional), workers 4x faster
# than the modelled hardware, two load levels (half the trace's rate and its rate). The run part
# takes about 4 minutes on 2 cores. Extra arguments go to switchyard-compare and override
# these (e.g. `./scripts/demo.sh --max-requests 400 --load-levels 0.25,0.5,1`); the
# virtual-time parts keep the defaults, and say so. Ctrl-C stops every process it started.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The Mooncake conversation trace (data/README.md, docs/loadgen.md "Mooncake traces").
trace=${SWITCHYARD_TRACE:-$root/data/mooncake_conversation_trace.jsonl}
if [[ ! -f $trace ]]; then
  echo "demo: the Mooncake trace is not at $trace" >&2
  echo "demo: how to fix: put it there or set SWITCHYARD_TRACE=/path/to/trace.jsonl" >&2
  exit 1
fi

echo "== setup"
./scripts/setup.sh
# shellcheck disable=SC1091
source .cache/env.sh

echo "== build (release; the first build takes a while on 2 cores)"
cargo build --release --workspace --bins --locked
cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm --locked

echo "== real stack: agg vs disagg vs conditional (simulated workers)"
start=$SECONDS
out=results/compare-$(date -u +%Y%m%d-%H%M%S)
target/release/switchyard-compare \
  --trace "$trace" \
  --max-requests 200 \
  --workers 4 --prefill-ratio 0.25 \
  --speed-up 4 \
  --load-levels 0.5,1 \
  --slo-ttft-ms 2000 --slo-itl-ms 25 \
  --quiet \
  --out "$out" \
  "$@"
echo "(real-stack runs took $((SECONDS - start)) s; results in $out)"
if (($# > 0)); then
  echo "(the extra arguments ($*) went to the real-stack comparison only: the virtual-time parts below keep the demo's defaults)"
fi

if [[ -x target/release/switchyard-replay ]]; then
  echo
  echo "== virtual time: the whole trace, same workers, no sockets (simulated)"
  vstart=$SECONDS
  # Bounded: the whole trace normally replays in about 5 s.
  if timeout 300 target/release/switchyard-replay \
    --trace "$trace" \
    --workers 4 --prefill-ratio 0.25 \
    --slo-ttft-ms 2000 --slo-itl-ms 25 \
    --out "$out/virtual-full-trace"; then
    echo "(virtual-time replay took $((SECONDS - vstart)) s)"
  else
    echo "demo: the virtual-time replay failed or took longer than 300 s; the real-stack results above stand" >&2
  fi
fi

# The split above (1 prefill : 3 decode) is one deployment; each mode has its own best one.
# The planner sweeps every split (and conditional's thresholds and slo_cost) for the same
# 200 requests at the same levels and SLOs in virtual time: a few seconds.
if [[ -x target/release/switchyard-plan ]]; then
  echo
  echo "== virtual time: each mode at its own best prefill:decode split (switchyard-plan, simulated)"
  pstart=$SECONDS
  if timeout 300 target/release/switchyard-plan \
    --trace "$trace" --max-requests 200 \
    --workers 4 --load-levels 0.5,1 \
    --slo-ttft-ms 2000 --slo-itl-ms 25 --slo-cost \
    --quiet --out "$out/plan" > /dev/null; then
    # The recommendation, each mode at its best split per level, and the best per mode;
    # the frontiers and every point stay in plan.md.
    sed -n '/^## Recommended/,/^## Frontier/{/^## Frontier/!p;}' "$out/plan/plan.md"
    echo "(planner took $((SECONDS - pstart)) s; every point in $out/plan/plan.md)"
  else
    echo "demo: the planner failed or took longer than 300 s; the results above stand" >&2
  fi
fi
