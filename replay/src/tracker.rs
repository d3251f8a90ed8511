//! Per-request bookkeeping of one replay: when each request may be sent (arrival time,
//! closed-loop dependencies and think time, as the load generator's client waits), what the
//! router decided, and the events that complete its [`RequestRecord`].

use serde::{Deserialize, Serialize};
use switchyard_protocol::route::{Reason, RouteMode, Verdict};

use switchyard_engine::vtime::EngineIdx;
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::{ArrivalScale, PlannedRequest, Workload};

/// What the router saw and decided for one request (the verdict, minus addresses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteNote {
    /// Planned request id.
    pub id: usize,
    /// Virtual time of the decision, ms.
    pub at_ms: f64,
    /// Bypass, disagg or agg.
    pub mode: RouteMode,
    /// The verdict's reason (`bypass:isl_bounding`, `disagg:always`, ...).
    pub reason: Reason,
    /// Prompt tokens.
    pub isl: u32,
    /// Prompt tokens the router believed cached on the chosen decode worker.
    pub cached_tokens: u32,
    /// `isl - cached_tokens`: what the decode worker would prefill on a bypass.
    pub eff_isl: u32,
    /// Decode worker.
    pub decode: String,
    /// Prefill worker (disagg only).
    pub prefill: Option<String>,
}

impl RouteNote {
    /// From a verdict at `at_ms`.
    pub fn from_verdict(id: usize, at_ms: f64, v: &Verdict) -> Self {
        RouteNote {
            id,
            at_ms,
            mode: v.mode,
            reason: v.reason,
            isl: v.isl,
            cached_tokens: v.cached_tokens,
            eff_isl: v.eff_isl,
            decode: v.decode.worker_id.0.clone(),
            prefill: v.prefill.as_ref().map(|p| p.worker_id.0.clone()),
        }
    }

    /// `eff_isl / isl` (0 for an empty prompt), as the `isl_bounding` policy computes it.
    pub fn eff_ratio(&self) -> f64 {
        if self.isl == 0 {
            0.0
        } else {
            f64::from(self.eff_isl) / f64::from(self.isl)
        }
    }
}

/// When `r` may be sent: its scaled arrival time, and (closed loop) `deps_done`, its last
/// dependency's completion, plus its scaled think time.
pub(crate) fn send_time(r: &PlannedRequest, scale: ArrivalScale, deps_done: f64) -> f64 {
    let arrival = scale.scale_ms(r.arrival_ms as f64);
    if r.after.is_empty() {
        arrival
    } else {
        arrival.max(deps_done + scale.scale_ms(r.think_ms as f64))
    }
}

/// A request sent and not yet finished.
#[derive(Debug)]
struct InFlight {
    /// The engine whose outputs are the client's stream (the decode worker).
    decode: EngineIdx,
    record: RequestRecord,
}

/// The state of every request of a run.
#[derive(Debug)]
pub(crate) struct Tracker {
    arrival_scale: ArrivalScale,
    in_flight: Vec<Option<InFlight>>,
    records: Vec<Option<RequestRecord>>,
    notes: Vec<Option<RouteNote>>,
    /// Dependencies not finished yet, per request.
    waiting_on: Vec<u32>,
    /// Who waits for each request.
    dependents: Vec<Vec<usize>>,
    /// Latest completion among each request's finished dependencies.
    deps_done_ms: Vec<f64>,
    open: usize,
    /// Measured send times replacing planned arrivals of requests without dependencies.
    sent_override: Vec<f64>,
}

impl Tracker {
    pub(crate) fn new(workload: &Workload, arrival_scale: ArrivalScale) -> Self {
        let n = workload.requests.len();
        let mut dependents = vec![Vec::new(); n];
        let mut waiting_on = vec![0u32; n];
        for r in &workload.requests {
            for &d in &r.after {
                if d < n {
                    dependents[d].push(r.id);
                    waiting_on[r.id] += 1;
                }
            }
        }
        Tracker {
            arrival_scale,
            in_flight: (0..n).map(|_| None).collect(),
            records: vec![None; n],
            notes: vec![None; n],
            waiting_on,
            dependents,
            deps_done_ms: vec![f64::NEG_INFINITY; n],
            open: n,
            sent_override: Vec::new(),
        }
    }

    /// Sends request `id` (if it has no dependencies) at `sent[id]` virtual ms instead of
    /// its planned arrival; missing or non-finite entries keep the plan.
    pub(crate) fn set_sent_override(&mut self, sent: Vec<f64>) {
        self.sent_override = sent;
    }

