//! The policy comparison of a plan run with `--slo-cost` (issue #15's bars): per load level,
//! each mode at its own best split — agg, disagg, conditional under `isl_bounding` at its
//! default thresholds, the best `isl_bounding` point of the whole threshold sweep (found in
//! hindsight), and conditional under `slo_cost` — and two ratios:
//!
//! - **(a)** `slo_cost` ÷ the best sweep point: the bar is ≥ 95 %, without per-workload tuning;
//! - **(b)** `slo_cost` ÷ the better of agg and disagg: the bar is ≥ 95 % everywhere, and
//!   ≥ 1.2 where prefix reuse is high (agg's cached prompt share, the workload's reuse as a
//!   cache sees it, at least [`HIGH_REUSE`]).
//!
//! Each row also carries the level's goodput ceiling ([`crate::ceiling`]): where 1.2× the
//! better of agg and disagg is above it, no deployment and no policy can meet (b)'s multiple,
//! and the table says so.
//!
//! Pure: from a plan's results to rows and markdown.

use std::fmt::Write as _;

use serde::Serialize;
use switchyard_loadgen::LoadLevel;
use switchyard_router::config::{PolicyKind, ServingMode};

use super::analysis::{PointMetrics, Scored};
use super::PlanOutcome;

/// Agg's cached prompt share from which a workload counts as high prefix reuse.
pub const HIGH_REUSE: f64 = 0.5;
/// Bar (a): `slo_cost` reaches this share of the best sweep point.
pub const BAR_A: f64 = 0.95;
/// Bar (b): never below this share of the better of agg and disagg ...
pub const BAR_B_FLOOR: f64 = 0.95;
/// ... and at least this multiple of it where prefix reuse is high.
pub const BAR_B_HIGH_REUSE: f64 = 1.2;

/// One load level's comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyRow {
    /// The level.
    pub load_level: LoadLevel,
    /// Offered requests/s (agg's run).
    pub offered_rps: Option<f64>,
    /// Agg's cached prompt share.
    pub prefix_reuse: Option<f64>,
    /// Agg.
    pub agg: Option<Scored>,
    /// Disagg at its best split.
    pub disagg: Option<Scored>,
    /// `isl_bounding` at the default thresholds, best split.
    pub isl_default: Option<Scored>,
    /// The best `isl_bounding` point of the sweep (any split, any thresholds).
    pub sweep_best: Option<Scored>,
    /// `slo_cost` at its best split.
    pub slo_cost: Option<Scored>,
    /// (a): `slo_cost` ÷ the best sweep point.
    pub bar_a: Option<f64>,
    /// (b): `slo_cost` ÷ max(agg, disagg).
    pub bar_b: Option<f64>,
    /// The most goodput any deployment could reach at this level, req/s.
    pub ceiling_rps: Option<f64>,
    /// max(agg, disagg), req/s.
    pub baseline_rps: Option<f64>,
}

impl PolicyRow {
    /// Whether (a) holds (`None` when a side did not run).
    pub fn meets_a(&self) -> Option<bool> {
        self.bar_a.map(|a| a >= BAR_A)
    }

    /// Whether (b) holds: the floor everywhere, the multiple where reuse is high.
    pub fn meets_b(&self) -> Option<bool> {
        let b = self.bar_b?;
        let high = self.prefix_reuse.is_some_and(|r| r >= HIGH_REUSE);
        Some(b >= BAR_B_FLOOR && (!high || b >= BAR_B_HIGH_REUSE))
    }

    /// Whether (b)'s multiple is within the ceiling: `Some(false)` when
    /// [`BAR_B_HIGH_REUSE`] × max(agg, disagg) is more goodput than any deployment could
    /// reach (`None` when either side is unknown).
    pub fn multiple_within_ceiling(&self) -> Option<bool> {
        Some(BAR_B_HIGH_REUSE * self.baseline_rps? <= self.ceiling_rps?)
    }
}

/// The best of `points`, by the order every best of a plan is chosen by
/// ([`super::analysis::better`]: goodput, then throughput per GPU, then fewer prefill
/// workers), so this table names the same best split as "Best per mode".
fn best<'a>(points: impl Iterator<Item = &'a Scored>) -> Option<Scored> {
    points.min_by(|a, b| super::analysis::better(a, b)).copied()
}

fn ratio(num: Option<&Scored>, den: Option<f64>) -> Option<f64> {
    let den = den?;
    (den > 0.0).then(|| num.map_or(0.0, |n| n.metrics.goodput_rps) / den)
}

