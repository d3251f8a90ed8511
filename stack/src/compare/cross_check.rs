//! The cross-check: the same runs replayed in virtual time ([`switchyard_sim::replay`]: the
//! same engine model and the control plane's own router, no sockets, no wall clock) and the
//! real/virtual ratios of p50 TTFT and p50 ITL.
//!
//! Both sides use the same workload, the same prompt token ids (the real tokenizer's
//! vocabulary and chat framing), the same workers, split, preset, router config and arrival
//! times. What only the real run has: HTTP, Envoy and the filter, NATS delivery delays,
//! `time_scale`-compressed wall-clock sleeps that the OS rounds up, and two cores shared by
//! every process. The largest part of that, the tokenizations in front of the first engine,
//! is measured on this machine ([`super::gateway_cost`]) and modelled in the replay
//! ([`GatewayModel`]): it delays every request and, in a burst, reorders the requests
//! shortest-first on their way to the engines. The ratios measure the rest.

use std::fmt::Write as _;

use serde::Serialize;
use switchyard_control_plane::config::{RouterConfig, ServingMode as RouterMode};
use switchyard_sim::engine::PerfPreset;
use switchyard_sim::loadgen::report::RunReport;
use switchyard_sim::replay::{report_run, run_mode, GatewayModel, StackSpec};

use super::plan::RunPlan;
use super::workload::PreparedWorkload;
use super::{CompareConfig, CompareError};
use crate::stack::ServingMode;

/// Real/virtual agreement asked for by the comparison issue: within 10 %.
pub const AGREEMENT_TOLERANCE: f64 = 0.10;

/// One run's real and virtual medians.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossCheckRow {
    /// The run.
    pub label: String,
    /// Real p50 TTFT, modelled ms.
    pub real_ttft_p50_ms: Option<f64>,
    /// Virtual p50 TTFT, ms.
    pub virtual_ttft_p50_ms: Option<f64>,
    /// Real p50 ITL, modelled ms.
    pub real_itl_p50_ms: Option<f64>,
    /// Virtual p50 ITL, ms.
    pub virtual_itl_p50_ms: Option<f64>,
    /// Real bypass share.
    pub real_bypass_share: Option<f64>,
    /// Virtual bypass share.
    pub virtual_bypass_share: Option<f64>,
}

fn ratio(real: Option<f64>, virt: Option<f64>) -> Option<f64> {
    match (real, virt) {
        (Some(r), Some(v)) if v > 0.0 && r.is_finite() => Some(r / v),
        _ => None,
    }
}

impl CrossCheckRow {
    /// Real ÷ virtual p50 TTFT.
    pub fn ttft_ratio(&self) -> Option<f64> {
        ratio(self.real_ttft_p50_ms, self.virtual_ttft_p50_ms)
    }

    /// Real ÷ virtual p50 ITL.
    pub fn itl_ratio(&self) -> Option<f64> {
        ratio(self.real_itl_p50_ms, self.virtual_itl_p50_ms)
    }

    /// Both ratios within [`AGREEMENT_TOLERANCE`] of 1.
    pub fn agrees(&self) -> bool {
        let close = |r: Option<f64>| r.is_some_and(|r| (r - 1.0).abs() <= AGREEMENT_TOLERANCE);
        close(self.ttft_ratio()) && close(self.itl_ratio())
    }
}

/// The router's serving mode for a stack mode.
pub fn router_mode(mode: ServingMode) -> RouterMode {
    match mode {
        ServingMode::Agg => RouterMode::Agg,
        ServingMode::Disagg => RouterMode::Disagg,
        ServingMode::Conditional => RouterMode::Conditional,
    }
}

