//! Threshold tuning from a workload: the distribution of effective ISL (`isl − cached` on the
//! chosen decode worker) and of the eff/raw ratio as the router saw them in a virtual run,
//! and the `isl_bounding` thresholds they suggest. `docs/threshold-tuning.md` explains the
//! rule and shows it on the Mooncake trace.
//!
//! The rule (two stages):
//! - **`eff_isl_threshold`: the stall budget.** A bypassed request prefills `eff_isl` tokens
//!   on the decode worker, inside iterations that every running stream waits for. The
//!   threshold is the largest token count whose prefill on that worker (the performance
//!   model, on the median cached prefix) fits the stall budget one inter-token gap may take,
//!   rounded down to a multiple of the KV block size. It depends on the hardware, not on the
//!   workload: the distribution only says what share of requests it lets through.
//! - **`eff_isl_ratio_threshold`: 1.0** (bypass anything with *some* prefix cached there).
//!   Below the stall-budget threshold every bypass already costs running streams at most
//!   the budget, so the ratio guard has nothing left to protect except fully cold prompts,
//!   which stay with the prefill pool. The ratio matters when the absolute threshold is
//!   raised past the budget; the sweep shows what that costs.
//! - **Check in virtual time** ([`pick_from_sweep`]): among sweep points whose ITL p99 stays
//!   within a slack of the never-bypass point's, take the lowest TTFT p90.

use serde::Serialize;

use super::sweep::SweepPoint;
use super::tracker::RouteNote;
use switchyard_engine::PerfModel;
use switchyard_loadgen::stats::percentile;

/// Percentiles reported for each distribution.
pub const PERCENTILES: [f64; 7] = [5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0];

/// How effective ISL and the eff/raw ratio are distributed over a run's verdicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EffIslDistribution {
    /// Verdicts counted.
    pub requests: usize,
    /// Raw ISL at [`PERCENTILES`].
    pub isl: Vec<(f64, f64)>,
    /// Effective ISL at [`PERCENTILES`].
    pub eff_isl: Vec<(f64, f64)>,
    /// eff/raw ratio at [`PERCENTILES`].
    pub ratio: Vec<(f64, f64)>,
    /// Share of requests per ratio tenth: `[0, 0.1), [0.1, 0.2), …, [0.9, 1.0]`.
    pub ratio_tenths: [f64; 10],
    /// Share with nothing cached on the decode worker (ratio 1).
    pub cold_share: f64,
    /// Median cached tokens on the decode worker, over all verdicts.
    pub cached_p50: f64,
    /// Effective ISL values sorted ascending (for "what share is below T").
    #[serde(skip)]
    sorted_eff: Vec<f64>,
}

impl EffIslDistribution {
    /// From the route notes of a run (any mode: the router computes `eff_isl` against its
    /// chosen decode worker in every mode).
    pub fn from_notes(notes: &[RouteNote]) -> Self {
        let sorted = |f: &dyn Fn(&RouteNote) -> f64| {
            let mut v: Vec<f64> = notes.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let isl = sorted(&|n| f64::from(n.isl));
        let eff = sorted(&|n| f64::from(n.eff_isl));
        let ratio = sorted(&RouteNote::eff_ratio);
        let cached = sorted(&|n| f64::from(n.cached_tokens));
        let at = |v: &[f64]| {
            PERCENTILES
                .iter()
                .map(|&p| (p, percentile(v, p).unwrap_or(0.0)))
                .collect()
        };
        let n = notes.len().max(1) as f64;
        let mut tenths = [0.0; 10];
        for r in &ratio {
            tenths[((r * 10.0).floor() as usize).min(9)] += 1.0 / n;
        }
        EffIslDistribution {
            requests: notes.len(),
            isl: at(&isl),
            eff_isl: at(&eff),
            ratio: at(&ratio),
            ratio_tenths: tenths,
            cold_share: ratio.iter().filter(|&&r| r >= 1.0).count() as f64 / n,
            cached_p50: percentile(&cached, 50.0).unwrap_or(0.0),
            sorted_eff: eff,
        }
    }

    /// Share of requests whose effective ISL is below `threshold` (what the absolute bound
    /// alone would let through).
    pub fn share_below(&self, threshold: u32) -> f64 {
        if self.sorted_eff.is_empty() {
            return 0.0;
        }
        let t = f64::from(threshold);
        let below = self.sorted_eff.partition_point(|&x| x < t);
        below as f64 / self.sorted_eff.len() as f64
    }

    /// The effective ISL at percentile `p`.
    pub fn eff_isl_at(&self, p: f64) -> f64 {
        percentile(&self.sorted_eff, p).unwrap_or(0.0)
    }
}

/// Recommended `isl_bounding` thresholds and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// Recommended `eff_isl_threshold`, tokens.
    pub eff_isl_threshold: u32,
    /// Recommended `eff_isl_ratio_threshold`.
    pub eff_isl_ratio_threshold: f64,
    /// The stall budget used, ms.
    pub stall_budget_ms: f64,
    /// Modelled decode-worker prefill time at the recommended threshold, ms.
    pub stall_at_threshold_ms: f64,
    /// Share of requests with effective ISL below the threshold.
    pub share_below_threshold: f64,
    /// The effective-ISL percentile the threshold falls at (0–100).
    pub threshold_percentile: f64,
}