    /// Requests ready from the start (no dependencies) with their send times.
    pub(crate) fn initially_ready<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = (usize, f64)> + 'a {
        workload
            .requests
            .iter()
            .filter(|r| self.waiting_on[r.id] == 0)
            .map(|r| (r.id, self.ready_ms(r)))
    }

    /// When `r` may be sent once its dependencies are done ([`send_time`]), or its measured
    /// send time when one replaces its planned arrival.
    fn ready_ms(&self, r: &PlannedRequest) -> f64 {
        if r.after.is_empty() {
            if let Some(&t) = self.sent_override.get(r.id) {
                if t.is_finite() && t >= 0.0 {
                    return t;
                }
            }
        }
        send_time(r, self.arrival_scale, self.deps_done_ms[r.id])
    }

    /// Requests sent or waiting that have no final record yet.
    pub(crate) fn open(&self) -> usize {
        self.open
    }

    /// The request was routed (with the router's `note`; `None` when it failed open) and its
    /// stream will come from engine `decode`.
    pub(crate) fn on_sent(
        &mut self,
        decode: EngineIdx,
        record: RequestRecord,
        note: Option<RouteNote>,
    ) {
        let id = record.id;
        self.notes[id] = note;
        self.in_flight[id] = Some(InFlight { decode, record });
    }

    /// The decode engine whose outputs belong to request `id`'s stream, if in flight.
    pub(crate) fn decode_engine(&self, id: usize) -> Option<EngineIdx> {
        self.in_flight.get(id)?.as_ref().map(|f| f.decode)
    }

    /// Requests whose stream comes from engine `engine` and that have not finished (what
    /// Envoy's least-request balancer counts as active on that worker).
    pub(crate) fn open_on(&self, engine: EngineIdx) -> usize {
        self.in_flight
            .iter()
            .flatten()
            .filter(|f| f.decode == engine)
            .count()
    }

    /// First token of `id` on its decode engine at `at_ms`.
    pub(crate) fn on_first_token(&mut self, id: usize, cached_tokens: u32, at_ms: f64) {
        if let Some(f) = self.in_flight.get_mut(id).and_then(Option::as_mut) {
            f.record.ttft_ms = Some(at_ms - f.record.sent_ms);
            f.record.cached_tokens = Some(cached_tokens);
        }
    }

    /// `id` finished on its decode engine. Returns dependents that became ready.
    pub(crate) fn on_finished(
        &mut self,
        workload: &Workload,
        id: usize,
        prompt_tokens: u32,
        completion_tokens: u32,
        at_ms: f64,
    ) -> Vec<(usize, f64)> {
        let Some(mut f) = self.in_flight.get_mut(id).and_then(Option::take) else {
            return Vec::new();
        };
        let r = &mut f.record;
        r.e2e_ms = Some(at_ms - r.sent_ms);
        r.status = Some(200);
        r.prompt_tokens = Some(prompt_tokens);
        r.completion_tokens = Some(completion_tokens);
        r.content_chunks = completion_tokens;
        self.close(workload, f.record, at_ms)
    }

    /// `id` failed at `at_ms` (an engine refused it, or no verdict). Returns dependents that
    /// became ready (the load generator sends dependents of failed requests too).
    pub(crate) fn on_failed(
        &mut self,
        workload: &Workload,
        id: usize,
        error: String,
        at_ms: f64,
    ) -> Vec<(usize, f64)> {
        let Some(f) = self.in_flight.get_mut(id).and_then(Option::take) else {
            return Vec::new();
        };
        let mut record = f.record;
        record.error = Some(error);
        record.status = Some(503);
        self.close(workload, record, at_ms)
    }

    /// A request that failed before reaching any engine (no verdict).
    pub(crate) fn fail_unsent(
        &mut self,
        workload: &Workload,
        mut record: RequestRecord,
        (status, error): (u16, String),
        at_ms: f64,
    ) -> Vec<(usize, f64)> {
        record.error = Some(error);
        record.status = Some(status);
        self.close(workload, record, at_ms)
    }

    fn close(
        &mut self,
        workload: &Workload,
        record: RequestRecord,
        at_ms: f64,
    ) -> Vec<(usize, f64)> {
        let id = record.id;
        self.records[id] = Some(record);
        self.open = self.open.saturating_sub(1);
        let mut ready = Vec::new();
        for &d in &self.dependents[id] {
            self.deps_done_ms[d] = self.deps_done_ms[d].max(at_ms);
            self.waiting_on[d] = self.waiting_on[d].saturating_sub(1);
            if self.waiting_on[d] == 0 {
                ready.push(d);
            }
        }
        ready
            .into_iter()
            .map(|d| (d, self.ready_ms(&workload.requests[d])))
            .collect()
    }

    /// Records in id order, route notes in id order, and how many requests were never sent.
    pub(crate) fn finish(self) -> (Vec<RequestRecord>, Vec<RouteNote>, usize) {
        let total = self.records.len();
        let records: Vec<RequestRecord> = self.records.into_iter().flatten().collect();
        let notes = self.notes.into_iter().flatten().collect();
        let not_sent = total - records.len();
        (records, notes, not_sent)
    }
}
