//! The deployments a plan tries on a GPU budget of N workers: agg (one point), disagg at
//! every prefill:decode split P:(N−P), P = 1..N−1, and conditional at every split and every
//! threshold pair of the sweep grid, each at every load level. Pure: no runs.

use serde::Serialize;
use switchyard_loadgen::compare::plan::first_repeat;
use switchyard_loadgen::LoadLevel;
use switchyard_router::config::{PolicyKind, ServingMode};

use crate::sweep::ThresholdGrid;

/// What to sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSpace {
    /// Workers in every deployment (the GPU budget ÷ GPUs per worker).
    pub workers: u32,
    /// Modes to try.
    pub modes: Vec<ServingMode>,
    /// Offered-load multipliers; every deployment runs at each.
    pub load_levels: Vec<LoadLevel>,
    /// `isl_bounding` thresholds tried in conditional mode.
    pub thresholds: ThresholdGrid,
    /// Also try conditional mode under `slo_cost` (no thresholds) at every split.
    pub slo_cost: bool,
}

/// One deployment at one load level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlanPoint {
    /// Serving mode.
    pub mode: ServingMode,
    /// Prefill workers (0 for agg); the other workers decode.
    pub prefill_workers: u32,
    /// `(eff_isl_threshold, eff_isl_ratio_threshold)` in conditional mode under
    /// `isl_bounding`; `None` under `slo_cost` and in the other modes.
    pub thresholds: Option<(u32, f64)>,
    /// The conditional policy (`None` in agg and disagg mode).
    pub policy: Option<PolicyKind>,
    /// Offered-load multiplier.
    pub load_level: LoadLevel,
}

impl PlanPoint {
    /// A short name: `agg`, `disagg 3:5`, `conditional 3:5 t=2048 r=0.7`,
    /// `conditional 3:5 slo_cost`.
    pub fn label(&self, workers: u32) -> String {
        let split = |p: u32| format!("{p}:{}", workers - p);
        match (self.mode, self.thresholds) {
            (ServingMode::Agg, _) => "agg".into(),
            (mode, None) if self.policy == Some(PolicyKind::SloCost) => {
                format!("{} {} slo_cost", mode.as_str(), split(self.prefill_workers))
            }
            (mode, None) => format!("{} {}", mode.as_str(), split(self.prefill_workers)),
            (mode, Some((t, r))) => {
                format!(
                    "{} {} t={t} r={r}",
                    mode.as_str(),
                    split(self.prefill_workers)
                )
            }
        }
    }
}

