//! Predicted and reported load per worker.
//!
//! Workers report their load every interval ([`LoadReport`]), but a burst of requests routed
//! between two reports would all see the same stale numbers and pile onto one worker. So the
//! router also *predicts* load from its own decisions:
//!
//! - **prefill tokens**: when a request is routed, the worker that prefills it (the decode
//!   worker on bypass/agg, the prefill worker on disagg) gets the tokens it must compute;
//!   they are freed by the request's `first_token` lifecycle report (prefill done).
//! - **active KV blocks**: the request's prompt blocks become active on its decode worker (and,
//!   until `first_token`, on its prefill worker); freed by `done`. Blocks shared by concurrent
//!   requests are counted once: each worker keeps the hash chains of the prompts it holds, and
//!   a prompt adds only the blocks past the longest prefix it shares with one of them
//!   ([`crate::chains`]: a few probes per prompt in flight, not a table update per block). A
//!   partial last block is never shared and counts on its own.
//!
//! **Reports correct predictions** this way: a report *replaces the baseline*, and the
//! prediction is `baseline + changes since the report` (tokens and distinct blocks added
//! minus those freed after it), never below zero. Without a report the baseline is zero.
//!
//! **Requests a report cannot include yet** keep counting on top of it: a request reaches its
//! worker some time after it is routed (the verdict goes back to the gateway, the body on to
//! the worker), so a report sampled meanwhile leaves it out, and taking that report as the
//! whole truth made a burst's next request see the worker as free and pile onto it. Legs
//! routed less than `load.report_grace_ms` before a report arrives are carried into the new
//! baseline's changes, and so is the decode leg of a disaggregated request until its first
//! token: it reaches the decode worker only after its prefill leg. A request the report did
//! include counts twice until the next report; erring high spreads a burst, erring low piled
//! it.
//!
//! **Lost reports**: a request's prefill tokens are freed after `prefill_timeout_ms` without
//! `first_token`, and the whole request after `request_timeout_ms` without `done`
//! ([`LoadTracker::expire`]), so predictions never leak. Sooner, a worker's reports show a
//! lost `done`: when every report for `stale_in_flight_ms` says the worker has fewer requests
//! (running and waiting) than the router counts there, the surplus is released, the oldest
//! routed first. (A gateway restart loses the `done` of every request it carried, a NATS
//! outage a replica's share of them; counted in flight, they steered turns away and made
//! `slo_cost` see streams that had ended, for ten minutes.) Requests the report cannot include
//! yet are not counted against it, and a `done` that comes after its request was released is
//! ignored, as for any unknown id. A disaggregated request's decode leg is not counted
//! against its worker's reports before its first token, however long its prefill queue, but
//! only until `handoff_timeout_ms`: the filter's prefill leg gives up before then, so the
//! request is at its decode worker, and one whose reports were all lost is released too.
//!
//! **Late route calls**: a route call can wait in a stopped control plane's socket past the
//! filter's timeout; the filter fails the request open and reports it done with
//! `failed_open`, which may arrive before the call itself. The id is remembered (bounded, for
//! [`FAILED_OPEN_MEMORY_MS`]), and the call, when it comes, is answered but not tracked
//! ([`LoadTracker::take_failed_open`]): otherwise nothing would free it before the timeout,
//! and the router would steer turns away from that worker meanwhile.

use std::collections::{HashMap, VecDeque};

use switchyard_protocol::hash::SequenceHash;
use switchyard_protocol::worker::LoadReport;

use crate::chains::{longest_shared_prefix, Chain};
use crate::config::LoadConfig;
use crate::index::WorkerSlot;

#[cfg(test)]
mod tests;

/// One worker's share of a routed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leg {
    /// The worker.
    pub slot: WorkerSlot,
    /// Prompt tokens it must prefill for this request.
    pub prefill_tokens: u64,
    /// The request's full prompt blocks, as sequence hashes in this worker's block size
    /// (shared with the request's other leg and its KV predictions).
    pub blocks: Chain,
    /// Extra unshareable blocks (the partial last block: 0 or 1).
    pub tail_blocks: u64,
}

/// What a routing decision puts on workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedLoad {
    /// The decode worker's leg (on bypass/agg it also prefills).
    pub decode: Leg,
    /// The prefill worker's leg, on disagg; its blocks are held until `first_token`.
    pub prefill: Option<Leg>,
}

