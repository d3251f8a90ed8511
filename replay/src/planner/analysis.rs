//! What a plan's measured points say: each mode's best deployment, each mode's frontier, and
//! the recommended deployment. Pure: from results to numbers.
//!
//! - **Best** of a mode: its measured point with the highest goodput (requests/s meeting both
//!   SLOs), ties broken by throughput per GPU, then by fewer prefill workers.
//! - **Frontier** of a mode: its measured points not dominated in (interactivity p50,
//!   throughput per GPU), i.e. no other point of the mode is at least as good on both and
//!   better on one; sorted by interactivity. The usual trade-off curve.
//! - **Recommendation**: the best of the bests; every other mode's best is given as its
//!   goodput ÷ the recommendation's.

use std::cmp::Ordering;

use serde::Serialize;
use switchyard_router::config::ServingMode;

use super::execute::PointResult;
use super::grid::PlanPoint;

/// A measured point's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PointMetrics {
    /// Requests/s meeting both SLOs.
    pub goodput_rps: f64,
    /// Goodput per GPU, requests/s.
    pub goodput_rps_per_gpu: f64,
    /// Input + output tokens/s per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Output tokens/s per GPU.
    pub output_tokens_per_s_per_gpu: f64,
    /// Median interactivity, tokens/s/user (`None` when no request had an ITL).
    pub interactivity_p50: Option<f64>,
    /// Offered load, requests/s.
    pub offered_rps: Option<f64>,
    /// Bypass share (conditional).
    pub bypass_share: Option<f64>,
}

impl PointMetrics {
    /// The numbers of `result`, if it ran.
    pub fn of(result: &PointResult) -> Option<PointMetrics> {
        let r = result.report()?;
        let gpus = f64::from(r.meta.gpus.max(1));
        Some(PointMetrics {
            goodput_rps: r.goodput.requests_per_s,
            goodput_rps_per_gpu: r.goodput.requests_per_s / gpus,
            tokens_per_s_per_gpu: r.throughput.total_tokens_per_s_per_gpu,
            output_tokens_per_s_per_gpu: r.throughput.output_tokens_per_s_per_gpu,
            interactivity_p50: r.interactivity.p50.filter(|x| x.is_finite()),
            offered_rps: r.meta.offered_rps,
            bypass_share: r.routes.bypass_share,
        })
    }
}

/// One measured point, by index into the results.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scored {
    /// Index in the plan's results.
    pub index: usize,
    /// The point.
    pub point: PlanPoint,
    /// Its numbers.
    pub metrics: PointMetrics,
}

/// A mode's best point and its frontier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeSummary {
    /// The mode.
    pub mode: ServingMode,
    /// Points of the mode that ran.
    pub measured: usize,
    /// Points of the mode not run (time bound) or failed.
    pub missing: usize,
    /// Its best point (none when nothing of the mode ran).
    pub best: Option<Scored>,
    /// Its frontier, by rising interactivity.
    pub frontier: Vec<Scored>,
}

/// The recommended deployment and how far every other mode's best is from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRecommendation {
    /// The recommended point (mode, split, thresholds, load level).
    pub best: Scored,
    /// Every other mode with a measured best, and how far that best is from this one.
    pub others: Vec<ModeGap>,
}

/// How far a mode's best is from the recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModeGap {
    /// The mode.
    pub mode: ServingMode,
    /// Its best point's goodput ÷ the recommendation's (1 = as good).
    pub goodput_ratio: f64,
}

/// Orders points best first: goodput, then throughput per GPU, then fewer prefill workers.
/// Every "best" of a plan is chosen by this order, so its tables name the same points.
pub(crate) fn better(a: &Scored, b: &Scored) -> Ordering {
    b.metrics
        .goodput_rps
        .total_cmp(&a.metrics.goodput_rps)
        .then(
            b.metrics
                .tokens_per_s_per_gpu
                .total_cmp(&a.metrics.tokens_per_s_per_gpu),
        )
        .then(a.point.prefill_workers.cmp(&b.point.prefill_workers))
}

/// Per mode in `modes` order: best and frontier.
pub fn summarize(results: &[PointResult], modes: &[ServingMode]) -> Vec<ModeSummary> {
    modes
        .iter()
        .map(|&mode| {
            let of_mode: Vec<&PointResult> =
                results.iter().filter(|r| r.point.mode == mode).collect();
            let scored: Vec<Scored> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.point.mode == mode)
                .filter_map(|(index, r)| {
                    PointMetrics::of(r).map(|metrics| Scored {
                        index,
                        point: r.point,
                        metrics,
                    })
                })
                .collect();
            ModeSummary {
                mode,
                measured: scored.len(),
                missing: of_mode.len() - scored.len(),
                best: scored.iter().copied().min_by(better),
                frontier: frontier(&scored),
            }
        })
        .collect()
}

