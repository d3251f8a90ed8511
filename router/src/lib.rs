//! Switchyard's router core: which decode worker serves a request, and whether a prefill
//! worker computes its KV first. One synchronous value, [`Router`], holding the workers, the
//! KV index, predicted load and the policy; and [`ControlCore`], what the control plane does
//! with every message it receives (registration, expiry, KV batches, resync decisions),
//! around it.
//!
//! Pure: no I/O, no clock, no global randomness, no async runtime. Time arrives as `now_ms`
//! (milliseconds on any monotonic clock the caller owns) and tie-breaking randomness comes
//! from an RNG seeded at construction, so the same code runs behind the control plane's HTTP
//! service (one task owns it) and inside the virtual-time replay, and a seed replays a run
//! exactly.
//!
//! # Layout
//! - [`index`]: which workers cache which block sequences.
//! - [`load`]: predicted and reported load per worker.
//! - [`predict`]: blocks just routed to a worker, counted as cached until its events tell.
//! - [`select`]: choosing decode and prefill workers by cost.
//! - [`policy`]: the conditional-disaggregation rules (bypass or disaggregate), from the
//!   `switchyard-policy` crate.
//! - [`config`]: runtime configuration, validated.
//! - [`Router`] itself: the worker registry (`workers.rs`), KV batches into the index with
//!   per-worker sequence numbers (`kv_events.rs`), tokens → verdict (`route.rs`), decisions
//!   shared with other control-plane replicas (`replica.rs`).
//! - [`core`]: the [`ControlCore`] both clocks drive.
//!
//! Counting: the router counts *blocks* (stored, removed, unknown removals; see
//! [`Router::kv_counters`]); the caller counts *batches* and errors from the results of
//! `apply_kv_batch`, and verdicts by their [`Reason`] (all listed in [`Reason::ALL`]).
#![deny(missing_docs)]

pub mod chains;
pub mod config;
/// The KV index (its own crate, `switchyard-kv-index`).
pub use switchyard_kv_index as index;
pub mod load;
pub mod predict;
pub use switchyard_policy as policy;
pub mod select;

pub mod core;
pub use crate::core::ControlCore;

mod kv_events;
mod learning;
mod replica;
mod route;
mod workers;

pub use crate::route::{Prompt, Routed};

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::worker::{LoadReport, WorkerId, WorkerInfo};

use crate::config::{ConfigError, RouterConfig};
use crate::index::{IndexStats, KvIndex, OverlapScores, WorkerSlot};
use crate::load::{LoadTracker, RoutedLoad, WorkerLoad};
use crate::predict::Predictions;

pub use replica::PeerRouteError;
pub use switchyard_protocol::route::Reason;

/// What changed when a heartbeat arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerChange {
    /// First time seen: ask it for a KV resync.
    New,
    /// A new process instance under a known name: its cache is cold, old state was dropped;
    /// ask it for a KV resync.
    Restarted,
    /// Known and alive: liveness refreshed.
    Refreshed,
    /// Not registered: its block size is invalid (0 or above
    /// [`switchyard_protocol::hash::BlockSize::MAX`]), or the router already tracks
    /// [`MAX_WORKERS`] workers. Count it and log it; the worker is not routed to.
    Rejected,
    /// Not registered from this heartbeat: a worker of the same id is declared (the pool
    /// file), and keeps the id whether it is up or not. Two processes under one id would
    /// otherwise replace each other's registration on every message, resetting its cache each
    /// time.
    Declared,
    /// Not registered from this heartbeat: another live worker is registered at the same
    /// address. One address is one engine; the holder keeps it until it is withdrawn or
    /// expires (a worker redeployed under a new id registers then, a few heartbeat
    /// intervals later; meanwhile the old id's requests reach the same address).
    AddressInUse,
    /// Not registered from this heartbeat: a live worker of the same id, another process
    /// instance at another address, holds the id. Two processes under one id would
    /// otherwise replace each other on every heartbeat, dropping the cache each time; a
    /// worker that really moved registers once the old one expires.
    IdInUse,
    /// Not registered from this heartbeat: a live worker of the same model runs another
    /// engine. A model's workers run one engine, as the pool file requires of declared ones:
    /// its legs speak that engine's handoff, and a retried leg may reach any of them.
    EngineMismatch,
}