/// A worker's load as the router predicts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WorkerLoad {
    /// Prompt tokens queued or being prefilled.
    pub prefill_tokens: u64,
    /// Active KV blocks (distinct).
    pub active_blocks: u64,
    /// KV capacity in blocks (last report, else registration; 0: unknown).
    pub kv_capacity_blocks: u64,
    /// KV blocks the worker's waiting requests still need, as its last report said (not
    /// predicted): a worker whose queue waits for KV cannot take more.
    pub waiting_blocks: u64,
    /// Requests decoding (or about to) on this worker that have not reported `done`.
    pub in_flight: u32,
    /// Of those, the ones past `first_token`: streams actually decoding, which a local
    /// prefill stalls (the others still wait for, or are in, their prefill).
    pub decoding: u32,
    /// Whether a load report from this worker has arrived.
    pub reported: bool,
}

#[derive(Debug, Default)]
struct WorkerState {
    report: Option<LoadReport>,
    registered_capacity: u64,
    /// Changes since the last report (or since registration).
    prefill_delta: i64,
    blocks_delta: i64,
    /// The legs active here.
    active: Vec<ActiveLeg>,
    in_flight: u32,
    decoding: u32,
    /// Since when every report showed fewer requests than counted here, and the least
    /// shortfall among them.
    surplus: Option<Surplus>,
}

/// A run of reports that each showed fewer requests on a worker than the router counts there.
#[derive(Debug, Clone, Copy)]
struct Surplus {
    since_ms: u64,
    least: u64,
}

/// A leg active on a worker: its prompt, and what it added to the worker's predicted load.
#[derive(Debug)]
struct ActiveLeg {
    key: LegKey,
    blocks: Chain,
    /// When it was routed.
    routed_ms: u64,
    /// Distinct blocks it added then.
    added_blocks: i64,
    /// Prompt tokens it still prefills here (0 once its prefill is done).
    prefill_tokens: u64,
    /// The decode leg of a disaggregated request before its first token: the request reaches
    /// this worker only after its prefill leg, so no report includes it yet.
    awaits_handoff: bool,
}

impl ActiveLeg {
    /// Whether a report arriving at `now_ms` may have been sampled before the worker had it.
    fn unreported(&self, now_ms: u64, grace_ms: u64) -> bool {
        self.awaits_handoff || now_ms.saturating_sub(self.routed_ms) < grace_ms
    }

    /// Whether this is a request the worker's report at `now_ms` should show running or
    /// waiting: a decode leg the report cannot have missed.
    fn shown_by_report(&self, now_ms: u64, grace_ms: u64) -> bool {
        !self.key.prefill && !self.unreported(now_ms, grace_ms)
    }
}

/// Which leg of which tracked request (both legs may name the same worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LegKey {
    ticket: u64,
    prefill: bool,
}

impl WorkerState {
    /// Blocks of `blocks` that no active prompt here holds.
    fn unshared(&self, blocks: &[SequenceHash]) -> i64 {
        let shared = longest_shared_prefix(self.active.iter().map(|a| &a.blocks[..]), blocks, 0);
        (blocks.len() - shared) as i64
    }

    fn add_leg(&mut self, key: LegKey, leg: &Leg, awaits_handoff: bool, now_ms: u64) {
        let added_blocks = self.unshared(&leg.blocks) + leg.tail_blocks as i64;
        self.prefill_delta += leg.prefill_tokens as i64;
        self.blocks_delta += added_blocks;
        self.active.push(ActiveLeg {
            key,
            blocks: leg.blocks.clone(),
            routed_ms: now_ms,
            added_blocks,
            prefill_tokens: leg.prefill_tokens,
            awaits_handoff,
        });
    }

    /// The leg's prefill is over (done, or its report overdue): its tokens stop counting.
    fn end_prefill(&mut self, key: LegKey) {
        if let Some(a) = self.active.iter_mut().find(|a| a.key == key) {
            self.prefill_delta -= a.prefill_tokens as i64;
            a.prefill_tokens = 0;
        }
    }

