//! Threshold tuning from measurements only: the distribution of effective ISL (`isl − cached`
//! on the chosen decode worker) and of the eff/raw ratio as the router saw them in a virtual
//! run (to *read* what share of requests a threshold lets through), and the `isl_bounding`
//! thresholds a sweep measured to serve the most. `docs/threshold-tuning.md` explains why and
//! shows it on the Mooncake trace.
//!
//! The recommendation ([`recommend_from_sweep`]) is a measured point, never a formula: the
//! sweep point with the most goodput (requests/s meeting the SLOs); points within a tolerance
//! of that goodput, or with as many requests meeting the SLOs as any point had, count as tied
//! and the lowest TTFT p90 among them wins. It comes with its
//! goodput as a share of the best point measured (at least `1 − tolerance`), and with the
//! router's default thresholds' share when the grid holds them. (A rule that sized the
//! threshold from the decode worker's prefill stall alone ignored queueing at the prefill pool
//! and recommended thresholds far below the sweep's best; it is gone.)

use serde::Serialize;

use super::sweep::SweepPoint;
use super::tracker::RouteNote;
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

/// The thresholds a sweep measured to serve the most, and how they compare.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepRecommendation {
    /// Recommended `eff_isl_threshold`, tokens.
    pub eff_isl_threshold: u32,
    /// Recommended `eff_isl_ratio_threshold`.
    pub eff_isl_ratio_threshold: f64,
    /// Its goodput, requests/s meeting the SLOs.
    pub goodput_rps: f64,
    /// The most goodput any sweep point reached.
    pub best_goodput_rps: f64,
    /// `goodput_rps ÷ best_goodput_rps` (1 when the best point is recommended).
    pub goodput_ratio: f64,
    /// Its TTFT p90, ms.
    pub ttft_p90_ms: Option<f64>,
    /// Its bypass share.
    pub bypass_share: f64,
    /// The router's default thresholds' goodput ÷ the best, when the grid holds them.
    pub default_goodput_ratio: Option<f64>,
    /// The tolerance used: points within it of the best goodput count as tied.
    pub goodput_tolerance: f64,
}

/// The recommendation from `points` (see the module doc): the most goodput, ties within
/// `goodput_tolerance` (0.01 = 1 %) to the lowest TTFT p90; `default` is the router's
/// default `(eff_isl_threshold, ratio)`. Points with failed requests are not recommended.
/// `None` when no point ran cleanly.
///
/// Every point replays the same requests, so two with the same number of requests meeting
/// the SLOs tie whatever their rates: the rates then differ only by when the last request
/// finished. (Without SLOs every point that serves all its requests ties, and TTFT p90
/// decides.)
pub fn recommend_from_sweep(
    points: &[SweepPoint],
    goodput_tolerance: f64,
    default: (u32, f64),
) -> Option<SweepRecommendation> {
    let clean: Vec<&SweepPoint> = points
        .iter()
        .filter(|p| p.failed == 0 && p.goodput_rps.is_finite())
        .collect();
    let best = clean
        .iter()
        .map(|p| p.goodput_rps)
        .fold(f64::NEG_INFINITY, f64::max);
    if !best.is_finite() {
        return None;
    }
    let tolerance = goodput_tolerance.clamp(0.0, 1.0);
    let floor = best * (1.0 - tolerance);
    let most_requests = clean.iter().map(|p| p.goodput_requests).max().unwrap_or(0);
    let ttft = |p: &SweepPoint| p.ttft_ms.p90.unwrap_or(f64::INFINITY);
    let pick = clean
        .iter()
        .filter(|p| p.goodput_rps >= floor || p.goodput_requests == most_requests)
        .min_by(|a, b| {
            ttft(a)
                .total_cmp(&ttft(b))
                .then(b.goodput_rps.total_cmp(&a.goodput_rps))
        })?;
    let ratio = |goodput: f64| if best > 0.0 { goodput / best } else { 1.0 };
    let default_goodput_ratio = points
        .iter()
        .find(|p| (p.eff_isl_threshold, p.ratio_threshold) == default)
        .map(|p| ratio(p.goodput_rps));
    Some(SweepRecommendation {
        eff_isl_threshold: pick.eff_isl_threshold,
        eff_isl_ratio_threshold: pick.ratio_threshold,
        goodput_rps: pick.goodput_rps,
        best_goodput_rps: best,
        goodput_ratio: ratio(pick.goodput_rps),
        ttft_p90_ms: pick.ttft_ms.p90,
        bypass_share: pick.bypass_share,
        default_goodput_ratio,
        goodput_tolerance: tolerance,
    })
}

/// The recommendation as a markdown paragraph.
pub fn recommendation_markdown(rec: &SweepRecommendation) -> String {
    let mut out = format!(
        "Recommended (measured): `eff_isl_threshold` = {}, `eff_isl_ratio_threshold` = {:.2} — \
         goodput {:.3} req/s, {:.1} % of the best sweep point ({:.3} req/s; points within \
         {} % of it or with as many requests within the SLOs count as tied, the lowest TTFT \
         p90 wins), {:.1} % bypass.",
        rec.eff_isl_threshold,
        rec.eff_isl_ratio_threshold,
        rec.goodput_rps,
        rec.goodput_ratio * 100.0,
        rec.best_goodput_rps,
        // As given: 0.4 % is not 0 %.
        (rec.goodput_tolerance * 1e6).round() / 1e4,
        rec.bypass_share * 100.0
    );
    if let Some(d) = rec.default_goodput_ratio {
        out.push_str(&format!(
            " The router's default thresholds reach {:.1} % of the best.",
            d * 100.0
        ));
    }
    out.push('\n');
    out
}

/// The distributions as markdown (what share of requests a threshold would let through).
pub fn tuning_markdown(dist: &EffIslDistribution) -> String {
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
    out
}
