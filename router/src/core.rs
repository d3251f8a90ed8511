//! The control core: what the control plane does with every message it receives, as one
//! synchronous value both clocks drive.
//!
//! The control plane's router task (real time, tokio) and the virtual-time replay feed the
//! same [`ControlCore`] the same messages — heartbeats, KV event batches, load reports,
//! lifecycle milestones, route requests, periodic ticks — and get the same answers back,
//! including the decisions that have effects outside the router: which worker to ask for a
//! KV resync and why ([`Resync`]), which workers expired. The caller carries those out (over
//! NATS in real time, directly on the simulated worker in virtual time). So registration,
//! expiry, resync and routing exist once.
//!
//! Time is `now_ms`, milliseconds on the caller's monotonic clock. A gap of more than
//! [`STALL_GAP_MS`] between two calls means the caller did not run (stopped, starved):
//! heartbeats sent meanwhile could not be processed, so every worker gets a fresh expiry
//! window (counted in [`ControlCore::stalls`]).

use std::collections::{HashMap, HashSet};

use switchyard_protocol::kv::{KvEvent, KvEventBatch};
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::Verdict;
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat, WorkerId, WorkerInfo};

use crate::{KvApplyOutcome, KvEventError, Prompt, RouteError, Routed, Router, WorkerChange};

/// Heartbeat intervals below this count as this, so a worker announcing 0 ms does not expire
/// between two of its own heartbeats.
pub const MIN_HEARTBEAT_INTERVAL_MS: u64 = 100;
/// Shortest time between two resync requests to the same worker instance.
pub const RESYNC_MIN_INTERVAL_MS: u64 = 1_000;
/// How often callers tick the core (expiry checks); real time and virtual time alike.
pub const TICK_MS: u64 = 200;
/// A gap this long between two calls means the caller was stalled (see the module docs);
/// several ticks long, so ordinary scheduling jitter is no stall.
pub const STALL_GAP_MS: u64 = 1_000;

/// How long a new worker's first KV dump is waited for (see [`ControlCore::dumps_pending`]):
/// a worker that never answers its resync request must not keep a replica unready.
pub const DUMP_WAIT_MS: u64 = 5_000;

/// Why a worker is asked for a full dump of its KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResyncReason {
    /// First time seen: the index knows nothing of its cache.
    NewWorker,
    /// A new process instance under a known name: its cache is cold, old state dropped.
    Restarted,
    /// A gap in its KV batch sequence: removals in the gap were missed.
    Gap,
    /// The event bus came back after an outage: any batch sent meanwhile may be lost, and a
    /// worker that published none since would never show the gap.
    Reconnected,
    /// Its blocks in the index passed what its cache can hold and were dropped
    /// ([`crate::KvApplyOutcome::OverCapacity`]).
    OverCapacity,
}

impl ResyncReason {
    /// Every reason (metrics pre-create a series for each).
    pub const ALL: [ResyncReason; 5] = [
        ResyncReason::NewWorker,
        ResyncReason::Restarted,
        ResyncReason::Gap,
        ResyncReason::Reconnected,
        ResyncReason::OverCapacity,
    ];

    /// Wire name (the resync request's `reason`, a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::NewWorker => "new_worker",
            ResyncReason::Restarted => "restarted",
            ResyncReason::Gap => "gap",
            ResyncReason::Reconnected => "reconnected",
            ResyncReason::OverCapacity => "over_capacity",
        }
    }
}

/// A resync decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resync {
    /// Ask `worker` for a dump now.
    Send {
        /// Which worker.
        worker: WorkerId,
        /// Why.
        reason: ResyncReason,
    },
    /// One is due but the per-instance rate limit holds it back (the last one is recent).
    Suppressed,
}

/// What a heartbeat did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The registry's change.
    pub change: WorkerChange,
    /// The resync it calls for, if any.
    pub resync: Option<Resync>,
}

/// What a KV batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBatchOutcome {
    /// Applied (and whether a gap was seen), or why not.
    pub result: Result<KvApplyOutcome, KvEventError>,
    /// The resync it calls for, if any.
    pub resync: Option<Resync>,
}

/// The router plus what the control plane keeps around it (see the module docs).
pub struct ControlCore {
    router: Router,
    heartbeat_misses: u32,
    /// Worker -> (instance last asked for a resync, when).
    resyncs: HashMap<WorkerId, (u64, u64)>,
    /// New workers asked for their first KV dump, and when; left when a dump batch arrives.
    awaiting_dump: HashMap<WorkerId, u64>,
    /// Resyncs the rate limit held back: worker -> (instance, reason, the sequence number the
    /// need was seen at, if a batch showed it). Asked with the worker's next heartbeat or
    /// batch once [`RESYNC_MIN_INTERVAL_MS`] has passed, unless a dump numbered after it came.
    deferred: HashMap<WorkerId, (u64, ResyncReason, Option<u64>)>,
    /// The ids the pool file declares, healthy or not ([`ControlCore::set_declared_ids`], and
    /// every worker registered by [`ControlCore::declared`]): a heartbeat under one is refused,
    /// so a self-registering process never stands in for a declared engine that is down.
    declared_ids: HashSet<WorkerId>,
    /// Whether the event bus was reachable at the last report of it.
    reachable: bool,
    /// Whether it has been reported reachable since the core started. The first connection is
    /// no return from an outage: the service's connection watch may report it a moment after
    /// the first heartbeats came through it, and asking those workers for a resync then would
    /// double the dumps they were just asked for.
    reached: bool,
    /// When the core was last called.
    last_active_ms: Option<u64>,
    stalls: u64,
}