    /// The decode leg's request reached this worker (its first token came). Until then it
    /// may still wait in a prefill queue, however long: an overdue `first_token` says
    /// nothing about where it is.
    fn handed_over(&mut self, key: LegKey) {
        if let Some(a) = self.active.iter_mut().find(|a| a.key == key) {
            a.awaits_handoff = false;
        }
    }

    /// Decode legs routed `timeout_ms` or longer ago (0: never) are taken to have reached
    /// this worker: the filter's prefill leg has given up by then, and the request came here
    /// either way (handed over, or prefilled locally on fallback).
    fn end_overdue_handoffs(&mut self, now_ms: u64, timeout_ms: u64) {
        if timeout_ms == 0 {
            return;
        }
        for a in self.active.iter_mut().filter(|a| a.awaits_handoff) {
            if now_ms.saturating_sub(a.routed_ms) >= timeout_ms {
                a.awaits_handoff = false;
            }
        }
    }

    fn release_blocks(&mut self, key: LegKey, leg: &Leg) {
        let Some(i) = self.active.iter().position(|a| a.key == key) else {
            return;
        };
        self.active.swap_remove(i);
        self.blocks_delta -= self.unshared(&leg.blocks) + leg.tail_blocks as i64;
    }

    /// Decode legs here that a report arriving at `now_ms` should include.
    fn reportable_requests(&self, now_ms: u64, grace_ms: u64) -> u64 {
        let legs = self.active.iter();
        legs.filter(|a| a.shown_by_report(now_ms, grace_ms)).count() as u64
    }

    /// Notes how many fewer requests `report` shows than are counted here; returns how many
    /// to release once every report for `cfg.stale_in_flight_ms` showed at least that few.
    fn surplus_to_release(&mut self, report: &LoadReport, now_ms: u64, cfg: &LoadConfig) -> u64 {
        let counted = self.reportable_requests(now_ms, cfg.report_grace_ms);
        let at_worker = u64::from(report.running) + u64::from(report.waiting);
        let short = counted.saturating_sub(at_worker);
        if short == 0 || cfg.stale_in_flight_ms == 0 {
            self.surplus = None;
            return 0;
        }
        let run = self.surplus.get_or_insert(Surplus {
            since_ms: now_ms,
            least: short,
        });
        run.least = run.least.min(short);
        if now_ms.saturating_sub(run.since_ms) < cfg.stale_in_flight_ms {
            return 0;
        }
        let release = run.least;
        self.surplus = None;
        release
    }

    /// Decode legs the report shows arrived before their `first_token` report did (the
    /// gateway batches those): when it shows more requests than the router expects here, as
    /// many of the oldest legs awaiting their handoff are taken as handed over, so the report
    /// and the carry do not count them twice. A conversation's next turn, routed the moment
    /// the previous one answered, saw its worker twice as loaded and moved off its cache.
    fn note_arrivals(&mut self, report: &LoadReport, now_ms: u64, grace_ms: u64) {
        let shown = u64::from(report.running) + u64::from(report.waiting);
        let mut arrived = shown.saturating_sub(self.reportable_requests(now_ms, grace_ms));
        if arrived == 0 {
            return;
        }
        let mut awaiting: Vec<(u64, usize)> = self
            .active
            .iter()
            .enumerate()
            .filter(|(_, a)| a.awaits_handoff && !a.key.prefill)
            .map(|(i, a)| (a.routed_ms, i))
            .collect();
        awaiting.sort_unstable();
        for (_, i) in awaiting {
            if arrived == 0 {
                break;
            }
            self.active[i].awaits_handoff = false;
            arrived -= 1;
        }
    }

    /// A report arrived at `now_ms`: it is the new baseline, and the changes since are the
    /// legs it may have been sampled without (see the module docs).
    fn rebase(&mut self, report: &LoadReport, now_ms: u64, grace_ms: u64) {
        self.report = Some(report.clone());
        self.note_arrivals(report, now_ms, grace_ms);
        let unreported = self
            .active
            .iter()
            .filter(|a| a.unreported(now_ms, grace_ms));
        let (tokens, blocks) = unreported.fold((0i64, 0i64), |(t, b), a| {
            (t + a.prefill_tokens as i64, b + a.added_blocks)
        });
        if report.queued_prefill_tokens.is_some() {
            self.prefill_delta = tokens;
        } // else the worker does not know: the router's own count is all there is, kept whole.
        self.blocks_delta = blocks;
    }
}

