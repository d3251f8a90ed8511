#!/usr/bin/env bash
# Issue #15's bars on agentic sessions that saturate 4 workers (docs/benchmarks.md,
# "Agentic sessions that saturate 4 workers").
# SIMULATED: virtual-time replays of simulated GB200 workers (docs/virtual-time.md).
#
# scripts/bench-agentic.sh plans the default 16 agentic sessions, which never saturate 4
# workers (its load levels only shorten think times). This plans the same generator with more
# sessions (--sessions N; every other default kept: ISL 10k-250k, > 95 % reusable prompt
# tokens, 0.5 session starts/s, 200-2000 ms think), at load levels 1x and 4x (4x: think
# times and session starts 4x faster), on 4 workers: agg, disagg 1:3, 2:2, 3:1, conditional
# at each split under isl_bounding (thresholds 0, 1024, 4096, 16384, ratio 1.0) and under
# slo_cost (no per-workload tuning). Each plan writes policies.md (bars (a) and (b) per level);
# summary.md puts every session count in one table with each mode's goodput share and tails.
#
# Usage: scripts/bench-agentic-saturated.sh [OUT]   (default runs/bench-agentic-saturated).
# SESSIONS (default "16 32 64 96 128 256") sets the session counts, JOBS (default 1) the
# planner's threads. About 8 minutes on the shared 2-core development machine with JOBS=1
# (256 sessions alone: 3 min 23 s).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${1:-runs/bench-agentic-saturated}
jobs=${JOBS:-1}
sessions=${SESSIONS:-16 32 64 96 128 256}
mkdir -p "$out"

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release --locked -p switchyard-replay
plan="nice -n 5 target/release/switchyard-plan --agentic --workers 4 --slo-ttft-ms 2000
  --slo-itl-ms 25 --load-levels 1,4 --sweep-thresholds 0,1024,4096,16384 --sweep-ratios 1.0
  --slo-cost --jobs $jobs --max-minutes 8 --quiet"

report=$out/bench-agentic-saturated.md
{
  echo "# Agentic sessions that saturate 4 workers (virtual time, simulated)"
  echo
  echo "Command: \`scripts/bench-agentic-saturated.sh $out\` ($(git rev-parse --short HEAD), $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg))."
  echo
} > "$report"

for n in $sessions; do
  echo "== planner: $n sessions"
  start=$(date +%s)
  # shellcheck disable=SC2086
  $plan --sessions "$n" --out "$out/plan-$n" > /dev/null
  { echo "## $n sessions ($(( $(date +%s) - start )) s wall)"; echo; cat "$out/plan-$n/policies.md"; echo; } >> "$report"
done

# One table: per session count and load, each mode at its best split, the bars, and why each
# mode's requests miss (goodput share = requests within both SLOs; TTFT p90, ITL p90).
python3 - "$out" $sessions > "$out/summary.md" <<'EOF'
import json, sys

out, counts = sys.argv[1], sys.argv[2:]


def label(p):
    split = f"{p['prefill_workers']}:{4 - p['prefill_workers']}"
    if p["mode"] == "agg":
        return "agg"
    if p["mode"] == "disagg":
        return f"disagg {split}"
    if p["policy"] == "slo_cost":
        return f"slo_cost {split}"
    t, r = p["thresholds"]
    return f"{split} t={t} r={r:g}"


def good(r):
    return r["outcome"]["report"]["goodput"]["requests_per_s"]


def cell(r):
    rep = r["outcome"]["report"]
    s = f"{good(r):.2f} ({label(r['point'])}"
    if r["point"]["policy"] == "slo_cost":
        s += f", {rep['routes']['bypass_share'] * 100:.0f} % bypass"
    return s + ")"


def tails(r):
    rep = r["outcome"]["report"]
    return (f"{rep['goodput']['share'] * 100:.0f} % · {rep['ttft_ms']['p90'] / 1000:.1f} s · "
            f"{rep['itl_ms']['p90']:.1f} ms")


print("| sessions | load | served req/s (best) | ceiling req/s (any deployment) | prefix reuse | agg | best disagg "
      "| best isl_bounding (sweep) | slo_cost (best split) | (a) slo_cost / sweep | (b) slo_cost / max(agg, disagg) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
rows = []
for n in counts:
    plan = json.load(open(f"{out}/plan-{n}/plan.json"))
    measured = [r for r in plan["results"] if r["outcome"]["status"] == "measured"]
    for level in sorted({r["point"]["load_level"] for r in measured}):
        at = [r for r in measured if r["point"]["load_level"] == level]
        best = lambda f: max((r for r in at if f(r["point"])), key=good)
        agg = best(lambda p: p["mode"] == "agg")
        dis = best(lambda p: p["mode"] == "disagg")
        sweep = best(lambda p: p["policy"] == "isl_bounding")
        slo = best(lambda p: p["policy"] == "slo_cost")
        top = max(at, key=good)
        served = top["outcome"]["report"]["throughput"]["requests_per_s"]
        reuse = agg["outcome"]["report"]["tokens"]["cached_share"] * 100
        a = good(slo) / good(sweep) * 100
        b = good(slo) / max(good(agg), good(dis)) * 100
        ceiling = next(c["ceiling"]["requests_per_s"] for c in plan["ceilings"] if c["load_level"] == level)
        # 1.2x the better of agg and disagg above the ceiling: no deployment can reach it.
        beyond = " (1.2× is above the ceiling)" if 1.2 * max(good(agg), good(dis)) > ceiling else ""
        print(f"| {n} | {level:g}× | {served:.2f} | {ceiling:.2f} | {reuse:.0f} % | {cell(agg)} | {cell(dis)} "
              f"| {cell(sweep)} | {cell(slo)} | {a:.1f} % | {b:.1f} %{beyond} |")
        rows.append((n, level, agg, dis, slo))
print()
print("Goodput share · TTFT p90 · ITL p90 of each at its best split:")
print()
print("| sessions | load | agg | best disagg | slo_cost |")
print("|---|---|---|---|---|")
for n, level, agg, dis, slo in rows:
    print(f"| {n} | {level:g}× | {tails(agg)} | {tails(dis)} ({label(dis['point'])}) "
          f"| {tails(slo)} ({label(slo['point'])}) |")
EOF
{ echo "## Summary"; echo; cat "$out/summary.md"; } >> "$report"
echo "wrote $report"
cat "$out/summary.md"
