//! Running a plan's points in virtual time, in parallel and within a time bound.
//!
//! Each point is an independent replay from cold workers (its own engines and router), so the
//! points run on `jobs` OS threads that take the next point from a shared counter. The time
//! bound is the caller's: before starting a point a thread asks `out_of_time`, and once that
//! says yes no further point starts (points already running finish). Points never started
//! are reported as not run, not dropped. The clock stays outside: this module reads none.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use switchyard_loadgen::report::{RunReport, Slo};
use switchyard_loadgen::Workload;

use super::grid::PlanPoint;
use crate::modes::{report_run, run_mode};
use crate::spec::StackSpec;
use crate::tokens::PromptSource;

/// What became of one point.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PointOutcome {
    /// It ran; its report.
    Measured {
        /// The load generator's report of the run.
        report: Box<RunReport>,
    },
    /// The run failed (a setup the stack refused, or a replay that did not finish).
    Failed {
        /// Why.
        error: String,
    },
    /// Not started: the time bound was reached first.
    NotRun,
}

/// One point and its outcome.
#[derive(Debug, Clone, Serialize)]
pub struct PointResult {
    /// The deployment and load level.
    pub point: PlanPoint,
    /// What happened.
    pub outcome: PointOutcome,
}

impl PointResult {
    /// The report, if the point ran.
    pub fn report(&self) -> Option<&RunReport> {
        match &self.outcome {
            PointOutcome::Measured { report } => Some(report),
            _ => None,
        }
    }
}

/// How to run the points.
pub struct Execution<'a> {
    /// Threads at most (at least 1 is used).
    pub jobs: usize,
    /// Asked before each point starts; `true` stops starting points.
    pub out_of_time: &'a (dyn Fn() -> bool + Sync),
    /// Called after each point that ran or failed, with the count so far.
    pub on_point_done: &'a (dyn Fn(usize) + Sync),
}

/// Runs every point of `points` on `workload`: `base` gives the preset, router config,
/// seed and arrival scale; each point sets mode, split, thresholds and load level. Results
/// are in `points` order.
pub fn run_points(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    points: &[PlanPoint],
    slo: Slo,
    execution: &Execution<'_>,
) -> Vec<PointResult> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let outcomes: Mutex<Vec<Option<PointOutcome>>> = Mutex::new(vec![None; points.len()]);
    let threads = execution.jobs.clamp(1, points.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if stopped.load(Ordering::SeqCst) || (execution.out_of_time)() {
                    stopped.store(true, Ordering::SeqCst);
                    return;
                }
                let index = next.fetch_add(1, Ordering::SeqCst);
                let Some(point) = points.get(index) else {
                    return;
                };
                let outcome = run_point(workload, source, base, point, slo);
                if let Ok(mut all) = outcomes.lock() {
                    all[index] = Some(outcome);
                }
                (execution.on_point_done)(done.fetch_add(1, Ordering::SeqCst) + 1);
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    points
        .iter()
        .zip(outcomes)
        .map(|(point, outcome)| PointResult {
            point: *point,
            outcome: outcome.unwrap_or(PointOutcome::NotRun),
        })
        .collect()
}

/// The spec of `point` on top of `base`.
pub fn point_spec(base: &StackSpec, point: &PlanPoint) -> StackSpec {
    let mut spec = StackSpec {
        mode: point.mode,
        prefill_workers: point.prefill_workers,
        arrival_scale: base.arrival_scale.at_level(point.load_level),
        ..base.clone()
    };
    if let Some(policy) = point.policy {
        spec.router.conditional.policy = policy;
    }
    if let Some((threshold, ratio)) = point.thresholds {
        spec.router.conditional.eff_isl_threshold = threshold;
        spec.router.conditional.eff_isl_ratio_threshold = ratio;
    }
    spec
}

fn run_point(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    point: &PlanPoint,
    slo: Slo,
) -> PointOutcome {
    let spec = point_spec(base, point);
    match run_mode(workload, source, spec) {
        Ok(run) => {
            let mut report = report_run(&run, workload, slo, Some(point.label(base.workers)));
            report.meta.load_level = Some(point.load_level);
            PointOutcome::Measured {
                report: Box::new(report),
            }
        }
        Err(e) => PointOutcome::Failed {
            error: e.to_string(),
        },
    }
}