/// Rows per load level; `default_thresholds` is the router's `(eff_isl_threshold,
/// eff_isl_ratio_threshold)`.
pub fn policy_rows(outcome: &PlanOutcome, default_thresholds: (u32, f64)) -> Vec<PolicyRow> {
    let scored: Vec<Scored> = outcome
        .results
        .iter()
        .enumerate()
        .filter_map(|(index, r)| {
            PointMetrics::of(r).map(|metrics| Scored {
                index,
                point: r.point,
                metrics,
            })
        })
        .collect();
    outcome
        .space
        .load_levels
        .iter()
        .map(|&level| {
            let ceiling_rps = outcome
                .ceilings
                .iter()
                .find(|c| c.load_level == level)
                .map(|c| c.ceiling.requests_per_s);
            let at: Vec<&Scored> = scored
                .iter()
                .filter(|s| s.point.load_level == level)
                .collect();
            let of = |f: &dyn Fn(&Scored) -> bool| best(at.iter().copied().filter(|s| f(s)));
            let agg = of(&|s| s.point.mode == ServingMode::Agg);
            let disagg = of(&|s| s.point.mode == ServingMode::Disagg);
            let isl = |s: &Scored| {
                s.point.mode == ServingMode::Conditional
                    && s.point.policy == Some(PolicyKind::IslBounding)
            };
            let isl_default = of(&|s| isl(s) && s.point.thresholds == Some(default_thresholds));
            let sweep_best = of(&isl);
            let slo_cost = of(&|s| s.point.policy == Some(PolicyKind::SloCost));
            let baseline = match (agg, disagg) {
                (None, None) => None,
                (a, d) => Some(
                    a.map_or(0.0, |a| a.metrics.goodput_rps)
                        .max(d.map_or(0.0, |d| d.metrics.goodput_rps)),
                ),
            };
            let prefix_reuse = agg.and_then(|a| {
                outcome.results[a.index]
                    .report()
                    .and_then(|r| r.tokens.cached_share)
            });
            PolicyRow {
                load_level: level,
                offered_rps: agg.and_then(|a| a.metrics.offered_rps),
                prefix_reuse,
                agg,
                disagg,
                isl_default,
                sweep_best,
                bar_a: slo_cost.as_ref().and_then(|_| {
                    ratio(slo_cost.as_ref(), sweep_best.map(|s| s.metrics.goodput_rps))
                }),
                bar_b: slo_cost
                    .as_ref()
                    .and_then(|_| ratio(slo_cost.as_ref(), baseline)),
                slo_cost,
                ceiling_rps,
                baseline_rps: baseline,
            }
        })
        .collect()
}

fn cell(s: &Option<Scored>, workers: u32) -> String {
    match s {
        Some(s) => format!("{:.3} ({})", s.metrics.goodput_rps, s.point.label(workers)),
        None => "–".into(),
    }
}

fn pct(x: Option<f64>, ok: Option<bool>) -> String {
    match (x, ok) {
        (Some(x), Some(true)) => format!("{:.1} %", x * 100.0),
        (Some(x), _) => format!("**{:.1} %** (not met)", x * 100.0),
        (None, _) => "–".into(),
    }
}

/// (b)'s cell: as [`pct`], naming a multiple no deployment could reach.
fn pct_b(row: &PolicyRow) -> String {
    let unmet_floor = row.bar_b.is_some_and(|b| b < BAR_B_FLOOR);
    match (row.bar_b, row.meets_b(), row.multiple_within_ceiling()) {
        (Some(b), Some(false), Some(false)) if !unmet_floor => format!(
            "**{:.1} %** (not met; {BAR_B_HIGH_REUSE}× is above the ceiling)",
            b * 100.0
        ),
        (b, ok, _) => pct(b, ok),
    }
}

/// The comparison as a markdown table (goodput in requests/s, the point in parentheses).
pub fn policy_markdown(rows: &[PolicyRow], workers: u32) -> String {
    let mut out = String::from(
        "| load | offered req/s | prefix reuse | agg | best disagg | isl_bounding default (best split) \
         | best isl_bounding (sweep) | slo_cost (best split) | ceiling (any deployment) \
         | (a) slo_cost / best sweep | (b) slo_cost / max(agg, disagg) \
         |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let slo_bypass = r
            .slo_cost
            .and_then(|s| s.metrics.bypass_share)
            .map_or(String::new(), |b| format!(", {:.0} % bypass", b * 100.0));
        let slo = match &r.slo_cost {
            Some(s) => format!(
                "{:.3} ({}{slo_bypass})",
                s.metrics.goodput_rps,
                s.point.label(workers)
            ),
            None => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {}× | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.load_level,
            r.offered_rps.map_or("–".into(), |x| format!("{x:.2}")),
            r.prefix_reuse
                .map_or("–".into(), |x| format!("{:.0} %", x * 100.0)),
            cell(&r.agg, workers),
            cell(&r.disagg, workers),
            cell(&r.isl_default, workers),
            cell(&r.sweep_best, workers),
            slo,
            r.ceiling_rps.map_or("–".into(), |x| format!("{x:.3}")),
            pct(r.bar_a, r.meets_a()),
            pct_b(r),
        );
    }
    out
}
