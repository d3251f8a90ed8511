//! Threshold sweeps in virtual time: the same workload in conditional mode under a grid of
//! `isl_bounding` thresholds, each run from cold workers, to see how the bypass share, TTFT
//! and ITL move with them.

use std::fmt::Write as _;

use serde::Serialize;
use switchyard_router::config::{PolicyKind, ServingMode};

use super::modes::{report_run, run_mode};
use super::spec::StackSpec;
use super::tokens::PromptSource;
use super::ReplayError;
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::stats::Summary;
use switchyard_loadgen::Workload;

/// The thresholds to try: every combination of the two lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThresholdGrid {
    /// `eff_isl_threshold` values, tokens.
    pub eff_isl_thresholds: Vec<u32>,
    /// `eff_isl_ratio_threshold` values, in [0, 1].
    pub ratio_thresholds: Vec<f64>,
}

impl Default for ThresholdGrid {
    /// From "never bypass" (0) through the default (2048, 0.7) to "bypass almost anything".
    fn default() -> Self {
        ThresholdGrid {
            eff_isl_thresholds: vec![0, 512, 1024, 2048, 4096, 8192, 16384],
            ratio_thresholds: vec![0.7],
        }
    }
}

/// One point of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    /// `eff_isl_threshold` used.
    pub eff_isl_threshold: u32,
    /// `eff_isl_ratio_threshold` used.
    pub ratio_threshold: f64,
    /// Share of routed requests bypassed.
    pub bypass_share: f64,
    /// TTFT, ms.
    pub ttft_ms: Summary,
    /// ITL, ms.
    pub itl_ms: Summary,
    /// E2E, ms.
    pub e2e_ms: Summary,
    /// Output tokens/s per GPU.
    pub output_tokens_per_s_per_gpu: f64,
    /// Requests/s meeting the SLOs.
    pub goodput_rps: f64,
    /// Requests meeting the SLOs (every successful one without SLOs).
    pub goodput_requests: usize,
    /// Tokens moved by KV transfers.
    pub transfer_tokens: u64,
    /// Requests that failed.
    pub failed: usize,
}

/// Runs `base` in conditional mode with the `isl_bounding` policy at every grid point, in
/// grid order (ratio thresholds outer, ISL thresholds inner).
///
/// # Errors
/// The first [`ReplayError`] (an out-of-range ratio is a router config error).
pub fn sweep_thresholds(
    workload: &Workload,
    source: &PromptSource,
    base: &StackSpec,
    grid: &ThresholdGrid,
    slo: Slo,
) -> Result<Vec<SweepPoint>, ReplayError> {
    let mut points = Vec::new();
    for &ratio in &grid.ratio_thresholds {
        for &threshold in &grid.eff_isl_thresholds {
            let mut spec = StackSpec {
                mode: ServingMode::Conditional,
                ..base.clone()
            };
            spec.router.conditional.policy = PolicyKind::IslBounding;
            spec.router.conditional.eff_isl_threshold = threshold;
            spec.router.conditional.eff_isl_ratio_threshold = ratio;
            let run = run_mode(workload, source, spec)?;
            let report = report_run(&run, workload, slo, None);
            points.push(SweepPoint {
                eff_isl_threshold: threshold,
                ratio_threshold: ratio,
                bypass_share: report.routes.bypass_share.unwrap_or(0.0),
                ttft_ms: report.ttft_ms,
                itl_ms: report.itl_ms,
                e2e_ms: report.e2e_ms,
                output_tokens_per_s_per_gpu: report.throughput.output_tokens_per_s_per_gpu,
                goodput_rps: report.goodput.requests_per_s,
                goodput_requests: report.goodput.requests,
                transfer_tokens: run.counters.transfer_tokens,
                failed: report.requests.failed,
            });
        }
    }
    Ok(points)
}

/// The sweep as a markdown table.
pub fn sweep_markdown(points: &[SweepPoint]) -> String {
    let v = |x: Option<f64>, d: usize| x.map_or_else(|| "–".to_string(), |x| format!("{x:.d$}"));
    let mut out = String::from(
        "| eff_isl_threshold | ratio | bypass | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) \
         | out tok/s/GPU | goodput req/s | KV moved (M tokens) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.1} % | {} / {} / {} | {} / {} / {} | {:.1} | {:.2} | {:.1} |",
            p.eff_isl_threshold,
            p.ratio_threshold,
            p.bypass_share * 100.0,
            v(p.ttft_ms.p50, 0),
            v(p.ttft_ms.p90, 0),
            v(p.ttft_ms.p99, 0),
            v(p.itl_ms.p50, 1),
            v(p.itl_ms.p90, 1),
            v(p.itl_ms.p99, 1),
            p.output_tokens_per_s_per_gpu,
            p.goodput_rps,
            p.transfer_tokens as f64 / 1e6,
        );
    }
    out
}
