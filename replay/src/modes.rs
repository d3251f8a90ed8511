//! The three serving modes on equal GPUs, each from cold workers, on the same workload and
//! seed, reported with the load generator's own report code.
//!
//! - `agg`: all N workers aggregated (prefill and decode on the same worker).
//! - `disagg`: P prefill + (N − P) decode workers; every request prefilled remotely.
//! - `conditional`: the same split; the router's policy bypasses the prefill pool per request.

use serde::Serialize;
use switchyard_router::config::ServingMode;

use super::spec::{ReplayRun, StackSpec};
use super::stack::VirtualStack;
use super::tokens::PromptSource;
use super::ReplayError;
use switchyard_loadgen::report::{build_report, RunMeta, RunReport, Slo};
use switchyard_loadgen::Workload;

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

/// The report of a run, labelled `label` (the mode name and time scale when `None`).
pub fn report_run(
    run: &ReplayRun,
    workload: &Workload,
    slo: Slo,
    label: Option<String>,
) -> RunReport {
    let spec = &run.spec;
    let mode = spec.mode.as_str();
    let meta = RunMeta {
        label: label.unwrap_or_else(|| format!("{mode}@x{}", spec.time_scale)),
        mode: Some(mode.to_string()),
        workload: workload.name.clone(),
        endpoint: VIRTUAL_ENDPOINT.to_string(),
        gpus: spec.gpus(),
        time_scale: spec.time_scale,
        seed: spec.seed,
        planned_requests: workload.requests.len(),
        malformed_trace_lines: 0,
        offered_rps: workload.offered_rps(spec.time_scale),
        sim_speedup: 0.0,
    };
    build_report(meta, &run.records, run.not_sent, slo)
}

/// Runs each of `modes` from cold workers with `base` otherwise unchanged (same workers,
/// prefill split, router config and seed), and reports each.
///
/// # Errors
/// The first [`ReplayError`].
pub fn compare_modes(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    modes: &[ServingMode],
    slo: Slo,
) -> Result<Vec<ModeRun>, ReplayError> {
    modes
        .iter()
        .map(|&mode| {
            let spec = StackSpec {
                mode,
                ..base.clone()
            };
            let run = run_mode(workload, source, spec)?;
            let report = report_run(&run, workload, slo, None);
            Ok(ModeRun { run, report })
        })
        .collect()
}