/// The points not dominated in (interactivity p50, tokens/s/GPU), by rising interactivity.
pub fn frontier(points: &[Scored]) -> Vec<Scored> {
    let placed: Vec<(f64, f64, Scored)> = points
        .iter()
        .filter_map(|s| {
            s.metrics
                .interactivity_p50
                .map(|x| (x, s.metrics.tokens_per_s_per_gpu, *s))
        })
        .collect();
    let dominated = |(x, y, _): &(f64, f64, Scored)| {
        placed
            .iter()
            .any(|(ox, oy, _)| ox >= x && oy >= y && (ox > x || oy > y))
    };
    let mut front: Vec<(f64, f64, Scored)> =
        placed.iter().filter(|p| !dominated(p)).copied().collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    front.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    front.into_iter().map(|(_, _, s)| s).collect()
}

/// The best of the modes' bests, and the others' goodput relative to it; `None` when no
/// point ran or none served a request within the SLOs (goodput 0 everywhere recommends
/// nothing: every deployment failed the objectives).
pub fn recommend(summaries: &[ModeSummary]) -> Option<PlanRecommendation> {
    let best = summaries.iter().filter_map(|s| s.best).min_by(better)?;
    if best.metrics.goodput_rps <= 0.0 {
        return None;
    }
    let others = summaries
        .iter()
        .filter(|s| s.mode != best.point.mode)
        .filter_map(|s| {
            s.best.map(|b| ModeGap {
                mode: s.mode,
                goodput_ratio: b.metrics.goodput_rps / best.metrics.goodput_rps,
            })
        })
        .collect();
    Some(PlanRecommendation { best, others })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_loadgen::LoadLevel;

    fn scored(index: usize, prefill: u32, goodput: f64, tokens: f64, x: f64) -> Scored {
        Scored {
            index,
            point: PlanPoint {
                mode: ServingMode::Disagg,
                prefill_workers: prefill,
                thresholds: None,
                policy: None,
                load_level: LoadLevel::PLANNED,
            },
            metrics: PointMetrics {
                goodput_rps: goodput,
                goodput_rps_per_gpu: goodput / 8.0,
                tokens_per_s_per_gpu: tokens,
                output_tokens_per_s_per_gpu: tokens / 10.0,
                interactivity_p50: Some(x),
                offered_rps: None,
                bypass_share: None,
            },
        }
    }

    #[test]
    fn the_frontier_keeps_the_undominated_points_by_interactivity() {
        let points = [
            scored(0, 1, 1.0, 100.0, 50.0),
            scored(1, 2, 2.0, 200.0, 40.0),
            scored(2, 3, 2.0, 150.0, 30.0), // dominated by 1
            scored(3, 4, 3.0, 300.0, 20.0),
            scored(4, 5, 0.5, 90.0, 60.0),
        ];
        let front: Vec<usize> = frontier(&points).iter().map(|s| s.index).collect();
        assert_eq!(front, vec![3, 1, 0, 4]);
        // Best: most goodput; on a tie, more throughput per GPU, then fewer prefill workers.
        let best = points.iter().copied().min_by(better).unwrap();
        assert_eq!(best.index, 3);
        let tie = [scored(0, 3, 2.0, 200.0, 1.0), scored(1, 2, 2.0, 200.0, 1.0)];
        assert_eq!(tie.iter().copied().min_by(better).unwrap().index, 1);
    }

    #[test]
    fn nothing_is_recommended_when_no_point_met_the_slos() {
        let summary = |best: Option<Scored>| ModeSummary {
            mode: ServingMode::Disagg,
            measured: usize::from(best.is_some()),
            missing: 0,
            best,
            frontier: Vec::new(),
        };
        assert!(recommend(&[summary(Some(scored(0, 1, 0.0, 100.0, 1.0)))]).is_none());
        assert!(recommend(&[summary(None)]).is_none());
        let rec = recommend(&[summary(Some(scored(0, 1, 0.5, 100.0, 1.0)))]).unwrap();
        assert_eq!(rec.best.metrics.goodput_rps, 0.5);
    }
}
