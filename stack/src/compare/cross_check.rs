//! The cross-check: the same runs replayed in virtual time ([`switchyard_replay`]: the
//! same engine model and the control plane's own router, no sockets, no wall clock) and the
//! real/virtual ratios of p50 TTFT and p50 ITL.
//!
//! Both sides use the same workload, the same prompt token ids (the real tokenizer's
//! vocabulary and chat framing), the same workers, split, preset, router config and arrival
//! times, and the same harness ([`switchyard_loadgen::compare`]) with the virtual-time
//! backend ([`VirtualBackend`]). What only the real run has: HTTP, Envoy and the filter, NATS
//! delivery delays, `speed_up`-compressed wall-clock sleeps that the OS rounds up, and two
//! cores shared by
//! every process. The largest part of that, the tokenizations in front of the first engine,
//! is measured on this machine ([`super::gateway_cost`]) and modelled in the replay
//! ([`GatewayModel`]): it delays every request and, in a burst, reorders the requests
//! shortest-first on their way to the engines. The ratios measure the rest.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;
use switchyard_engine::{PerfPreset, SpeedUp};
use switchyard_loadgen::compare::output::{run_dir, write_json_lines};
use switchyard_loadgen::compare::{run_comparison, HarnessError, RunResult};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::report::{parse_route, RunReport};
use switchyard_replay::{GatewayModel, StackSpec, VirtualBackend, VirtualDetail};
use switchyard_router::config::ServingMode;

use super::real_backend::RealDetail;
use super::workload::PreparedWorkload;
use super::{CompareConfig, CompareError};

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
    /// Requests that failed open on the real stack.
    pub real_fail_open: usize,
    /// Requests that failed open in virtual time.
    pub virtual_fail_open: usize,
    /// Requests that failed open on both.
    pub both_fail_open: usize,
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

/// Replays every real run's plan in virtual time through the harness, with `gateway` as the
/// cost in front of the engines and the real run's send times (`real_send_times`),
/// writes its records next to the real ones, and reports each like the real run (label
/// `<run> (virtual)`, modelled time, same SLOs).
///
/// # Errors
/// [`CompareError::InvalidSetting`] for a router config the router rejects,
/// [`CompareError::Virtual`] if a replay fails.
pub async fn virtual_runs(
    config: &CompareConfig,
    prepared: &PreparedWorkload,
    preset: PerfPreset,
    real: &[RunResult<RealDetail>],
    gateway: GatewayModel,
) -> Result<Vec<RunResult<VirtualDetail>>, CompareError> {
    let (_, router) = config.router()?;
    let source = prepared.prompt_source();
    // The split mode's stack; `VirtualBackend::spec` sets each run's mode and split.
    let mut base = StackSpec::new(ServingMode::Conditional, config.workers, 1);
    base.preset = preset;
    base.router = router;
    base.seed = config.seed;
    base.gateway = gateway;
    let mut backend = VirtualBackend::new(&prepared.workload, &source, base, config.slo);
    backend.label_suffix = " (virtual)".into();
    backend.malformed_trace_lines = prepared.malformed_trace_lines;
    let requests = prepared.workload.requests.len();
    for run in real {
        let sent = real_send_times(run, config.speed_up, requests);
        backend.send_times.insert(run.run.label.clone(), sent);
    }
    let comparison = run_comparison(&config.plan(), &mut backend, None)
        .await
        .map_err(|e| match e {
            HarnessError::Backend { label, source } => CompareError::Virtual {
                label,
                source: Box::new(source),
            },
            HarnessError::Plan(e) => CompareError::Plan(e),
            HarnessError::Output(e) => CompareError::Output(e),
        })?;
    for run in &comparison.runs {
        let dir = run_dir(&config.out, &run.run.label);
        write_json_lines(&dir, "virtual-records.jsonl", &run.records)?;
    }
    Ok(comparison.runs)
}

/// When the real client sent each request, in modelled ms by request id (NaN for requests
/// it did not send): wall ms × the workers' speed-up. Both sides then get the same arrival
/// process (see [`StackSpec::sent_ms`]).
fn real_send_times(run: &RunResult<RealDetail>, speed_up: SpeedUp, requests: usize) -> Vec<f64> {
    let mut sent = vec![f64::NAN; requests];
    for record in &run.records {
        if let Some(slot) = sent.get_mut(record.id) {
            *slot = speed_up.model_ms(record.sent_ms);
        }
    }
    sent
}