/// Most workers one router tracks (the KV index stores 15-bit worker slots).
pub const MAX_WORKERS: usize = crate::index::MAX_SLOT as usize + 1;

/// What applying a KV event batch asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvApplyOutcome {
    /// Applied in order.
    Applied,
    /// A gap in sequence numbers (or the first batch seen, mid-stream): the batch was applied
    /// as far as is safe, and the caller should send a resync request to this worker.
    NeedsResync,
    /// The worker's blocks in the index passed what its cache can hold
    /// ([`held_blocks_limit`]): removals were missed, or what publishes on its behalf is not
    /// its engine. They were all dropped (no verdict counts on blocks the engine cannot hold),
    /// and the caller should ask the worker for its state again.
    OverCapacity {
        /// Blocks the index held for it.
        held: u64,
        /// The most it may hold.
        limit: u64,
    },
}

/// Most blocks the index keeps for a worker of `kv_capacity_blocks` (0: not stated): twice its
/// capacity plus a margin for a batch whose stores come before the removals that made room,
/// and 4 Mi blocks while the capacity is unknown (more than any engine holds today: a GB200
/// worker caches ~260 k blocks of 16 tokens). Honest event streams never reach it; without it a
/// publisher that only stores would grow the index without bound.
pub fn held_blocks_limit(kv_capacity_blocks: u64) -> u64 {
    const MARGIN: u64 = 4096;
    const UNKNOWN_CAPACITY: u64 = 1 << 22;
    if kv_capacity_blocks == 0 {
        UNKNOWN_CAPACITY
    } else {
        kv_capacity_blocks.saturating_mul(2).saturating_add(MARGIN)
    }
}

/// Why a batch was rejected (counted and logged by the caller, never fatal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvEventError {
    /// The worker is not registered (no heartbeat yet, or expired).
    #[error("KV events from unknown worker {0}")]
    UnknownWorker(WorkerId),
    /// The batch names a block size other than the worker registered.
    #[error("KV events from {worker} with block size {got}, registered {registered}")]
    BlockSizeMismatch {
        /// Which worker.
        worker: WorkerId,
        /// Block size in the event.
        got: u32,
        /// Block size the worker registered.
        registered: u32,
    },
    /// A batch of another process than the registered one under this worker id: a second
    /// process given a taken id (its heartbeats are refused, `id_in_use`), or a restarted
    /// worker whose heartbeat has not arrived yet (that heartbeat re-registers it and asks
    /// for its whole cache). Not applied and no resync asked: the resync subject is the id's,
    /// so the registered process would dump its cache for every such batch.
    #[error("KV events from {worker} instance {got}, registered instance {registered}")]
    OtherInstance {
        /// Which worker id.
        worker: WorkerId,
        /// The batch's instance.
        got: u64,
        /// The registered instance.
        registered: u64,
    },
    /// A batch older than what was already applied (duplicate or reordered).
    #[error("stale KV batch {seq} from {worker} (already at {applied})")]
    Stale {
        /// Which worker.
        worker: WorkerId,
        /// The batch's sequence number.
        seq: u64,
        /// Last applied sequence number.
        applied: u64,
    },
}

/// Why no verdict could be given. The filter fails open on any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No live worker can decode.
    #[error("no live decode workers")]
    NoDecodeWorkers,
}

/// A worker as the router sees it, for `GET /v1/workers` and EDS.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerView {
    /// Registration.
    pub info: WorkerInfo,
    /// Last heartbeat, on the caller's clock.
    pub last_seen_ms: u64,
    /// Requests routed to it (to decode) and not yet done.
    pub in_flight: u32,
}