impl ControlCore {
    /// A core around `router`; a worker expires after `heartbeat_misses` missed intervals.
    pub fn new(router: Router, heartbeat_misses: u32) -> Self {
        ControlCore {
            router,
            heartbeat_misses: heartbeat_misses.max(1),
            resyncs: HashMap::new(),
            awaiting_dump: HashMap::new(),
            deferred: HashMap::new(),
            declared_ids: HashSet::new(),
            reachable: true,
            reached: false,
            last_active_ms: None,
            stalls: 0,
        }
    }

    /// The router, for queries (workers, stats, config).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The router, for changes that are no message (config).
    pub fn router_mut(&mut self) -> &mut Router {
        &mut self.router
    }

    /// Stalls seen so far (see the module docs).
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Notes that the caller runs at `now_ms`; a long gap since the last call is a stall.
    fn observe(&mut self, now_ms: u64) {
        if let Some(last) = self.last_active_ms {
            if now_ms.saturating_sub(last) > STALL_GAP_MS {
                self.stalls += 1;
                self.router.grant_liveness_grace(now_ms);
            }
        }
        self.last_active_ms = Some(self.last_active_ms.map_or(now_ms, |l| l.max(now_ms)));
    }

    /// How long a worker that promised `interval_ms` between heartbeats stays live.
    pub fn expiry_ms(&self, interval_ms: u64) -> u64 {
        interval_ms
            .max(MIN_HEARTBEAT_INTERVAL_MS)
            .saturating_mul(u64::from(self.heartbeat_misses))
    }

    /// A heartbeat (registration or refresh). Its authenticity is the caller's to check. A
    /// heartbeat under the id of a declared worker is refused ([`WorkerChange::Declared`]),
    /// and so is one at an address another live worker holds
    /// ([`WorkerChange::AddressInUse`]), one of a second process under a live worker's id
    /// ([`WorkerChange::IdInUse`]) and one of another engine than its model's live workers
    /// run ([`WorkerChange::EngineMismatch`]).
    pub fn heartbeat(&mut self, hb: &WorkerHeartbeat, now_ms: u64) -> HeartbeatOutcome {
        let refused = if self.declared_ids.contains(&hb.worker.worker_id) {
            Some(WorkerChange::Declared)
        } else if self.router.address_holder(&hb.worker, now_ms).is_some() {
            Some(WorkerChange::AddressInUse)
        } else if self.router.id_held_elsewhere(&hb.worker, now_ms) {
            Some(WorkerChange::IdInUse)
        } else if self.router.model_runs_another_engine(&hb.worker, now_ms) {
            Some(WorkerChange::EngineMismatch)
        } else {
            None
        };
        if let Some(change) = refused {
            self.observe(now_ms);
            return HeartbeatOutcome {
                change,
                resync: None,
            };
        }
        let expires = self.expiry_ms(hb.interval_ms);
        let outcome = self.register(&hb.worker, expires, now_ms);
        if let Some(Resync::Send {
            reason: ResyncReason::NewWorker,
            ..
        }) = outcome.resync
        {
            self.awaiting_dump
                .insert(hb.worker.worker_id.clone(), now_ms);
        }
        if outcome.resync.is_none() && outcome.change == WorkerChange::Refreshed {
            return HeartbeatOutcome {
                resync: self.deferred_due(&hb.worker.worker_id, now_ms),
                ..outcome
            };
        }
        outcome
    }

    /// New workers (heard over the event bus) whose first KV dump has been asked for, has not
    /// arrived, and is still waited for ([`DUMP_WAIT_MS`]): until there are none, this
    /// replica's index is missing caches that other replicas already see, and it should not
    /// be given route calls.
    pub fn dumps_pending(&self, now_ms: u64) -> usize {
        self.awaiting_dump
            .values()
            .filter(|asked| now_ms.saturating_sub(**asked) < DUMP_WAIT_MS)
            .count()
    }

    /// Applies another control-plane replica's routing decision (see
    /// [`Router::apply_peer_route`]).
    ///
    /// # Errors
    /// [`crate::PeerRouteError`] when it names a worker not known here.
    pub fn peer_route(
        &mut self,
        request_id: &str,
        decode: &switchyard_protocol::replica::SharedLeg,
        prefill: Option<&switchyard_protocol::replica::SharedLeg>,
        now_ms: u64,
    ) -> Result<(), crate::PeerRouteError> {
        self.observe(now_ms);
        self.router
            .apply_peer_route(request_id, decode, prefill, now_ms)
    }

