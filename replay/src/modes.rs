//! The three serving modes on equal GPUs, each from cold workers, on the same workload and
//! seed, reported with the load generator's own report code.
//!
//! - `agg`: all N workers aggregated (prefill and decode on the same worker).
//! - `disagg`: P prefill + (N − P) decode workers; every request prefilled remotely.
//! - `conditional`: the same split; the router's policy bypasses the prefill pool per request.
//!
//! A comparison of several modes and load levels goes through the load generator's harness
//! ([`switchyard_loadgen::compare`]) with the [`VirtualBackend`];
//! [`compare_modes`] is that harness at the spec's own arrival scale.

use serde::Serialize;
use switchyard_engine::SpeedUp;
use switchyard_loadgen::compare::{run_comparison, ComparisonPlan, HarnessError, PrefillWorkers};
use switchyard_loadgen::report::{build_report, RunMeta, RunReport, Slo};
use switchyard_loadgen::{LoadLevel, Workload};
use switchyard_router::config::ServingMode;

use super::backend::VirtualBackend;
use super::spec::{ReplayRun, StackSpec};
use super::stack::VirtualStack;
use super::tokens::PromptSource;
use super::ReplayError;

/// Endpoint name virtual runs put in their reports.
pub const VIRTUAL_ENDPOINT: &str = "virtual-time";

/// One mode's run and its report.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRun {
    /// The run (records, route notes, counters).
    pub run: ReplayRun,
    /// The load generator's report of its records.
    pub report: RunReport,
}

/// Replays `workload` once on cold workers as `spec` describes.
///
/// # Errors
/// See [`ReplayError`].
pub fn run_mode(
    workload: &Workload,
    source: &PromptSource,
    spec: StackSpec,
) -> Result<ReplayRun, ReplayError> {
    VirtualStack::new(spec, workload, source)?.run()
}

/// The report of a run, labelled `label` (the mode name and arrival scale when `None`).
/// Virtual records are in modelled time already: no speed-up to convert back from.
pub fn report_run(
    run: &ReplayRun,
    workload: &Workload,
    slo: Slo,
    label: Option<String>,
) -> RunReport {
    let spec = &run.spec;
    let mode = spec.mode.as_str();
    let meta = RunMeta {
        label: label.unwrap_or_else(|| format!("{mode}@arrival-x{}", spec.arrival_scale)),
        mode: Some(mode.to_string()),
        workload: workload.name.clone(),
        endpoint: VIRTUAL_ENDPOINT.to_string(),
        gpus: spec.gpus(),
        arrival_scale: spec.arrival_scale,
        load_level: None,
        seed: spec.seed,
        planned_requests: workload.requests.len(),
        malformed_trace_lines: 0,
        offered_rps: workload.offered_rps(spec.arrival_scale),
        speed_up: SpeedUp::REAL,
        interrupted: None,
    };
    build_report(meta, &run.records, run.not_sent, slo)
}

/// Runs each of `modes` from cold workers with `base` otherwise unchanged (same workers,
/// prefill split, router config, arrival scale and seed), and reports each.
///
/// # Errors
/// The first [`ReplayError`]; a split the plan refuses is [`ReplayError::InvalidSetup`].
pub fn compare_modes(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    modes: &[ServingMode],
    slo: Slo,
) -> Result<Vec<ModeRun>, ReplayError> {
    let plan = ComparisonPlan {
        modes: modes.to_vec(),
        load_levels: vec![LoadLevel::PLANNED],
        arrival_scale: base.arrival_scale,
        workers: base.workers,
        prefill: PrefillWorkers::Count(base.prefill_workers),
    };
    let mut backend = VirtualBackend::new(workload, source, base.clone(), slo);
    let comparison = crate::backend::block_on(run_comparison(&plan, &mut backend, None)).map_err(
        |e| match e {
            HarnessError::Backend { source, .. } => source,
            other => ReplayError::InvalidSetup(other.to_string()),
        },
    )?;
    Ok(comparison
        .runs
        .into_iter()
        .map(|r| ModeRun {
            run: r.detail.into_run(r.records),
            report: r.report,
        })
        .collect())
}