/// A worker's predicted load and cache size, for metrics and `GET /v1/workers`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerStats {
    /// Which worker.
    pub worker_id: WorkerId,
    /// Its role (a metric label).
    pub role: switchyard_protocol::worker::WorkerRole,
    /// Its model (a metric label).
    pub model: String,
    /// Predicted load (see [`crate::load`]).
    pub load: WorkerLoad,
    /// Distinct KV blocks the index holds for it.
    pub cached_blocks: u64,
}

/// Cumulative KV block counters, for metrics (batches are counted by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct KvCounters {
    /// Blocks newly recorded.
    pub blocks_stored: u64,
    /// Blocks dropped: by `removed` events, and all of a worker's when it clears, restarts,
    /// leaves or passes its limit (so stored − removed is what the index holds, and a
    /// resync's dump, counted as stored again, is balanced by its clear).
    pub blocks_removed: u64,
    /// Removals naming blocks the index did not know.
    pub unknown_removals: u64,
    /// `cleared` events applied (including resync dumps).
    pub clears: u64,
    /// Times a worker's blocks were dropped for passing [`held_blocks_limit`].
    pub over_capacity_drops: u64,
}

struct WorkerState {
    info: WorkerInfo,
    slot: WorkerSlot,
    last_seen_ms: u64,
    expires_after_ms: u64,
    /// Sequence number of the last applied KV batch of this instance; `None` until one is.
    last_kv_seq: Option<u64>,
}

/// The routing state machine.
pub struct Router {
    config: RouterConfig,
    rng: SmallRng,
    workers: BTreeMap<WorkerId, WorkerState>,
    /// Slots handed out so far (the next new one); freed ones are reused first.
    allocated_slots: u16,
    free_slots: Vec<u16>,
    /// Sum of registered workers' KV capacities (capped each), reserved in the index.
    reserved_blocks: usize,
    index: KvIndex,
    load: LoadTracker,
    scores: OverlapScores,
    kv_counters: KvCounters,
    /// Route calls answered but not tracked: their requests had failed open already.
    late_routes: u64,
    /// Blocks just routed to workers whose events have not told yet (see [`crate::predict`]).
    predictions: Predictions,
    /// Whether heartbeats can arrive at all (the caller's NATS connection is up). While they
    /// cannot, silence says nothing about a worker, so nobody is expired.
    heartbeats_reachable: bool,
    /// Liveness counts from here for every worker heard before (see
    /// [`Router::grant_liveness_grace`]).
    grace_from_ms: u64,
    /// `slo_cost`'s learned timing factors and the requests that feed them
    /// ([`RouterConfig::learn_timing`]).
    learning: learning::Learning,
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

impl Router {
    /// An empty router with the default config and RNG seed 0.
    pub fn new() -> Self {
        Self::with_config(RouterConfig::default(), 0)
    }

    /// An empty router. `seed` drives tie-breaking and temperature sampling, so a run is
    /// reproducible. `config` is used as given; call [`RouterConfig::validate`] first if it
    /// did not come from [`RouterConfig::from_json`].
    pub fn with_config(config: RouterConfig, seed: u64) -> Self {
        Router {
            config,
            rng: SmallRng::seed_from_u64(seed),
            workers: BTreeMap::new(),
            allocated_slots: 0,
            free_slots: Vec::new(),
            reserved_blocks: 0,
            index: KvIndex::new(),
            load: LoadTracker::new(),
            scores: OverlapScores::default(),
            kv_counters: KvCounters::default(),
            late_routes: 0,
            predictions: Predictions::new(),
            heartbeats_reachable: true,
            grace_from_ms: 0,
            learning: learning::Learning::default(),
        }
    }