/// What is remembered of a request failed open before its route call was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FailedOpenMark {
    /// When the report came.
    at_ms: u64,
    /// The route call it names, if the filter numbered it.
    route_call: Option<u64>,
}

impl FailedOpenMark {
    /// Whether a call numbered `route_call` is the one this mark is about: yes unless both
    /// are numbered and differ (an unnumbered side, from an older filter or a peer's share,
    /// is taken as before numbers existed).
    fn matches(&self, route_call: Option<u64>) -> bool {
        match (self.route_call, route_call) {
            (Some(marked), Some(call)) => marked == call,
            _ => true,
        }
    }
}

/// A tracked request that finished, as [`LoadTracker::on_done`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// What its verdict put on workers.
    pub load: RoutedLoad,
    /// Whether its `first_token` came (it decoded on its decode worker).
    pub decoded: bool,
}

#[derive(Debug)]
struct Active {
    ticket: u64,
    load: RoutedLoad,
    stage: Stage,
}

/// Where a tracked request is, as its lifecycle reports say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Routed, no `first_token` yet: its prefill tokens and blocks count.
    Prefilling,
    /// No `first_token` within `prefill_timeout_ms`: its prefill load is freed, but nothing
    /// says it decodes (it may never have been sent), so it is no running stream.
    PrefillExpired,
    /// Past `first_token`: a stream decoding on its decode worker.
    Decoding,
}

impl Stage {
    /// Whether `first_token` is still to come.
    fn awaits_first_token(self) -> bool {
        self != Stage::Decoding
    }
}

/// Load of every worker, and the requests it is predicted from. See the module docs.
#[derive(Debug, Default)]
pub struct LoadTracker {
    workers: Vec<Option<WorkerState>>,
    /// Tracked requests by id, oldest first. Almost always one per id; a client may send
    /// several requests under one `x-request-id` at once, and each holds its own load.
    requests: HashMap<String, Vec<Active>>,
    /// How many requests `requests` holds in all.
    tracked: usize,
    /// (routed at, ticket, request id), in routing order, for expiry.
    order: VecDeque<(u64, u64, String)>,
    /// Same, for prefill expiry (entries leave when prefill is done or expired).
    prefill_order: VecDeque<(u64, u64, String)>,
    next_ticket: u64,
    /// Requests failed open before their route call was seen, by id, with when.
    failed_open: HashMap<String, FailedOpenMark>,
    /// (reported at, id), in report order, for expiry and the bound.
    failed_open_order: VecDeque<(u64, String)>,
    /// See [`LoadTracker::stale_released`].
    stale_released: u64,
}

/// How many failed-open ids are remembered: a long control-plane outage fails every request
/// open; past this the oldest are forgotten (their late calls are tracked until the timeout).
const MAX_FAILED_OPEN: usize = 16_384;

/// How long a failed-open id is remembered, from when its report was applied. A late call and
/// its report wait out the same stall (this process stopped, or a replica's shared report
/// queued with it) and are applied within moments of each other, however long the stall; a
/// short memory keeps a client that reuses its `x-request-id` later from having that request
/// taken for the late call.
pub const FAILED_OPEN_MEMORY_MS: u64 = 60_000;

fn clamp(base: u64, delta: i64) -> u64 {
    (base as i128 + delta as i128).clamp(0, u64::MAX as i128) as u64
}

impl LoadTracker {
    /// No workers, no requests.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking `slot` with zero load.
    pub fn add_worker(&mut self, slot: WorkerSlot, kv_capacity_blocks: u64) {
        let i = usize::from(slot.0);
        if self.workers.len() <= i {
            self.workers.resize_with(i + 1, || None);
        }
        self.workers[i] = Some(WorkerState {
            registered_capacity: kv_capacity_blocks,
            ..WorkerState::default()
        });
    }

    /// Updates the capacity a worker registered (heartbeats repeat it).
    pub fn set_registered_capacity(&mut self, slot: WorkerSlot, kv_capacity_blocks: u64) {
        if let Some(w) = self.worker_mut(slot) {
            w.registered_capacity = kv_capacity_blocks;
        }
    }

