//! What a comparison on the real stack produced: the harness's runs, and with
//! `--cross-check` the same runs in virtual time and how far apart the two are.

use serde::Serialize;
use switchyard_loadgen::compare::RunResult;
use switchyard_loadgen::report::RunReport;
use switchyard_replay::GatewayModel;

use super::cross_check::CrossCheckRow;
use super::real_backend::RealDetail;

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct StackComparison {
    /// Every run, in plan order.
    pub runs: Vec<RunResult<RealDetail>>,
    /// The virtual-time reports of the same runs (with `--cross-check`).
    pub virtual_runs: Vec<RunReport>,
    /// Real/virtual ratios per run (with `--cross-check`).
    pub cross_check: Vec<CrossCheckRow>,
    /// The gateway cost the virtual runs modelled, measured on this machine (with
    /// `--cross-check`).
    pub gateway_model: Option<GatewayModel>,
    /// Workload name and size.
    pub workload: String,
    /// Requests per run.
    pub requests: usize,
    /// Malformed trace lines skipped.
    pub malformed_trace_lines: usize,
    /// The workers' performance preset.
    pub preset: String,
    /// GPUs per worker under that preset.
    pub gpus_per_worker: u32,
}

impl StackComparison {
    /// The real runs' reports, in plan order.
    pub fn reports(&self) -> Vec<RunReport> {
        self.runs.iter().map(|r| r.report.clone()).collect()
    }
}