    /// The ids the pool file declares now. A worker registered by heartbeat under a newly
    /// declared id leaves the pools (the id is the declared engine's from now on); its id is
    /// returned. An id no longer declared is free for heartbeats again.
    pub fn set_declared_ids(&mut self, ids: HashSet<WorkerId>, now_ms: u64) -> Vec<WorkerId> {
        self.observe(now_ms);
        let taken: Vec<WorkerId> = ids
            .iter()
            .filter(|id| !self.declared_ids.contains(*id) && self.router.knows(id))
            .cloned()
            .collect();
        for id in &taken {
            self.resyncs.remove(id);
            self.awaiting_dump.remove(id);
            self.deferred.remove(id);
            self.router.remove_worker(id);
        }
        self.declared_ids = ids;
        taken
    }

    /// A worker known to be up without a heartbeat of its own — a declared engine whose
    /// health check passed — live for `expires_after_ms` unless confirmed again. The same
    /// registration as a heartbeat's; the resync it asks for is the caller's to carry out
    /// (a declared vLLM has no dump: its KV feed replays instead). The id is the declared
    /// worker's: heartbeats under it are refused while the pool file declares it, whether the
    /// worker is live or not.
    pub fn declared(
        &mut self,
        worker: &WorkerInfo,
        expires_after_ms: u64,
        now_ms: u64,
    ) -> HeartbeatOutcome {
        let outcome = self.register(worker, expires_after_ms, now_ms);
        if outcome.change != WorkerChange::Rejected {
            self.declared_ids.insert(worker.worker_id.clone());
        }
        outcome
    }

    /// Registers or refreshes `worker`, live for `expires_after_ms`.
    fn register(
        &mut self,
        worker: &WorkerInfo,
        expires_after_ms: u64,
        now_ms: u64,
    ) -> HeartbeatOutcome {
        self.observe(now_ms);
        let change = self.router.upsert_worker(worker, expires_after_ms, now_ms);
        let reason = match change {
            WorkerChange::New => Some(ResyncReason::NewWorker),
            WorkerChange::Restarted => Some(ResyncReason::Restarted),
            WorkerChange::Refreshed
            | WorkerChange::Rejected
            | WorkerChange::Declared
            | WorkerChange::AddressInUse
            | WorkerChange::IdInUse
            | WorkerChange::EngineMismatch => None,
        };
        // A registration wipes what the index knew of the worker, so its dump is always asked
        // for, never rate-limited: a resync asked just before (for a gap of the instance it
        // replaces, say) must not hold back the dump that rebuilds it.
        let resync = reason.map(|reason| {
            self.deferred.remove(&worker.worker_id);
            self.resyncs
                .insert(worker.worker_id.clone(), (worker.instance_id, now_ms));
            Resync::Send {
                worker: worker.worker_id.clone(),
                reason,
            }
        });
        HeartbeatOutcome { change, resync }
    }

    /// Takes a worker out of the pools and the index now (declared and found unhealthy, or
    /// no longer declared). Returns whether it was there.
    pub fn withdraw(&mut self, worker: &WorkerId, now_ms: u64) -> bool {
        self.observe(now_ms);
        self.resyncs.remove(worker);
        self.awaiting_dump.remove(worker);
        self.deferred.remove(worker);
        let known = self.router.knows(worker);
        self.router.remove_worker(worker);
        known
    }

    /// A batch of KV events from one worker.
    pub fn kv_batch(&mut self, batch: &KvEventBatch, now_ms: u64) -> KvBatchOutcome {
        self.observe(now_ms);
        let result = self.router.apply_kv_batch(batch);
        if batch.resync && result.is_ok() {
            self.awaiting_dump.remove(&batch.worker_id);
            // A dump numbered after the need was seen carries the worker's state since.
            let rebuild = matches!(batch.events.first(), Some(KvEvent::Cleared));
            if let Some((instance, _, Some(seen))) = self.deferred.get(&batch.worker_id) {
                if rebuild && *instance == batch.instance_id && batch.seq > *seen {
                    self.deferred.remove(&batch.worker_id);
                }
            }
        }
        let reason = match result {
            Ok(KvApplyOutcome::NeedsResync) => Some(ResyncReason::Gap),
            Ok(KvApplyOutcome::OverCapacity { .. }) => Some(ResyncReason::OverCapacity),
            _ => None,
        };
        let resync = match reason {
            Some(reason) => Some(self.resync(
                &batch.worker_id,
                batch.instance_id,
                reason,
                Some(batch.seq),
                now_ms,
            )),
            None if result.is_ok() => self.deferred_due(&batch.worker_id, now_ms),
            None => None,
        };
        KvBatchOutcome { result, resync }
    }

    /// A worker's load report.
    /// Returns `false` when it was ignored (see [`Router::apply_load_report`]).
    pub fn load(&mut self, report: &LoadReport, now_ms: u64) -> bool {
        self.observe(now_ms);
        self.router.apply_load_report(report, now_ms)
    }