    /// Forgets `slot`; requests routed to it stop counting anywhere.
    pub fn remove_worker(&mut self, slot: WorkerSlot) {
        let gone: Vec<(String, u64)> = self
            .requests
            .iter()
            .flat_map(|(id, actives)| actives.iter().map(move |a| (id, a)))
            .filter(|(_, a)| {
                a.load.decode.slot == slot
                    || a.load.prefill.as_ref().is_some_and(|p| p.slot == slot)
            })
            .map(|(id, a)| (id.clone(), a.ticket))
            .collect();
        for (id, ticket) in gone {
            self.done_ticket(&id, ticket);
        }
        if let Some(w) = self.workers.get_mut(usize::from(slot.0)) {
            *w = None;
        }
    }

    fn worker_mut(&mut self, slot: WorkerSlot) -> Option<&mut WorkerState> {
        self.workers.get_mut(usize::from(slot.0))?.as_mut()
    }

    /// Records a routing decision. An id already tracked is another request under the same
    /// id (clients choose `x-request-id`, and may reuse one): both hold their load, and each
    /// lifecycle report of the id settles the oldest.
    pub fn on_route(&mut self, request_id: &str, load: RoutedLoad, now_ms: u64) {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let disaggregated = load.prefill.is_some();
        let legs = [(false, Some(&load.decode)), (true, load.prefill.as_ref())];
        for (prefill, leg) in legs {
            let Some(leg) = leg else { continue };
            if let Some(w) = self.worker_mut(leg.slot) {
                let awaits_handoff = disaggregated && !prefill;
                w.add_leg(LegKey { ticket, prefill }, leg, awaits_handoff, now_ms);
            }
        }
        if let Some(w) = self.worker_mut(load.decode.slot) {
            w.in_flight += 1;
        }
        self.order
            .push_back((now_ms, ticket, request_id.to_string()));
        self.prefill_order
            .push_back((now_ms, ticket, request_id.to_string()));
        self.tracked += 1;
        self.requests
            .entry(request_id.to_string())
            .or_default()
            .push(Active {
                ticket,
                load,
                stage: Stage::Prefilling,
            });
    }

    /// The load the latest tracked request of `request_id` puts on its workers (its prefill
    /// leg included even after `first_token`).
    pub fn routed(&self, request_id: &str) -> Option<&RoutedLoad> {
        self.requests.get(request_id)?.last().map(|a| &a.load)
    }

    /// Prefill done for the oldest request of `request_id` still prefilling: frees its
    /// prefill tokens and its prefill worker's blocks. Unknown ids (expired, or routed by a
    /// previous process) are ignored.
    pub fn on_first_token(&mut self, request_id: &str) {
        let ticket = self
            .requests
            .get(request_id)
            .and_then(|actives| actives.iter().find(|a| a.stage.awaits_first_token()))
            .map(|a| a.ticket);
        if let Some(ticket) = ticket {
            self.leave_prefill(request_id, ticket, Stage::Decoding);
        }
    }

    /// The request of `request_id` routed as `ticket` leaves its prefill for `next`
    /// (`Decoding` at its `first_token`, `PrefillExpired` when that is overdue): its prefill
    /// load is freed once, and it counts as a running stream only once it decodes.
    fn leave_prefill(&mut self, request_id: &str, ticket: u64, next: Stage) {
        let Some(active) = self
            .requests
            .get_mut(request_id)
            .and_then(|actives| actives.iter_mut().find(|a| a.ticket == ticket))
        else {
            return;
        };
        let was = std::mem::replace(&mut active.stage, next);
        if was == Stage::Decoding || (was == Stage::PrefillExpired && next == Stage::PrefillExpired)
        {
            active.stage = was;
            return;
        }
        let load = active.load.clone();
        if was == Stage::Prefilling {
            self.release_prefill(ticket, &load);
        }
        if next == Stage::Decoding {
            if let Some(w) = self.worker_mut(load.decode.slot) {
                w.decoding += 1;
                w.handed_over(LegKey {
                    ticket,
                    prefill: false,
                });
            }
        }
    }

    fn release_prefill(&mut self, ticket: u64, load: &RoutedLoad) {
        if let Some(w) = self.worker_mut(load.decode.slot) {
            w.end_prefill(LegKey {
                ticket,
                prefill: false,
            });
        }
        if let Some(p) = &load.prefill {
            if let Some(w) = self.worker_mut(p.slot) {
                let key = LegKey {
                    ticket,
                    prefill: true,
                };
                w.end_prefill(key);
                w.release_blocks(key, p);
            }
        }
    }

