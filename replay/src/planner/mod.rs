//! The deployment planner: on a GPU budget and two SLOs, which serving mode, prefill:decode
//! split and conditional thresholds serve the workload best, measured in virtual time.
//!
//! - [`grid`]: the points to try (agg; disagg at every split; conditional at every split and
//!   threshold pair; each at every load level);
//! - [`execute`]: running them in parallel within a time bound;
//! - [`analysis`]: best per mode, frontiers, the recommendation;
//! - [`policies`]: with `slo_cost` planned, the policy comparison per load level (issue #15's
//!   bars);
//! - [`render`]: markdown, JSON and SVG.
//!
//! `docs/planner.md` describes it for users (`switchyard-plan`).

pub mod analysis;
pub mod execute;
pub mod grid;
pub mod policies;
pub mod render;

use serde::Serialize;
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::{LoadLevel, Workload};

pub use analysis::{
    recommend, summarize, ModeGap, ModeSummary, PlanRecommendation, PointMetrics, Scored,
};
pub use execute::{run_points, Execution, PointOutcome, PointResult};
pub use grid::{check_grid, plan_points, PlanPoint, PlanSpace, SpaceError};
pub use policies::{policy_markdown, policy_rows, PolicyRow};
pub use render::{plan_markdown, write_plan, WritePlanError};

use crate::ceiling::{goodput_ceiling, GoodputCeiling};
use crate::spec::StackSpec;
use crate::tokens::PromptSource;

/// Everything a plan found.
#[derive(Debug, Clone, Serialize)]
pub struct PlanOutcome {
    /// What was swept.
    pub space: PlanSpace,
    /// The SLOs goodput counts against.
    pub slo: Slo,
    /// GPUs of every deployment.
    pub gpus: u32,
    /// Every point, in sweep order, with its outcome.
    pub results: Vec<PointResult>,
    /// Per mode: best point and frontier.
    pub summaries: Vec<ModeSummary>,
    /// The recommended deployment (`None` if nothing ran).
    pub recommendation: Option<PlanRecommendation>,
    /// Per load level (in `space.load_levels` order), the most goodput any deployment could
    /// reach ([`crate::ceiling`]).
    pub ceilings: Vec<LevelCeiling>,
}

/// Failed requests over a plan's points (see [`PlanOutcome::failed_requests`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailedRequests {
    /// Points that failed at least one request.
    pub points: usize,
    /// The most requests one point failed.
    pub most: usize,
    /// Requests that point sent.
    pub of: usize,
}

/// The goodput ceiling at one load level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LevelCeiling {
    /// The level.
    pub load_level: LoadLevel,
    /// The bound.
    pub ceiling: GoodputCeiling,
}

impl PlanOutcome {
    /// Points that ran.
    pub fn measured(&self) -> usize {
        self.results.iter().filter(|r| r.report().is_some()).count()
    }

    /// Points whose run failed.
    pub fn failed(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, PointOutcome::Failed { .. }))
            .count()
    }

    /// Of the points that ran: how many failed requests (errors, not SLO misses), and the
    /// most requests one of them failed, of how many sent.
    pub fn failed_requests(&self) -> FailedRequests {
        let mut failed = FailedRequests::default();
        for report in self.results.iter().filter_map(PointResult::report) {
            if report.requests.failed > 0 {
                failed.points += 1;
                if report.requests.failed > failed.most {
                    failed.most = report.requests.failed;
                    failed.of = report.requests.sent;
                }
            }
        }
        failed
    }

    /// Whether points ran and none served a single request: nothing any deployment here
    /// can do (prompts or outputs beyond what a worker holds), not a matter of load or SLOs.
    pub fn nothing_served(&self) -> bool {
        self.measured() > 0
            && (self.results.iter().filter_map(PointResult::report)).all(|r| r.requests.ok == 0)
    }

    /// Points not started before the time bound.
    pub fn not_run(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, PointOutcome::NotRun))
            .count()
    }
}

/// Sweeps `space` on `workload` (`base`: preset, router defaults, seed, arrival scale) and
/// analyses the results.
///
/// # Errors
/// [`SpaceError`] for a space with nothing to run.
pub fn plan_deployment(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    space: &PlanSpace,
    slo: Slo,
    execution: &Execution<'_>,
) -> Result<PlanOutcome, SpaceError> {
    let points = plan_points(space)?;
    let base = StackSpec {
        workers: space.workers,
        ..base.clone()
    };
    let results = run_points(workload, source, &base, &points, slo, execution);
    let summaries = summarize(&results, &space.modes);
    let recommendation = recommend(&summaries);
    let perf = base.preset.perf();
    let ceilings = space
        .load_levels
        .iter()
        .map(|&load_level| LevelCeiling {
            load_level,
            ceiling: goodput_ceiling(
                workload,
                &perf,
                (base.preset.kv_capacity_tokens(), base.max_model_len),
                base.arrival_scale.at_level(load_level),
            ),
        })
        .collect();
    Ok(PlanOutcome {
        space: space.clone(),
        slo,
        gpus: base.gpus(),
        results,
        summaries,
        recommendation,
        ceilings,
    })
}