    /// A lifecycle milestone from the filter.
    pub fn lifecycle(&mut self, event: &LifecycleEvent, now_ms: u64) {
        self.observe(now_ms);
        self.router.apply_lifecycle(event, now_ms);
    }

    /// Routes a tokenized request asking for `choices` choices.
    ///
    /// # Errors
    /// [`RouteError`] when no live worker can decode.
    pub fn route(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        choices: u32,
        now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        self.route_model(request_id, tokens, choices, None, now_ms)
    }

    /// Routes a request among the workers of `model` only (see [`Router::route_model`]).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker of `model` can decode.
    pub fn route_model(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        self.route_numbered(request_id, None, tokens, choices, model, now_ms)
            .map(|routed| routed.verdict)
    }

    /// [`ControlCore::route_model`] for route call `route_call` of the request (see
    /// [`Router::route_numbered`]), with the policy's call beside the verdict (see
    /// [`Routed`]), for the control plane's status page.
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker of `model` can decode.
    pub fn route_numbered<'a>(
        &mut self,
        request_id: &str,
        route_call: Option<u64>,
        prompt: impl Into<Prompt<'a>>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        self.observe(now_ms);
        self.router
            .route_numbered(request_id, route_call, prompt, choices, model, now_ms)
    }

    /// The verdict a route call would get now, deciding nothing (see [`Router::preview`]).
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker of `model` can decode.
    pub fn preview<'a>(
        &mut self,
        request_id: &str,
        prompt: impl Into<Prompt<'a>>,
        choices: u32,
        model: Option<&str>,
        now_ms: u64,
    ) -> Result<Routed, RouteError> {
        self.observe(now_ms);
        self.router
            .preview(request_id, prompt, choices, model, now_ms)
    }

    /// Whether heartbeats can reach the control plane (its event-bus connection). When they
    /// can again after an outage, every known worker is asked for a resync (rate-limited as
    /// usual): KV batches sent meanwhile may be lost without a later batch to show the gap.
    pub fn heartbeats_reachable(&mut self, reachable: bool, now_ms: u64) -> Vec<Resync> {
        self.observe(now_ms);
        let returned = reachable && !self.reachable && self.reached;
        self.reachable = reachable;
        self.reached |= reachable;
        self.router.set_heartbeats_reachable(reachable, now_ms);
        if !returned {
            return Vec::new();
        }
        self.router
            .workers()
            .into_iter()
            .map(|w| {
                self.resync(
                    &w.info.worker_id,
                    w.info.instance_id,
                    ResyncReason::Reconnected,
                    None,
                    now_ms,
                )
            })
            .collect()
    }

    /// Periodic housekeeping, every [`TICK_MS`]: frees the load of requests whose lifecycle
    /// reports are overdue, expires workers whose heartbeats stopped and returns them.
    pub fn tick(&mut self, now_ms: u64) -> Vec<WorkerId> {
        self.observe(now_ms);
        self.router.expire_overdue_requests(now_ms);
        let expired = self.router.expire_workers(now_ms);
        for id in &expired {
            self.resyncs.remove(id);
            self.awaiting_dump.remove(id);
            self.deferred.remove(id);
        }
        expired
    }

    /// The resync decision for `worker`'s `instance`: the first request to a new instance
    /// always goes (its cache is another process's); repeats to the same instance wait
    /// [`RESYNC_MIN_INTERVAL_MS`], so neither a burst of gapped batches nor a worker flapping
    /// between live and expired becomes a burst of dumps. One held back is kept (`seen`: the
    /// batch number that showed the need) and asked later ([`ControlCore::deferred_due`]):
    /// batches after a gap continue from its number, so nothing else would ask again.
    fn resync(
        &mut self,
        worker: &WorkerId,
        instance: u64,
        reason: ResyncReason,
        seen: Option<u64>,
        now_ms: u64,
    ) -> Resync {
        match self.resyncs.get(worker) {
            Some((asked, at))
                if *asked == instance && now_ms.saturating_sub(*at) < RESYNC_MIN_INTERVAL_MS =>
            {
                let seen = match self.deferred.get(worker) {
                    // The earliest need held back: batches arrive in order, so a dump that
                    // comes after both is numbered after both anyway, and the earliest lets the
                    // dump answering a real gap clear it when a later number ran ahead (a bad
                    // batch; a rebuild is taken whatever its number).
                    Some((held, _, earlier)) if *held == instance => match (*earlier, seen) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        _ => None,
                    },
                    _ => seen,
                };
                self.deferred
                    .insert(worker.clone(), (instance, reason, seen));
                Resync::Suppressed
            }
            _ => {
                self.deferred.remove(worker);
                self.resyncs.insert(worker.clone(), (instance, now_ms));
                Resync::Send {
                    worker: worker.clone(),
                    reason,
                }
            }
        }
    }
}