    /// The oldest request of `request_id` finished: frees everything it still holds, and
    /// returns what it held. Unknown ids are ignored.
    pub fn on_done(&mut self, request_id: &str) -> Option<Finished> {
        let oldest = self
            .requests
            .get(request_id)
            .and_then(|actives| actives.first())
            .map(|a| a.ticket)?;
        self.done_ticket(request_id, oldest)
    }

    /// The request of `request_id` routed as `ticket` finished.
    fn done_ticket(&mut self, request_id: &str, ticket: u64) -> Option<Finished> {
        let actives = self.requests.get_mut(request_id)?;
        let i = actives.iter().position(|a| a.ticket == ticket)?;
        let active = actives.remove(i);
        if actives.is_empty() {
            self.requests.remove(request_id);
        }
        self.tracked -= 1;
        if active.stage == Stage::Prefilling {
            self.release_prefill(active.ticket, &active.load);
        }
        if let Some(w) = self.worker_mut(active.load.decode.slot) {
            let key = LegKey {
                ticket: active.ticket,
                prefill: false,
            };
            w.release_blocks(key, &active.load.decode);
            w.in_flight = w.in_flight.saturating_sub(1);
            if active.stage == Stage::Decoding {
                w.decoding = w.decoding.saturating_sub(1);
            }
        }
        Some(Finished {
            load: active.load,
            decoded: active.stage == Stage::Decoding,
        })
    }

    /// The filter failed `request_id` open after sending its route call: frees the request if
    /// that call was routed already, else remembers the id so the call, if it still comes, is
    /// not tracked.
    pub fn on_failed_open(
        &mut self,
        request_id: &str,
        route_call: Option<u64>,
        now_ms: u64,
    ) -> Option<Finished> {
        if self.requests.contains_key(request_id) {
            return self.on_done(request_id);
        }
        while self.failed_open.len() >= MAX_FAILED_OPEN {
            let Some((at, id)) = self.failed_open_order.pop_front() else {
                break;
            };
            if self.failed_open.get(&id).map(|m| m.at_ms) == Some(at) {
                self.failed_open.remove(&id);
            }
        }
        self.failed_open.insert(
            request_id.to_string(),
            FailedOpenMark {
                at_ms: now_ms,
                route_call,
            },
        );
        self.failed_open_order
            .push_back((now_ms, request_id.to_string()));
        None
    }

    /// Whether route call `route_call` of `request_id` comes after its request was failed
    /// open: the mark is taken then (the call is the one the report was about). A call the
    /// mark does not name (both numbered, and differently) is a new request reusing the id,
    /// and leaves the mark for the late call.
    pub fn take_failed_open(&mut self, request_id: &str, route_call: Option<u64>) -> bool {
        match self.failed_open.get(request_id) {
            Some(mark) if mark.matches(route_call) => {
                self.failed_open.remove(request_id);
                true
            }
            _ => false,
        }
    }

    /// A worker's own report, arriving at `now_ms`: the new baseline, under the legs it may
    /// not include yet (see the module docs).
    pub fn on_report(
        &mut self,
        slot: WorkerSlot,
        report: &LoadReport,
        now_ms: u64,
        cfg: &LoadConfig,
    ) {
        let Some(w) = self.worker_mut(slot) else {
            return;
        };
        w.end_overdue_handoffs(now_ms, cfg.handoff_timeout_ms);
        w.rebase(report, now_ms, cfg.report_grace_ms);
        let stale = w.surplus_to_release(report, now_ms, cfg);
        if stale > 0 {
            self.release_stale(slot, stale, now_ms, cfg.report_grace_ms);
        }
    }