/// Ids of the records that failed open (by the same parse as the report's route counts).
fn failed_open(records: &[RequestRecord]) -> BTreeSet<usize> {
    records
        .iter()
        .filter(|r| {
            r.route
                .as_deref()
                .is_some_and(|h| parse_route(h).0 == "fail-open")
        })
        .map(|r| r.id)
        .collect()
}

/// One run's real and virtual side: its report and its records.
pub type Side<'a> = (&'a RunReport, &'a [RequestRecord]);

/// A run's side of the comparison.
pub fn side<D>(run: &RunResult<D>) -> Side<'_> {
    (&run.report, &run.records)
}

/// Pairs real and virtual runs by position (both in plan order).
pub fn cross_check_rows(real: &[Side<'_>], virtual_runs: &[Side<'_>]) -> Vec<CrossCheckRow> {
    real.iter()
        .zip(virtual_runs)
        .map(|((r, r_records), (v, v_records))| {
            let (real_open, virtual_open) = (failed_open(r_records), failed_open(v_records));
            CrossCheckRow {
                label: r.meta.label.clone(),
                real_ttft_p50_ms: r.ttft_ms.p50,
                virtual_ttft_p50_ms: v.ttft_ms.p50,
                real_itl_p50_ms: r.itl_ms.p50,
                virtual_itl_p50_ms: v.itl_ms.p50,
                real_bypass_share: r.routes.bypass_share,
                virtual_bypass_share: v.routes.bypass_share,
                real_fail_open: real_open.len(),
                virtual_fail_open: virtual_open.len(),
                both_fail_open: real_open.intersection(&virtual_open).count(),
            }
        })
        .collect()
}

/// The cross-check as a markdown table.
pub fn cross_check_markdown(rows: &[CrossCheckRow]) -> String {
    let n = |x: Option<f64>, d: usize| x.map_or_else(|| "–".into(), |x| format!("{x:.d$}"));
    let pct = |x: Option<f64>| x.map_or_else(|| "–".into(), |x| format!("{:.0} %", x * 100.0));
    let mut out = String::from(
        "| run | TTFT p50 real / virtual (ms) | ratio | ITL p50 real / virtual (ms) | ratio \
         | bypass real / virtual | fail-open real / virtual (both) | within 10 % \
         |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} | {} / {} | {} | {} / {} | {} / {} ({}) | {} |",
            r.label,
            n(r.real_ttft_p50_ms, 0),
            n(r.virtual_ttft_p50_ms, 0),
            n(r.ttft_ratio(), 2),
            n(r.real_itl_p50_ms, 2),
            n(r.virtual_itl_p50_ms, 2),
            n(r.itl_ratio(), 2),
            pct(r.real_bypass_share),
            pct(r.virtual_bypass_share),
            r.real_fail_open,
            r.virtual_fail_open,
            r.both_fail_open,
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
            real_fail_open: 0,
            virtual_fail_open: 0,
            both_fail_open: 0,
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
        assert!(md.contains("| 0 / 0 (0) | no |"), "{md}");
        assert!(md.contains("| agg@x1 | 120 / 100 | 1.20 |"), "{md}");
        assert!(md.trim_end().ends_with("| no |"), "{md}");
    }

    #[test]
    fn rows_count_fail_open_requests_on_each_side_and_on_both() {
        let record = |id: usize, route: &str| RequestRecord {
            id,
            route: Some(route.to_string()),
            ..RequestRecord::default()
        };
        let real = vec![
            record(0, "disagg"),
            record(1, "fail-open;reason=timeout"),
            record(2, "fail-open;reason=timeout"),
        ];
        let virt = vec![
            record(0, "fail-open;reason=timeout"),
            record(1, "fail-open;reason=timeout"),
            record(2, "disagg"),
        ];
        let report = RunReport::default();
        let rows = cross_check_rows(&[(&report, &real)], &[(&report, &virt)]);
        let r = &rows[0];
        assert_eq!(
            (r.real_fail_open, r.virtual_fail_open, r.both_fail_open),
            (2, 2, 1)
        );
    }
}