impl ControlCore {
    /// The resync the rate limit held back for `worker`, once its interval has passed (and
    /// the worker is still the instance it was held back for).
    fn deferred_due(&mut self, worker: &WorkerId, now_ms: u64) -> Option<Resync> {
        let (instance, reason, _) = *self.deferred.get(worker)?;
        let asked_at = self.resyncs.get(worker).map(|(_, at)| *at);
        if asked_at.is_some_and(|at| now_ms.saturating_sub(at) < RESYNC_MIN_INTERVAL_MS) {
            return None;
        }
        self.deferred.remove(worker);
        if !self.router.knows(worker) {
            return None;
        }
        Some(self.resync(worker, instance, reason, None, now_ms))
    }
}

#[cfg(test)]
mod tests {
    use switchyard_protocol::kv::KvEvent;
    use switchyard_protocol::worker::WorkerRole;

    use super::*;

    /// A heartbeat of worker `id`, at an address of its own (one address is one engine):
    /// the id's hash picks the port.
    fn hb(id: &str, instance: u64) -> WorkerHeartbeat {
        use std::hash::BuildHasher;
        let hashed = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
        let port = 10_000 + hashed.hash_one(id) % 50_000;
        WorkerHeartbeat {
            v: 1,
            worker: WorkerInfo {
                worker_id: WorkerId(id.into()),
                instance_id: instance,
                role: WorkerRole::Decode,
                address: format!("127.0.0.1:{port}"),
                model: "m".into(),
                block_size: 16,
                kv_capacity_blocks: 100,
                engine: Default::default(),
                bootstrap_port: None,
            },
            interval_ms: 1_000,
            sent_at_ms: 0,
            signature: None,
        }
    }

    fn batch(id: &str, instance: u64, seq: u64) -> KvEventBatch {
        KvEventBatch {
            v: 1,
            worker_id: WorkerId(id.into()),
            instance_id: instance,
            seq,
            resync: false,
            events: vec![KvEvent::Cleared],
        }
    }

    fn sent(reason: ResyncReason, id: &str) -> Option<Resync> {
        Some(Resync::Send {
            worker: WorkerId(id.into()),
            reason,
        })
    }

    #[test]
    fn new_and_restarted_workers_and_gaps_ask_for_resyncs_rate_limited_per_instance() {
        let mut core = ControlCore::new(Router::new(), 3);
        assert_eq!(
            core.heartbeat(&hb("a", 1), 0).resync,
            sent(ResyncReason::NewWorker, "a")
        );
        assert_eq!(core.heartbeat(&hb("a", 1), 100).resync, None, "a refresh");
        assert_eq!(
            core.kv_batch(&batch("a", 1, 5), 200).resync,
            Some(Resync::Suppressed),
            "too soon"
        );
        assert_eq!(
            core.kv_batch(&batch("a", 1, 7), 1_300).resync,
            sent(ResyncReason::Gap, "a")
        );
        assert_eq!(
            core.heartbeat(&hb("b", 1), 1_300).resync,
            sent(ResyncReason::NewWorker, "b"),
            "workers are independent"
        );
        assert_eq!(
            core.heartbeat(&hb("a", 2), 1_400).resync,
            sent(ResyncReason::Restarted, "a"),
            "a new instance always"
        );
    }

    /// A gap seen less than [`RESYNC_MIN_INTERVAL_MS`] after the last resync request is held
    /// back, not forgotten: later batches continue from the gapped number and show no gap, so
    /// without a deferred request the lost removals (or the lost rest of a dump) stayed in the
    /// index until some other gap. It goes with the worker's next heartbeat or batch once the
    /// interval has passed, unless a dump taken after the gap arrived first.
    #[test]
    fn a_gap_held_back_by_the_rate_limit_is_asked_once_the_interval_passes() {
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("a", 1), 0);
        let mut dump = batch("a", 1, 1);
        dump.resync = true;
        assert_eq!(core.kv_batch(&dump, 300).resync, None);
        // Batch 2 is lost (a dropped message): 3 shows the gap, too soon after the request.
        assert_eq!(
            core.kv_batch(&batch("a", 1, 3), 500).resync,
            Some(Resync::Suppressed)
        );
        assert_eq!(
            core.kv_batch(&batch("a", 1, 4), 900).resync,
            None,
            "in order"
        );
        assert_eq!(
            core.heartbeat(&hb("a", 1), 950).resync,
            None,
            "still too soon"
        );
        assert_eq!(
            core.heartbeat(&hb("a", 1), 1_100).resync,
            sent(ResyncReason::Gap, "a"),
            "held back, then asked"
        );
        assert_eq!(core.heartbeat(&hb("a", 1), 2_200).resync, None, "once");
        assert_eq!(core.kv_batch(&batch("a", 1, 5), 2_300).resync, None);