/// Why a plan space is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpaceError {
    /// No workers.
    #[error("the GPU budget must hold at least one worker")]
    NoWorkers,
    /// Split modes need a prefill and a decode worker.
    #[error("{0} needs at least 2 workers (one prefill, one decode)")]
    TooFewWorkers(&'static str),
    /// Nothing to sweep.
    #[error("give at least one {0}")]
    Empty(&'static str),
    /// A ratio threshold outside [0, 1].
    #[error("a ratio threshold must be in [0, 1], got {0}")]
    Ratio(f64),
    /// A value given twice: the plan would run the same points twice, or silently once.
    #[error("{0} {1} is given twice")]
    Repeated(&'static str, String),
}

/// Checks the threshold grid of a conditional sweep: at least one value of each, no value
/// twice (the same points would run twice), ratios in [0, 1]. The planner and
/// `switchyard-replay --sweep` both check theirs here.
///
/// # Errors
/// [`SpaceError::Empty`], [`SpaceError::Repeated`] or [`SpaceError::Ratio`].
pub fn check_grid(grid: &ThresholdGrid) -> Result<(), SpaceError> {
    if grid.eff_isl_thresholds.is_empty() || grid.ratio_thresholds.is_empty() {
        return Err(SpaceError::Empty(
            "threshold and ratio for conditional mode",
        ));
    }
    if let Some(t) = first_repeat(&grid.eff_isl_thresholds) {
        return Err(SpaceError::Repeated("ISL threshold", t.to_string()));
    }
    if let Some(r) = first_repeat(&grid.ratio_thresholds) {
        return Err(SpaceError::Repeated("ratio threshold", r.to_string()));
    }
    match grid
        .ratio_thresholds
        .iter()
        .find(|r| !(0.0..=1.0).contains(*r))
    {
        Some(&r) => Err(SpaceError::Ratio(r)),
        None => Ok(()),
    }
}

/// Every point of `space`, load levels outer, then agg, then per split disagg and the
/// conditional thresholds (ratio outer, ISL threshold inner).
///
/// # Errors
/// [`SpaceError`] for a space that has nothing to run or a split mode without 2 workers.
pub fn plan_points(space: &PlanSpace) -> Result<Vec<PlanPoint>, SpaceError> {
    let n = space.workers;
    if n == 0 {
        return Err(SpaceError::NoWorkers);
    }
    if space.modes.is_empty() {
        return Err(SpaceError::Empty("mode"));
    }
    if space.load_levels.is_empty() {
        return Err(SpaceError::Empty("load level"));
    }
    let grid = &space.thresholds;
    let text = |value: &dyn std::fmt::Display| value.to_string();
    for (what, repeat) in [
        (
            "mode",
            first_repeat(&space.modes).map(|m| m.as_str().to_string()),
        ),
        (
            "load level",
            first_repeat(&space.load_levels).map(|l| text(l)),
        ),
    ] {
        if let Some(value) = repeat {
            return Err(SpaceError::Repeated(what, value));
        }
    }
    if space.modes.contains(&ServingMode::Conditional) {
        check_grid(grid)?;
    }
    for mode in &space.modes {
        if *mode != ServingMode::Agg && n < 2 {
            return Err(SpaceError::TooFewWorkers(mode.as_str()));
        }
    }
    let mut points = Vec::new();
    for &load_level in &space.load_levels {
        let point = |mode, prefill_workers, thresholds| PlanPoint {
            mode,
            prefill_workers,
            thresholds,
            policy: (mode == ServingMode::Conditional).then_some(PolicyKind::IslBounding),
            load_level,
        };
        if space.modes.contains(&ServingMode::Agg) {
            points.push(point(ServingMode::Agg, 0, None));
        }
        for p in 1..n {
            if space.modes.contains(&ServingMode::Disagg) {
                points.push(point(ServingMode::Disagg, p, None));
            }
            if space.modes.contains(&ServingMode::Conditional) {
                for &r in &grid.ratio_thresholds {
                    for &t in &grid.eff_isl_thresholds {
                        points.push(point(ServingMode::Conditional, p, Some((t, r))));
                    }
                }
                if space.slo_cost {
                    points.push(PlanPoint {
                        policy: Some(PolicyKind::SloCost),
                        ..point(ServingMode::Conditional, p, None)
                    });
                }
            }
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(workers: u32, modes: Vec<ServingMode>) -> PlanSpace {
        PlanSpace {
            workers,
            modes,
            load_levels: vec![LoadLevel::PLANNED, LoadLevel::new(2.0).unwrap()],
            thresholds: ThresholdGrid {
                eff_isl_thresholds: vec![0, 2048],
                ratio_thresholds: vec![0.7],
            },
            slo_cost: false,
        }
    }

    #[test]
    fn every_split_and_threshold_at_every_level() {
        let all = vec![
            ServingMode::Agg,
            ServingMode::Disagg,
            ServingMode::Conditional,
        ];
        let points = plan_points(&space(4, all)).unwrap();
        // Per level: agg 1 + disagg 3 + conditional 3 × 2.
        assert_eq!(points.len(), 2 * (1 + 3 + 6));
        let labels: Vec<String> = points[..4].iter().map(|p| p.label(4)).collect();
        assert_eq!(
            labels,
            vec![
                "agg",
                "disagg 1:3",
                "conditional 1:3 t=0 r=0.7",
                "conditional 1:3 t=2048 r=0.7"
            ]
        );
        assert!(points[10..].iter().all(|p| p.load_level.factor() == 2.0));
        let only_agg = plan_points(&space(1, vec![ServingMode::Agg])).unwrap();
        assert_eq!(only_agg.len(), 2);
    }

    #[test]
    fn slo_cost_adds_one_conditional_point_per_split() {
        let mut s = space(3, vec![ServingMode::Conditional]);
        s.slo_cost = true;
        let points = plan_points(&s).unwrap();
        // Per level and split: two threshold pairs and slo_cost.
        assert_eq!(points.len(), 2 * 2 * 3);
        assert_eq!(points[2].label(3), "conditional 1:2 slo_cost");
        assert_eq!(points[2].policy, Some(PolicyKind::SloCost));
        assert_eq!(points[2].thresholds, None);
        assert_eq!(points[0].policy, Some(PolicyKind::IslBounding));
    }

    #[test]
    fn unusable_spaces_are_named() {
        assert_eq!(
            plan_points(&space(1, vec![ServingMode::Disagg])),
            Err(SpaceError::TooFewWorkers("disagg"))
        );
        assert_eq!(
            plan_points(&space(0, vec![ServingMode::Agg])),
            Err(SpaceError::NoWorkers)
        );
        let mut bad = space(3, vec![ServingMode::Conditional]);
        bad.thresholds.ratio_thresholds = vec![1.5];
        assert_eq!(plan_points(&bad), Err(SpaceError::Ratio(1.5)));
        bad.thresholds.eff_isl_thresholds.clear();
        assert!(plan_points(&bad).is_err());
    }

    #[test]
    fn values_given_twice_are_refused_not_merged() {
        let twice = space(3, vec![ServingMode::Agg, ServingMode::Agg]);
        assert_eq!(
            plan_points(&twice),
            Err(SpaceError::Repeated("mode", "agg".into()))
        );
        let mut levels = space(3, vec![ServingMode::Agg]);
        levels.load_levels.push(LoadLevel::PLANNED);
        assert_eq!(
            plan_points(&levels),
            Err(SpaceError::Repeated("load level", "1".into()))
        );
        let mut thresholds = space(3, vec![ServingMode::Conditional]);
        thresholds.thresholds.eff_isl_thresholds = vec![0, 2048, 0];
        assert_eq!(
            plan_points(&thresholds),
            Err(SpaceError::Repeated("ISL threshold", "0".into()))
        );
        thresholds.thresholds.eff_isl_thresholds = vec![0];
        thresholds.thresholds.ratio_thresholds = vec![0.7, 0.7];
        assert_eq!(
            plan_points(&thresholds),
            Err(SpaceError::Repeated("ratio threshold", "0.7".into()))
        );
    }
}