    /// Releases the `n` oldest requests counted on `slot` that its reports no longer show.
    fn release_stale(&mut self, slot: WorkerSlot, n: u64, now_ms: u64, grace_ms: u64) {
        let Some(w) = self.worker_mut(slot) else {
            return;
        };
        let mut legs: Vec<(u64, u64)> = w
            .active
            .iter()
            .filter(|a| a.shown_by_report(now_ms, grace_ms))
            .map(|a| (a.routed_ms, a.key.ticket))
            .collect();
        legs.sort_unstable();
        for (_, ticket) in legs.into_iter().take(n as usize) {
            let id = self
                .requests
                .iter()
                .find(|(_, actives)| actives.iter().any(|a| a.ticket == ticket))
                .map(|(id, _)| id.clone());
            if let Some(id) = id {
                self.done_ticket(&id, ticket);
                self.stale_released += 1;
            }
        }
    }

    /// Requests released because their workers' reports no longer showed them (their `done`
    /// was lost), since this tracker began.
    pub fn stale_released(&self) -> u64 {
        self.stale_released
    }

    /// Frees load of requests whose lifecycle reports are overdue.
    pub fn expire(&mut self, now_ms: u64, cfg: &LoadConfig) {
        while let Some((at, ticket, id)) = self.prefill_order.front() {
            if now_ms.saturating_sub(*at) < cfg.prefill_timeout_ms {
                break;
            }
            let (ticket, id) = (*ticket, id.clone());
            self.prefill_order.pop_front();
            self.leave_prefill(&id, ticket, Stage::PrefillExpired);
        }
        while let Some((at, ticket, id)) = self.order.front() {
            if now_ms.saturating_sub(*at) < cfg.request_timeout_ms {
                break;
            }
            let (ticket, id) = (*ticket, id.clone());
            self.order.pop_front();
            self.done_ticket(&id, ticket);
        }
        while let Some((at, id)) = self.failed_open_order.front() {
            if now_ms.saturating_sub(*at) < FAILED_OPEN_MEMORY_MS {
                break;
            }
            if self.failed_open.get(id).map(|m| m.at_ms) == Some(*at) {
                self.failed_open.remove(id);
            }
            self.failed_open_order.pop_front();
        }
        if self.failed_open_order.len() > 2 * self.failed_open.len() + 1024 {
            let failed_open = &self.failed_open;
            self.failed_open_order
                .retain(|(at, id)| failed_open.get(id).map(|m| m.at_ms) == Some(*at));
        }
        // Done requests leave stale entries behind; drop them when they dominate, so the
        // queues stay proportional to the live requests.
        let live = self.active_requests();
        if self.order.len() > 2 * live + 1024 {
            let requests = &self.requests;
            let find = |id: &String, ticket: u64| {
                requests
                    .get(id)
                    .and_then(|actives| actives.iter().find(|a| a.ticket == ticket))
            };
            self.order.retain(|(_, t, id)| find(id, *t).is_some());
            self.prefill_order
                .retain(|(_, t, id)| find(id, *t).is_some_and(|a| a.stage == Stage::Prefilling));
        }
    }

    /// Predicted load of `slot` (all zero for an unknown slot).
    pub fn load(&self, slot: WorkerSlot) -> WorkerLoad {
        let Some(Some(w)) = self.workers.get(usize::from(slot.0)) else {
            return WorkerLoad::default();
        };
        let (queued, used, total, waiting) = w.report.as_ref().map_or((0, 0, 0, 0), |r| {
            (
                r.queued_prefill_tokens.unwrap_or(0),
                r.kv_used_blocks,
                r.kv_total_blocks,
                r.kv_waiting_blocks,
            )
        });
        WorkerLoad {
            prefill_tokens: clamp(queued, w.prefill_delta),
            active_blocks: clamp(used, w.blocks_delta),
            kv_capacity_blocks: if total > 0 {
                total
            } else {
                w.registered_capacity
            },
            waiting_blocks: waiting,
            in_flight: w.in_flight,
            decoding: w.decoding,
            reported: w.report.is_some(),
        }
    }

    /// Leading blocks of `hashes` already active on `slot` (held by a request routed there
    /// and not done): a request that shares them adds no new active blocks for them.
    pub fn active_prefix(&self, slot: WorkerSlot, hashes: &[SequenceHash]) -> u64 {
        let Some(Some(w)) = self.workers.get(usize::from(slot.0)) else {
            return 0;
        };
        longest_shared_prefix(w.active.iter().map(|a| &a.blocks[..]), hashes, 0) as u64
    }

    /// Requests currently tracked.
    pub fn active_requests(&self) -> usize {
        self.tracked
    }
}
