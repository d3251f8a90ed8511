//! The virtual-time backend of the comparison harness ([`switchyard_loadgen::compare`]):
//! every planned run replayed from cold workers on the virtual stack.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde::Serialize;
use switchyard_loadgen::compare::output::{json, json_lines};
use switchyard_loadgen::compare::{Backend, PlannedRun, RunDetail, RunResult};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::Workload;

use super::modes::{report_run, run_mode};
use super::spec::{ReplayCounters, ReplayRun, StackSpec};
use super::tokens::PromptSource;
use super::tracker::RouteNote;
use super::ReplayError;

/// Replays each planned run on a virtual stack built from `base` (preset, router config,
/// gateway model, seed), with the run's mode, worker split and arrival scale.
#[derive(Debug, Clone)]
pub struct VirtualBackend<'a> {
    workload: &'a Workload,
    source: &'a PromptSource,
    base: StackSpec,
    slo: Slo,
    /// Appended to every run's label in its report (the cross-check's ` (virtual)`).
    pub label_suffix: String,
    /// Measured send times by run label, replacing the planned arrivals of that run (see
    /// [`StackSpec::sent_ms`]); runs without an entry use the plan.
    pub send_times: BTreeMap<String, Vec<f64>>,
    /// Trace lines skipped as malformed while loading the workload, for the reports.
    pub malformed_trace_lines: usize,
}

impl<'a> VirtualBackend<'a> {
    /// A backend replaying `workload` with `source`'s token ids on stacks like `base`,
    /// reporting goodput against `slo`.
    pub fn new(
        workload: &'a Workload,
        source: &'a PromptSource,
        base: StackSpec,
        slo: Slo,
    ) -> Self {
        VirtualBackend {
            workload,
            source,
            base,
            slo,
            label_suffix: String::new(),
            send_times: BTreeMap::new(),
            malformed_trace_lines: 0,
        }
    }

    /// The stack of one planned run.
    pub fn spec(&self, run: &PlannedRun) -> StackSpec {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        StackSpec {
            mode: run.mode,
            workers: count(run.split.total()),
            prefill_workers: count(run.split.prefill),
            arrival_scale: run.arrival_scale,
            sent_ms: self.send_times.get(&run.label).cloned(),
            ..self.base.clone()
        }
    }
}

/// What a virtual run has beyond the common result.
#[derive(Debug, Clone, Serialize)]
pub struct VirtualDetail {
    /// What ran.
    pub spec: StackSpec,
    /// What the router decided per request, in id order.
    pub notes: Vec<RouteNote>,
    /// Requests never sent.
    pub not_sent: usize,
    /// Counters.
    pub counters: ReplayCounters,
    /// Virtual time when the last event happened, ms.
    pub end_ms: f64,
}

impl VirtualDetail {
    /// The replay run again, with its records.
    pub fn into_run(self, records: Vec<RequestRecord>) -> ReplayRun {
        ReplayRun {
            spec: self.spec,
            records,
            notes: self.notes,
            not_sent: self.not_sent,
            counters: self.counters,
            end_ms: self.end_ms,
        }
    }
}

impl RunDetail for VirtualDetail {
    fn files(&self) -> Vec<(&'static str, String)> {
        vec![
            ("routes.jsonl", json_lines(&self.notes)),
            ("counters.json", json(&self.counters)),
        ]
    }
}

impl Backend for VirtualBackend<'_> {
    type Detail = VirtualDetail;
    type Error = ReplayError;

    async fn run(&mut self, run: &PlannedRun) -> Result<RunResult<VirtualDetail>, ReplayError> {
        let (start, _) = wall_s(None);
        let replayed = run_mode(self.workload, self.source, self.spec(run))?;
        let (_, wall_s) = wall_s(Some(start));
        let label = format!("{}{}", run.label, self.label_suffix);
        let mut report = report_run(&replayed, self.workload, self.slo, Some(label));
        report.meta.load_level = Some(run.load_level);
        report.meta.malformed_trace_lines = self.malformed_trace_lines;
        switchyard_support::errln!(
            "{}: {} requests in {:.1} s wall ({:.0} s virtual)",
            report.meta.label,
            replayed.records.len(),
            wall_s,
            replayed.end_ms / 1000.0
        );
        let ReplayRun {
            spec,
            records,
            notes,
            not_sent,
            counters,
            end_ms,
        } = replayed;
        Ok(RunResult {
            run: run.clone(),
            report,
            records,
            wall_s,
            notes: Vec::new(),
            detail: VirtualDetail {
                spec,
                notes,
                not_sent,
                counters,
                end_ms,
            },
        })
    }
}

/// Wall-clock seconds since `start`, to report replay speed (not used in any result).
#[allow(clippy::disallowed_methods)] // measuring the simulator's own speed needs the wall clock
fn wall_s(start: Option<std::time::Instant>) -> (std::time::Instant, f64) {
    let now = std::time::Instant::now();
    (now, start.map_or(0.0, |s| (now - s).as_secs_f64()))
}

/// Drives `future` to completion on this thread. The virtual backend never waits on
/// anything (virtual time has no I/O), so a harness over it is ready at its first poll;
/// this keeps an async runtime out of the virtual-time crate.
///
/// # Panics
/// If `future` is not ready at once (it awaited something other than the virtual backend).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a virtual-time comparison waited on something outside it"),
    }
}