    /// The current config.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Replaces the config (takes effect from the next call).
    ///
    /// # Errors
    /// [`ConfigError`] naming an out-of-range field; the old config stays.
    pub fn set_config(&mut self, config: RouterConfig) -> Result<(), ConfigError> {
        config.validate()?;
        if config.conditional != self.config.conditional {
            // Factors learned against other coefficients mean nothing for these.
            self.learning.reset();
        }
        self.config = config;
        Ok(())
    }

    /// Folds a worker's own load report, arriving at `now_ms`, into its predicted load (it
    /// becomes the new baseline).
    ///
    /// Returns `false` when the report was ignored: its worker is unknown, or it comes from
    /// another process than the registered one (a second process under a taken id, whose
    /// load would steer traffic as if it were the registered worker's).
    pub fn apply_load_report(&mut self, report: &LoadReport, now_ms: u64) -> bool {
        let Some(w) = self.workers.get(&report.worker_id) else {
            return false;
        };
        if report
            .instance_id
            .is_some_and(|instance| instance != w.info.instance_id)
        {
            return false;
        }
        self.load
            .on_report(w.slot, report, now_ms, &self.config.load);
        true
    }

    /// Counts all of `slot`'s blocks as removed: the index is about to drop them.
    fn count_blocks_dropped(&mut self, slot: WorkerSlot) {
        self.kv_counters.blocks_removed += self.index.blocks_of(slot) as u64;
    }

    /// `slo_cost`'s learned timing factors (`switchyard_policy::learn`); 1 until learned, and
    /// when [`RouterConfig::learn_timing`] is off or the policy is another.
    pub fn learned_timing(&self) -> policy::learn::TimingScales {
        self.learning.scales()
    }

    /// The policy config a conditional verdict is decided under: the configured one, with
    /// `slo_cost`'s timing coefficients corrected by what was learned when learning is on.
    pub fn effective_conditional(&self) -> policy::config::ConditionalDisaggConfig {
        if self.learns_timing() {
            self.learning.scales().apply(&self.config.conditional)
        } else {
            self.config.conditional
        }
    }

    fn learns_timing(&self) -> bool {
        self.config.learn_timing
            && self.config.conditional.policy == policy::config::PolicyKind::SloCost
    }

    /// Frees predicted load on lifecycle milestones: `first_token` frees prefill tokens,
    /// `done` frees the request's KV blocks (and, for a request that failed before its first
    /// token, its KV predictions). A `done` for a request not routed here (a `failed_open`
    /// one, or another replica's whose decision has not arrived) is remembered until its late
    /// route comes, which is then not counted.
    pub fn apply_lifecycle(&mut self, event: &LifecycleEvent, now_ms: u64) {
        match event {
            // A newer filter's milestone: nothing this build can apply.
            LifecycleEvent::Unknown => {}
            LifecycleEvent::FirstToken { request_id } => {
                self.load.on_first_token(request_id);
                if let Some(slot) = self.learning.awaiting_first_token(request_id) {
                    let streams = self.load.load(slot).decoding;
                    self.learning.on_first_token(request_id, streams, now_ms);
                }
            }
            LifecycleEvent::Done {
                request_id,
                completion_tokens,
                ok,
                failed_open,
                route_call,
                ..
            } => {
                let finished = if *failed_open {
                    self.load.on_failed_open(request_id, *route_call, now_ms)
                } else {
                    let finished = self.load.on_done(request_id);
                    if finished.is_none() {
                        // Not routed here (yet): another replica's verdict whose share is on
                        // its way, or held back by a NATS outage. Remembered as a failed-open
                        // request is, so that the route is not counted when it comes (it was
                        // counted for ten minutes).
                        self.load.on_failed_open(request_id, None, now_ms);
                    }
                    finished
                };
                if let Some(finished) = finished.filter(|f| !f.decoded && !*ok) {
                    // It ended before its first token: its workers may never have seen it (a
                    // client that left during the prefill leg, a fail-open), so its predicted
                    // blocks go; what they did compute, their events say. Kept, the next
                    // attempt of the same prompt was bypassed onto an empty cache.
                    let RoutedLoad { decode, prefill } = finished.load;
                    self.predictions.withdraw(decode.slot, &decode.blocks);
                    if let Some(prefill) = prefill {
                        self.predictions.withdraw(prefill.slot, &prefill.blocks);
                    }
                }
                self.learning.on_done(
                    request_id,
                    *completion_tokens,
                    *ok,
                    &self.config.conditional,
                    now_ms,
                );
            }
        }
        self.load.expire(now_ms, &self.config.load);
    }