        // A dump taken after the gap answers it: nothing more is asked.
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("b", 1), 0);
        assert_eq!(
            core.kv_batch(&batch("b", 1, 3), 200).resync,
            Some(Resync::Suppressed)
        );
        let mut dump = batch("b", 1, 4);
        dump.resync = true;
        assert_eq!(core.kv_batch(&dump, 400).resync, None);
        assert_eq!(core.heartbeat(&hb("b", 1), 1_500).resync, None);
        assert_eq!(core.kv_batch(&batch("b", 1, 5), 1_600).resync, None);
    }

    #[test]
    fn a_worker_dropped_for_passing_its_capacity_is_asked_for_a_resync() {
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("a", 1), 0);
        let blocks = (0..crate::held_blocks_limit(100) + 1)
            .map(|i| switchyard_protocol::kv::StoredBlock {
                seq_hash: switchyard_protocol::hash::SequenceHash(i + 1),
                block_id: switchyard_protocol::kv::EngineBlockId(i + 1),
            })
            .collect();
        let mut flood = batch("a", 1, 1);
        flood.events = vec![KvEvent::Stored {
            parent: None,
            parent_block_id: None,
            block_size: 16,
            blocks,
        }];
        let outcome = core.kv_batch(&flood, 5_000);
        assert!(matches!(
            outcome.result,
            Ok(KvApplyOutcome::OverCapacity { .. })
        ));
        assert_eq!(outcome.resync, sent(ResyncReason::OverCapacity, "a"));
    }

    #[test]
    fn a_restart_whose_batches_outrun_its_heartbeat_still_gets_its_dump() {
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("a", 1), 0);
        // The old process's last batches had a gap: a resync was asked just before.
        core.kv_batch(&batch("a", 1, 1), 4_000);
        let gap = core.kv_batch(&batch("a", 1, 3), 4_900);
        assert_eq!(gap.resync, sent(ResyncReason::Gap, "a"));
        // The new process serves at once; its first batch comes before its heartbeat: not
        // applied, and no resync (the id's subject would reach the registered process too).
        let early = core.kv_batch(&batch("a", 2, 1), 5_000);
        assert!(matches!(
            early.result,
            Err(KvEventError::OtherInstance { .. })
        ));
        assert_eq!(early.resync, None);
        // Then it registers. The registration wipes the index, so this resync must go,
        // however soon after the last (the rate limit would hold it back).
        assert_eq!(
            core.heartbeat(&hb("a", 2), 5_300).resync,
            sent(ResyncReason::Restarted, "a")
        );
    }

    #[test]
    fn every_worker_is_resynced_when_the_bus_returns() {
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("a", 1), 0);
        core.heartbeat(&hb("b", 1), 0);
        assert!(
            core.heartbeats_reachable(true, 100).is_empty(),
            "no outage yet"
        );
        assert!(core.heartbeats_reachable(false, 2_000).is_empty());
        let mut resyncs = core.heartbeats_reachable(true, 5_000);
        resyncs.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(
            resyncs,
            vec![
                sent(ResyncReason::Reconnected, "a").unwrap(),
                sent(ResyncReason::Reconnected, "b").unwrap()
            ]
        );
        assert!(
            core.heartbeats_reachable(true, 5_100).is_empty(),
            "once per outage"
        );
    }

    #[test]
    fn the_first_connection_is_no_return_from_an_outage() {
        let mut core = ControlCore::new(Router::new(), 3);
        // The connection watch says "not yet" at start and notices the connection only after
        // a worker's first heartbeat came through it.
        assert!(core.heartbeats_reachable(false, 0).is_empty());
        assert_eq!(
            core.heartbeat(&hb("a", 1), 50).resync,
            sent(ResyncReason::NewWorker, "a")
        );
        assert!(
            core.heartbeats_reachable(true, 100).is_empty(),
            "the first connection asks nothing more"
        );
        assert!(core.heartbeats_reachable(false, 2_000).is_empty());
        assert_eq!(
            core.heartbeats_reachable(true, 5_000),
            vec![sent(ResyncReason::Reconnected, "a").unwrap()],
            "a later return does"
        );
    }

    #[test]
    fn a_new_workers_first_dump_is_waited_for_until_it_arrives_or_the_wait_is_over() {
        let mut core = ControlCore::new(Router::new(), 3);
        assert_eq!(core.dumps_pending(0), 0);
        core.heartbeat(&hb("a", 1), 0);
        core.heartbeat(&hb("b", 1), 0);
        core.heartbeat(&hb("a", 1), 100);
        assert_eq!(core.dumps_pending(100), 2, "refreshes ask for nothing new");
        // An ordinary batch is no dump.
        assert!(core.kv_batch(&batch("a", 1, 1), 200).result.is_ok());
        assert_eq!(core.dumps_pending(200), 2);
        let mut dump = batch("a", 1, 2);
        dump.resync = true;
        assert!(core.kv_batch(&dump, 300).result.is_ok());
        assert_eq!(core.dumps_pending(300), 1, "a's dump arrived");
        // b never answers: after the wait it no longer counts.
        assert_eq!(core.dumps_pending(DUMP_WAIT_MS - 1), 1);
        assert_eq!(core.dumps_pending(DUMP_WAIT_MS), 0);
    }

    /// A request never reported done stops counting once `load.request_timeout_ms` has
    /// passed, at the next tick, with no route call needed (counts stayed up while traffic
    /// was quiet).
    #[test]
    fn the_tick_frees_requests_whose_reports_are_overdue() {
        let mut core = ControlCore::new(Router::new(), 3);
        let timeout = core.router().config().load.request_timeout_ms;
        let in_flight = |core: &ControlCore| -> u32 {
            core.router().workers().iter().map(|w| w.in_flight).sum()
        };
        // Heartbeats every second keep the worker live through the wait.
        core.heartbeat(&hb("a", 1), 0);
        core.route("r1", &[1; 64], 1, 0).unwrap();
        assert_eq!(in_flight(&core), 1);
        let mut t = 0;
        while t < timeout {
            t += 1_000;
            core.heartbeat(&hb("a", 1), t);
            core.tick(t);
        }
        assert_eq!(in_flight(&core), 0, "freed by the tick at {t} ms");
    }

    #[test]
    fn expiry_follows_the_promised_interval_and_a_stall_grants_a_window() {
        let mut core = ControlCore::new(Router::new(), 3);
        core.heartbeat(&hb("a", 1), 0);
        assert_eq!(core.expiry_ms(1_000), 3_000);
        assert_eq!(core.expiry_ms(0), 300, "at least 100 ms per interval");
        for t in (200..=3_000).step_by(200) {
            assert!(core.tick(t).is_empty(), "{t}");
        }
        // The caller stops for 5 s: no expiry for it.
        assert!(core.tick(8_000).is_empty());
        assert_eq!(core.stalls(), 1);
        let mut t = 8_000;
        while core.tick(t).is_empty() {
            t += 200;
            assert!(t < 12_000, "expires after the window");
        }
        assert!(t > 11_000, "a full window from the stall's end: {t}");
    }

    #[test]
    fn a_declared_worker_registers_like_a_heartbeat_and_withdraws_at_once() {
        let mut core = ControlCore::new(Router::new(), 3);
        let info = hb("vllm-0", 1).worker;
        let first = core.declared(&info, 5_000, 0);
        assert_eq!(first.change, WorkerChange::New);
        assert_eq!(first.resync, sent(ResyncReason::NewWorker, "vllm-0"));
        assert_eq!(
            core.declared(&info, 5_000, 100).change,
            WorkerChange::Refreshed
        );
        assert!(
            core.tick(4_000).is_empty(),
            "live for the window it was given"
        );
        assert!(core.withdraw(&info.worker_id, 4_100));
        assert!(core.router().workers().is_empty());
        assert!(!core.withdraw(&info.worker_id, 4_200), "already gone");
        assert_eq!(
            core.declared(&info, 5_000, 4_300).change,
            WorkerChange::New,
            "back as new: its old blocks are gone"
        );
    }

    #[test]
    fn a_heartbeat_under_a_declared_workers_id_is_refused_until_that_worker_goes() {
        let mut core = ControlCore::new(Router::new(), 3);
        let declared = hb("vd0", 1).worker;
        core.declared(&declared, 5_000, 0);
        // A self-registering process under the same id, another instance and address.
        let mut intruder = hb("vd0", 2);
        intruder.worker.address = "127.0.0.1:2".into();
        for t in [100, 200, 300] {
            let outcome = core.heartbeat(&intruder, t);
            assert_eq!(outcome.change, WorkerChange::Declared);
            assert_eq!(outcome.resync, None);
            assert_eq!(
                core.declared(&declared, 5_000, t).change,
                WorkerChange::Refreshed,
                "the declared worker keeps its registration and its cache"
            );
        }
        assert_eq!(core.router().workers()[0].info.address, declared.address);
        // Withdrawn as unhealthy, or expired: still declared, so the id stays refused (the
        // intruder would be routed to under the declared engine's name).
        core.withdraw(&declared.worker_id, 400);
        assert_eq!(
            core.heartbeat(&intruder, 500).change,
            WorkerChange::Declared
        );
        let mut core = ControlCore::new(Router::new(), 3);
        core.declared(&declared, 1_000, 0);
        let mut t = 0;
        while core.tick(t).is_empty() {
            t += 200;
            assert!(t < 5_000, "expires");
        }
        assert_eq!(core.heartbeat(&intruder, t).change, WorkerChange::Declared);
        // Gone from the pool file: the id is free again.
        core.set_declared_ids(HashSet::new(), t);
        assert_eq!(core.heartbeat(&intruder, t + 100).change, WorkerChange::New);
    }

    #[test]
    fn a_worker_of_another_engine_than_its_models_is_refused() {
        let mut core = ControlCore::new(Router::new(), 3);
        let vllm = hb("v0", 1);
        assert_eq!(core.heartbeat(&vllm, 0).change, WorkerChange::New);
        let mut sglang = hb("s0", 2);
        sglang.worker.engine = switchyard_protocol::worker::Engine::Sglang;
        for t in [100, 200] {
            assert_eq!(
                core.heartbeat(&sglang, t).change,
                WorkerChange::EngineMismatch
            );
        }
        // Another model may run it; and the worker itself may come back on another engine.
        let mut other_model = sglang.clone();
        other_model.worker.model = "another-model".into();
        assert_eq!(core.heartbeat(&other_model, 300).change, WorkerChange::New);
        let mut restarted = hb("v0", 3);
        restarted.worker.engine = switchyard_protocol::worker::Engine::Trtllm;
        assert_ne!(
            core.heartbeat(&restarted, 400).change,
            WorkerChange::EngineMismatch
        );
    }

    #[test]
    fn a_declared_id_is_refused_before_its_engine_was_ever_healthy_and_taken_from_a_heartbeat_worker(
    ) {
        let mut core = ControlCore::new(Router::new(), 3);
        let mut intruder = hb("vd9", 2);
        intruder.worker.address = "127.0.0.1:2".into();
        assert_eq!(core.heartbeat(&intruder, 0).change, WorkerChange::New);
        // The pool file now declares vd9, whose engine has not answered a health poll yet:
        // the self-registered worker leaves, and its heartbeats are refused from then on.
        let ids: HashSet<WorkerId> = [intruder.worker.worker_id.clone()].into();
        assert_eq!(
            core.set_declared_ids(ids.clone(), 100),
            [intruder.worker.worker_id.clone()]
        );
        assert!(core.router().workers().is_empty());
        assert_eq!(
            core.heartbeat(&intruder, 200).change,
            WorkerChange::Declared
        );
        // Declaring the same ids again takes nothing.
        assert!(core.set_declared_ids(ids, 300).is_empty());
    }

    /// Ticks the core from `t` in half-second steps until worker `id` has expired; the time.
    fn tick_until_gone(core: &mut ControlCore, id: &str, mut t: u64) -> u64 {
        while core
            .router()
            .workers()
            .iter()
            .any(|w| w.info.worker_id.0 == id)
        {
            t += 500;
            core.tick(t);
            assert!(t < 60_000, "{id} expires");
        }
        t
    }

    #[test]
    fn a_second_id_at_a_live_workers_address_is_refused_until_the_holder_goes() {
        let mut core = ControlCore::new(Router::new(), 3);
        let holder = hb("a", 1);
        assert_eq!(core.heartbeat(&holder, 0).change, WorkerChange::New);
        // The same engine redeployed under a new id (or a second engine misconfigured to
        // advertise the first one's address).
        let mut newcomer = hb("b", 2);
        newcomer.worker.address = holder.worker.address.clone();
        for t in [100, 1_000, 2_000] {
            let outcome = core.heartbeat(&newcomer, t);
            assert_eq!(outcome.change, WorkerChange::AddressInUse);
            assert_eq!(outcome.resync, None);
        }
        // The holder keeps refreshing in place; its registration and cache stay.
        assert_eq!(
            core.heartbeat(&holder, 2_100).change,
            WorkerChange::Refreshed
        );
        let ids: Vec<String> = core
            .router()
            .workers()
            .iter()
            .map(|w| w.info.worker_id.0.clone())
            .collect();
        assert_eq!(ids, vec!["a".to_string()]);
        // A known worker may not move onto the holder's address either.
        let mut elsewhere = hb("c", 3);
        assert_eq!(core.heartbeat(&elsewhere, 2_200).change, WorkerChange::New);
        elsewhere.worker.address = holder.worker.address.clone();
        assert_eq!(
            core.heartbeat(&elsewhere, 2_300).change,
            WorkerChange::AddressInUse
        );
        // Once the holder stops and expires (3 missed 1 s intervals), the newcomer registers.
        let t = tick_until_gone(&mut core, "a", 2_300);
        let outcome = core.heartbeat(&newcomer, t + 1);
        assert_eq!(outcome.change, WorkerChange::New);
        assert_eq!(outcome.resync, sent(ResyncReason::NewWorker, "b"));
    }

    #[test]
    fn a_second_process_under_a_live_workers_id_is_refused_a_restart_is_not() {
        let mut core = ControlCore::new(Router::new(), 3);
        let first = hb("d", 1);
        assert_eq!(core.heartbeat(&first, 0).change, WorkerChange::New);
        // Another process under the same id, at another address: refused while the first
        // lives, so the two do not replace each other on every heartbeat.
        let mut second = hb("d", 2);
        second.worker.address = "127.0.0.1:9".into();
        for t in [100, 600, 1_100] {
            assert_eq!(core.heartbeat(&second, t).change, WorkerChange::IdInUse);
            assert_eq!(
                core.heartbeat(&first, t + 1).change,
                WorkerChange::Refreshed
            );
        }
        // A restart comes back at its address under a new instance: taken at once.
        let restarted = hb("d", 3);
        assert_eq!(
            core.heartbeat(&restarted, 1_200).change,
            WorkerChange::Restarted
        );
        // A worker that really moved registers there once the old process expires.
        let t = tick_until_gone(&mut core, "d", 1_200);
        assert_eq!(core.heartbeat(&second, t + 1).change, WorkerChange::New);
    }
}