/// Applies the rule in the module docs: `perf` is the decode worker's model, `block_size`
/// its KV block size, `stall_budget_ms` the longest prefill stall one bypass may add.
pub fn recommend_thresholds(
    dist: &EffIslDistribution,
    perf: &PerfModel,
    block_size: u32,
    stall_budget_ms: f64,
) -> Recommendation {
    let block = block_size.max(1);
    let cached = dist.cached_p50.max(0.0) as u64;
    let stall = |tokens: u32| perf.prefill_chunk_ms(u64::from(tokens), cached);
    // Largest block multiple within budget (prefill time grows with tokens; bounded search).
    let mut threshold = 0u32;
    while threshold < (1 << 20) && stall(threshold + block) <= stall_budget_ms {
        threshold += block;
    }
    let share = dist.share_below(threshold);
    Recommendation {
        eff_isl_threshold: threshold,
        eff_isl_ratio_threshold: 1.0,
        stall_budget_ms,
        stall_at_threshold_ms: stall(threshold),
        share_below_threshold: share,
        threshold_percentile: share * 100.0,
    }
}

/// The sweep point to run with: among points whose ITL p99 is within `itl_slack` (0.1 =
/// 10 %) of the lowest-bypass point's, the lowest TTFT p90 (ties: the higher bypass share).
/// `None` for an empty sweep or points without ITL.
pub fn pick_from_sweep(points: &[SweepPoint], itl_slack: f64) -> Option<&SweepPoint> {
    let baseline = points
        .iter()
        .min_by(|a, b| a.bypass_share.total_cmp(&b.bypass_share))?
        .itl_ms
        .p99?;
    let limit = baseline * (1.0 + itl_slack.max(0.0));
    points
        .iter()
        .filter(|p| p.failed == 0 && p.itl_ms.p99.is_some_and(|i| i <= limit))
        .filter(|p| p.ttft_ms.p90.is_some())
        .min_by(|a, b| {
            let key = |p: &SweepPoint| p.ttft_ms.p90.unwrap_or(f64::INFINITY);
            key(a)
                .total_cmp(&key(b))
                .then(b.bypass_share.total_cmp(&a.bypass_share))
        })
}

/// The distributions and the recommendation as markdown.
pub fn tuning_markdown(dist: &EffIslDistribution, rec: &Recommendation) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Verdicts: {}; nothing cached on the decode worker for {:.1} %; median cached prefix \
         {:.0} tokens.\n",
        dist.requests,
        dist.cold_share * 100.0,
        dist.cached_p50
    );
    out.push_str("| percentile | ISL | effective ISL | eff/raw ratio |\n|---|---|---|---|\n");
    for ((p, isl), ((_, eff), (_, ratio))) in dist
        .isl
        .iter()
        .zip(dist.eff_isl.iter().zip(dist.ratio.iter()))
    {
        let _ = writeln!(out, "| p{p:.0} | {isl:.0} | {eff:.0} | {ratio:.3} |");
    }
    out.push_str("\n| eff/raw ratio | share of requests |\n|---|---|\n");
    for (i, share) in dist.ratio_tenths.iter().enumerate() {
        let (lo, hi) = (i as f64 / 10.0, (i + 1) as f64 / 10.0);
        let close = if i == 9 { ']' } else { ')' };
        let _ = writeln!(out, "| [{lo:.1}, {hi:.1}{close} | {:.1} % |", share * 100.0);
    }
    let _ = writeln!(
        out,
        "\nRecommended: `eff_isl_threshold` = {} (modelled decode-worker prefill {:.1} ms within \
         a {:.0} ms stall budget; {:.1} % of requests have a smaller effective ISL, i.e. it sits \
         at p{:.0}), `eff_isl_ratio_threshold` = {:.1} (only fully cold prompts go to the prefill \
         pool).",
        rec.eff_isl_threshold,
        rec.stall_at_threshold_ms,
        rec.stall_budget_ms,
        rec.share_below_threshold * 100.0,
        rec.threshold_percentile,
        rec.eff_isl_ratio_threshold
    );
    out
}