    /// Records whether heartbeats can reach the router (the caller's event-bus connection).
    /// While they cannot, no worker expires; when they can again, every worker gets a full
    /// expiry window from `now_ms` to be heard from.
    pub fn set_heartbeats_reachable(&mut self, reachable: bool, now_ms: u64) {
        if reachable && !self.heartbeats_reachable {
            self.grant_liveness_grace(now_ms);
        }
        self.heartbeats_reachable = reachable;
    }

    /// Counts every known worker as heard from at `now_ms`: after a stall of the caller (the
    /// process was stopped, the host froze), heartbeats sent meanwhile could not be
    /// processed, and silence in that time says nothing about the workers.
    pub fn grant_liveness_grace(&mut self, now_ms: u64) {
        self.grace_from_ms = self.grace_from_ms.max(now_ms);
    }

    /// Whether `w` counts as live at `now_ms` (see [`Router::set_heartbeats_reachable`]).
    fn is_live(&self, w: &WorkerState, now_ms: u64) -> bool {
        !self.heartbeats_reachable
            || now_ms.saturating_sub(w.last_seen_ms.max(self.grace_from_ms)) <= w.expires_after_ms
    }

    /// Every registered worker (expired ones too until the periodic expiry removes them).
    pub fn workers(&self) -> Vec<WorkerView> {
        self.workers.values().map(|w| self.view(w)).collect()
    }

    /// Workers live at `now_ms`, for the API and EDS: the registered ones less those whose
    /// heartbeats stopped long enough that routing already passes them over, though the
    /// periodic expiry has not removed them yet.
    pub fn live_workers(&self, now_ms: u64) -> Vec<WorkerView> {
        self.workers
            .values()
            .filter(|w| self.is_live(w, now_ms))
            .map(|w| self.view(w))
            .collect()
    }

    /// Whether worker `id` is registered.
    pub fn knows(&self, id: &WorkerId) -> bool {
        self.workers.contains_key(id)
    }

    fn view(&self, w: &WorkerState) -> WorkerView {
        WorkerView {
            info: w.info.clone(),
            last_seen_ms: w.last_seen_ms,
            in_flight: self.load.load(w.slot).in_flight,
        }
    }

    /// Per-worker predicted load and cached blocks, for metrics.
    pub fn worker_stats(&self) -> Vec<WorkerStats> {
        self.workers
            .values()
            .map(|w| WorkerStats {
                worker_id: w.info.worker_id.clone(),
                role: w.info.role,
                model: w.info.model.clone(),
                load: self.load.load(w.slot),
                cached_blocks: self.index.blocks_of(w.slot) as u64,
            })
            .collect()
    }

    /// Size of the KV index.
    pub fn index_stats(&self) -> IndexStats {
        self.index.stats()
    }

    /// Cumulative KV block counters.
    pub fn kv_counters(&self) -> KvCounters {
        self.kv_counters
    }

    /// Route calls (own or a peer's) that came after the filter had failed their request
    /// open: answered, not tracked. Cumulative.
    pub fn late_routes(&self) -> u64 {
        self.late_routes
    }

    /// Requests released because their workers' reports stopped showing them (a lost
    /// `done`; `crate::load`), since this router began.
    pub fn stale_in_flight_released(&self) -> u64 {
        self.load.stale_released()
    }

    /// Requests whose load is currently tracked (routed, not done, not expired).
    pub fn tracked_requests(&self) -> usize {
        self.load.active_requests()
    }
}
