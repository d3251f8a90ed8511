//! The routing brain as one synchronous value: workers, KV index, load, policy.
//!
//! `Router` is pure: no I/O, no clock, no global randomness. Time arrives as `now_ms`
//! (milliseconds on any monotonic clock the caller owns) so the same code runs behind the
//! HTTP service (one task owns it) and inside the virtual-time simulator.
//!
//! SEAM: the signatures below are what the service (`service`, `api`, `consumers`) and the
//! simulator call. The internals are a placeholder (least in-flight among live decode
//! workers) to be replaced by the KV index, load tracking, selection and policies.

use std::collections::BTreeMap;

use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::{Endpoint, RouteMode, Verdict};
use switchyard_protocol::worker::{LoadReport, WorkerId, WorkerInfo};

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
}

/// What applying a KV event batch asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvApplyOutcome {
    /// Applied in order.
    Applied,
    /// A gap in sequence numbers (or an unknown worker/instance): the batch was applied as far
    /// as is safe, and the caller should send a resync request to this worker.
    NeedsResync,
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
    /// Requests routed to it and not yet done.
    pub in_flight: u32,
}

struct WorkerState {
    info: WorkerInfo,
    last_seen_ms: u64,
    expires_after_ms: u64,
    in_flight: u32,
}

/// The routing state machine.
#[derive(Default)]
pub struct Router {
    workers: BTreeMap<WorkerId, WorkerState>,
    /// request id -> decode worker, to free in-flight counts on lifecycle reports.
    routed: BTreeMap<String, WorkerId>,
}

impl Router {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers or refreshes a worker from a heartbeat. `expires_after_ms` is how long the
    /// worker stays live without another heartbeat.
    pub fn upsert_worker(
        &mut self,
        info: &WorkerInfo,
        expires_after_ms: u64,
        now_ms: u64,
    ) -> WorkerChange {
        match self.workers.get_mut(&info.worker_id) {
            Some(state) if state.info.instance_id == info.instance_id => {
                state.info = info.clone();
                state.last_seen_ms = now_ms;
                state.expires_after_ms = expires_after_ms;
                WorkerChange::Refreshed
            }
            existing => {
                let change = if existing.is_some() {
                    WorkerChange::Restarted
                } else {
                    WorkerChange::New
                };
                self.workers.insert(
                    info.worker_id.clone(),
                    WorkerState {
                        info: info.clone(),
                        last_seen_ms: now_ms,
                        expires_after_ms,
                        in_flight: 0,
                    },
                );
                change
            }
        }
    }

    /// Drops workers whose heartbeats stopped; returns who expired.
    pub fn expire_workers(&mut self, now_ms: u64) -> Vec<WorkerId> {
        let expired: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| now_ms.saturating_sub(w.last_seen_ms) > w.expires_after_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.remove_worker(id);
        }
        expired
    }

    /// Forgets a worker and everything known about it.
    pub fn remove_worker(&mut self, id: &WorkerId) {
        self.workers.remove(id);
        self.routed.retain(|_, w| w != id);
    }

    /// Applies one batch of KV events from a worker.
    ///
    /// # Errors
    /// See [`KvEventError`]; nothing is applied on error.
    pub fn apply_kv_batch(
        &mut self,
        batch: &KvEventBatch,
        _now_ms: u64,
    ) -> Result<KvApplyOutcome, KvEventError> {
        if !self.workers.contains_key(&batch.worker_id) {
            return Err(KvEventError::UnknownWorker(batch.worker_id.clone()));
        }
        Ok(KvApplyOutcome::Applied)
    }

    /// Folds a worker's own load report into its predicted load.
    pub fn apply_load_report(&mut self, _report: &LoadReport, _now_ms: u64) {}

    /// Frees predicted load on lifecycle milestones.
    pub fn apply_lifecycle(&mut self, event: &LifecycleEvent, _now_ms: u64) {
        if let LifecycleEvent::Done { request_id, .. } = event {
            if let Some(worker) = self.routed.remove(request_id) {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.in_flight = w.in_flight.saturating_sub(1);
                }
            }
        }
    }

    /// Decides where and how to serve a request whose prompt is `tokens`.
    ///
    /// # Errors
    /// [`RouteError::NoDecodeWorkers`] when no live worker can decode.
    pub fn route(
        &mut self,
        request_id: &str,
        tokens: &[u32],
        _now_ms: u64,
    ) -> Result<Verdict, RouteError> {
        let (id, state) = self
            .workers
            .iter_mut()
            .filter(|(_, w)| w.info.role.serves_decode())
            .min_by_key(|(id, w)| (w.in_flight, (*id).clone()))
            .ok_or(RouteError::NoDecodeWorkers)?;
        state.in_flight += 1;
        let decode = Endpoint {
            worker_id: id.clone(),
            address: state.info.address.clone(),
        };
        self.routed.insert(request_id.to_string(), id.clone());
        let isl = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        Ok(Verdict {
            v: switchyard_protocol::PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            mode: RouteMode::Agg,
            decode,
            prefill: None,
            isl,
            cached_tokens: 0,
            eff_isl: isl,
            reason: "agg:least_in_flight".to_string(),
        })
    }

    /// Live workers, for the API and EDS.
    pub fn workers(&self) -> Vec<WorkerView> {
        self.workers
            .values()
            .map(|w| WorkerView {
                info: w.info.clone(),
                last_seen_ms: w.last_seen_ms,
                in_flight: w.in_flight,
            })
            .collect()
    }
}