/// Replays every plan in virtual time, with `gateway` as the cost in front of the engines,
/// and reports each like the real run (label, modelled time, same SLOs).
///
/// # Errors
/// [`CompareError::InvalidSetting`] for a router config the router rejects,
/// [`CompareError::Virtual`] if a replay fails.
pub fn virtual_reports(
    config: &CompareConfig,
    prepared: &PreparedWorkload,
    preset: PerfPreset,
    plans: &[RunPlan],
    gateway: GatewayModel,
) -> Result<Vec<RunReport>, CompareError> {
    let router = match &config.conditional_disagg_config {
        Some(text) => {
            let json: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                CompareError::InvalidSetting(format!("--conditional-disagg-config: {e}"))
            })?;
            RouterConfig::from_json(&json).map_err(|e| {
                CompareError::InvalidSetting(format!("--conditional-disagg-config: {e}"))
            })?
        }
        None => RouterConfig::default(),
    };
    let source = prepared.prompt_source();
    let mut reports = Vec::new();
    for plan in plans {
        let mode = router_mode(plan.serving_mode());
        let workers = u32::try_from(plan.split.total()).unwrap_or(u32::MAX);
        let prefill = u32::try_from(plan.split.prefill).unwrap_or(u32::MAX);
        let mut spec = StackSpec::new(mode, workers, prefill);
        spec.preset = preset;
        spec.router = router.clone();
        spec.seed = config.seed;
        spec.time_scale = plan.arrival_multiplier;
        spec.gateway = gateway;
        eprintln!("{}: replaying in virtual time", plan.label);
        let run = run_mode(&prepared.workload, &source, spec).map_err(|source| {
            CompareError::Virtual {
                label: plan.label.clone(),
                source: Box::new(source),
            }
        })?;
        let mut report = report_run(
            &run,
            &prepared.workload,
            config.slo,
            Some(format!("{} (virtual)", plan.label)),
        );
        report.meta.malformed_trace_lines = prepared.malformed_trace_lines;
        reports.push(report);
    }
    Ok(reports)
}

/// Pairs real and virtual reports by position (both in plan order).
pub fn cross_check_rows(real: &[RunReport], virtual_runs: &[RunReport]) -> Vec<CrossCheckRow> {
    real.iter()
        .zip(virtual_runs)
        .map(|(r, v)| CrossCheckRow {
            label: r.meta.label.clone(),
            real_ttft_p50_ms: r.ttft_ms.p50,
            virtual_ttft_p50_ms: v.ttft_ms.p50,
            real_itl_p50_ms: r.itl_ms.p50,
            virtual_itl_p50_ms: v.itl_ms.p50,
            real_bypass_share: r.routes.bypass_share,
            virtual_bypass_share: v.routes.bypass_share,
        })
        .collect()
}

/// The cross-check as a markdown table.
pub fn cross_check_markdown(rows: &[CrossCheckRow]) -> String {
    let n = |x: Option<f64>, d: usize| x.map_or_else(|| "–".into(), |x| format!("{x:.d$}"));
    let pct = |x: Option<f64>| x.map_or_else(|| "–".into(), |x| format!("{:.0} %", x * 100.0));
    let mut out = String::from(
        "| run | TTFT p50 real / virtual (ms) | ratio | ITL p50 real / virtual (ms) | ratio \
         | bypass real / virtual | within 10 % |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} | {} / {} | {} | {} / {} | {} |",
            r.label,
            n(r.real_ttft_p50_ms, 0),
            n(r.virtual_ttft_p50_ms, 0),
            n(r.ttft_ratio(), 2),
            n(r.real_itl_p50_ms, 2),
            n(r.virtual_itl_p50_ms, 2),
            n(r.itl_ratio(), 2),
            pct(r.real_bypass_share),
            pct(r.virtual_bypass_share),
            if r.agrees() { "yes" } else { "no" },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ttft: (f64, f64), itl: (f64, f64)) -> CrossCheckRow {
        CrossCheckRow {
            label: "agg@x1".into(),
            real_ttft_p50_ms: Some(ttft.0),
            virtual_ttft_p50_ms: Some(ttft.1),
            real_itl_p50_ms: Some(itl.0),
            virtual_itl_p50_ms: Some(itl.1),
            real_bypass_share: None,
            virtual_bypass_share: None,
        }
    }

    #[test]
    fn agreement_needs_both_medians_within_ten_percent() {
        assert!(row((105.0, 100.0), (9.5, 10.0)).agrees());
        assert!(!row((120.0, 100.0), (10.0, 10.0)).agrees());
        assert!(!row((100.0, 100.0), (8.0, 10.0)).agrees());
        let mut missing = row((100.0, 100.0), (10.0, 10.0));
        missing.virtual_itl_p50_ms = None;
        assert!(!missing.agrees());
        assert_eq!(missing.itl_ratio(), None);
        let md = cross_check_markdown(&[row((120.0, 100.0), (10.0, 10.0))]);
        assert!(md.contains("| agg@x1 | 120 / 100 | 1.20 |"), "{md}");
        assert!(md.trim_end().ends_with("| no |"), "{md}");
    }
}
