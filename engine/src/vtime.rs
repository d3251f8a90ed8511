//! Virtual-time driver: a discrete-event loop over several simulated engines.
//!
//! **Simulated.** No sockets, no tokio, no wall clock: a [`Cluster`] of named [`Engine`]s
//! jumps from event to event (a request arrival, an iteration end, a held-KV lease expiry,
//! the end of a modelled KV transfer), so an hour of trace replays in seconds. It models the
//! disaggregated handoff the real system performs over HTTP and NIXL: the prefill worker
//! computes the prompt and generates one token while holding the KV
//! ([`EngineRequest::prefill_for_remote_decode`]), the KV then "moves" for
//! [`Engine::transfer_time_ms`] of the tokens the transfer mode moves, the prefill worker
//! releases it, and the decode worker starts the request with [`KvSource::Remote`].
//!
//! Callers either pre-schedule arrivals ([`Cluster::schedule`]) and [`Cluster::run`], or own
//! the loop: [`Cluster::step_next`] handles exactly the next event time, so a caller can react
//! to what happened (route the next turn of a session, feed KV events to an index) before
//! anything later happens.
//!
//! # Real time
//! The real-time worker runs the same [`Engine`] against a clock. With a [`SpeedUp`](crate::SpeedUp) of
//! `s` it sleeps `model_ms / s` of wall time per model millisecond (`s = 10` runs ten times
//! faster than the modelled hardware, which lets tests see long prefills in short runs);
//! every reported latency stays in model milliseconds.

use std::collections::HashMap;

use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::worker::{WorkerId, WorkerInfo};

use crate::queue::EventQueue;
use crate::worker_core::WorkerCore;
use crate::{Engine, EngineConfig, EngineError, EngineOutput, EngineRequest, KvSource};

mod trace;

pub use trace::trace_block_hashes;

/// Index of an engine in its [`Cluster`] (in the order engines were added).
pub type EngineIdx = usize;

/// A request entering the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// Straight to one engine (aggregated serving, or a bypassed request on a decode worker).
    Direct {
        /// The engine.
        engine: EngineIdx,
        /// The request.
        req: EngineRequest,
    },
    /// Prefill on `prefill`, transfer, decode on `decode`. `req` is the decode request
    /// (its `kv` and `hold_for_remote_decode` are set by the driver).
    Disaggregated {
        /// The prefill engine.
        prefill: EngineIdx,
        /// The decode engine.
        decode: EngineIdx,
        /// The request as the client sent it.
        req: EngineRequest,
    },
}

/// What happened, delivered to the caller's sink in time order.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterEvent {
    /// An engine output (tokens, finishes, preemptions). Prefill legs report here too, with
    /// the prefill engine's index.
    Output {
        /// Which engine.
        engine: EngineIdx,
        /// What it reported.
        output: EngineOutput,
    },
    /// KV event batches a worker published (only when [`Cluster::set_forward_kv_events`] is
    /// on), numbered as its real-time twin numbers them ([`WorkerCore::kv_batches`]).
    KvBatches {
        /// Which engine.
        engine: EngineIdx,
        /// The batches, in order.
        batches: Vec<KvEventBatch>,
    },
    /// A prefill leg finished and its KV started moving to the decode engine.
    TransferStarted {
        /// Request id.
        id: u64,
        /// From.
        prefill: EngineIdx,
        /// To.
        decode: EngineIdx,
        /// Tokens moved (whole prompt or missing suffix, per the prefill engine's model).
        tokens: u64,
        /// Start time.
        at_ms: f64,
        /// When the decode engine receives it.
        until_ms: f64,
    },
    /// An engine refused a request (at arrival, or the decode leg after a transfer).
    Rejected {
        /// Which engine.
        engine: EngineIdx,
        /// Request id.
        id: u64,
        /// Why.
        error: EngineError,
        /// When.
        at_ms: f64,
    },
}

/// A decode request waiting for its prefill leg or its transfer.
#[derive(Debug)]
struct Handoff {
    decode: EngineIdx,
    req: EngineRequest,
}

/// A transfer in flight.
#[derive(Debug)]
struct Transfer {
    prefill: EngineIdx,
    id: u64,
}

/// Several simulated workers advanced together in virtual time.
#[derive(Debug, Default)]
pub struct Cluster {
    workers: Vec<WorkerCore>,
    clock_ms: f64,
    arrivals: EventQueue<Arrival>,
    transfers: EventQueue<Transfer>,
    /// Decode legs by (prefill engine, request id).
    handoffs: HashMap<(EngineIdx, u64), Handoff>,
    forward_kv_events: bool,
    /// CPU time per prompt token between a prefill leg's end and the start of its KV
    /// transfer (the real decode worker tokenizes the decode leg's body before it pulls),
    /// for tokens the decode worker does not cache.
    handoff_cpu_ms_per_prompt_token: f64,
    /// The same for tokens it caches ([`Cluster::set_handoff_cpu_ms`]).
    handoff_cpu_ms_per_cached_token: f64,
    buf: Vec<EngineOutput>,
}

impl Cluster {
    /// An empty cluster at virtual time 0.
    pub fn new() -> Self {
        Cluster::default()
    }

    /// Adds a worker described by `info` with an engine configured by `cfg`.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] from [`Engine::new`].
    pub fn add_worker(
        &mut self,
        info: WorkerInfo,
        cfg: EngineConfig,
    ) -> Result<EngineIdx, EngineError> {
        self.workers.push(WorkerCore::new(info, cfg)?);
        Ok(self.workers.len() - 1)
    }

    /// Adds a worker named `name` with an engine configured by `cfg`: instance 1, address
    /// `vtime/<name>`, the simulated model (for callers that need no other identity).
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] from [`Engine::new`].
    pub fn add_engine(
        &mut self,
        name: impl Into<String>,
        cfg: EngineConfig,
    ) -> Result<EngineIdx, EngineError> {
        let name = name.into();
        let info = WorkerInfo {
            worker_id: WorkerId(name.clone()),
            instance_id: 1,
            role: cfg.role,
            address: format!("vtime/{name}"),
            model: crate::DEFAULT_MODEL_NAME.to_string(),
            block_size: cfg.block_size,
            kv_capacity_blocks: cfg.kv_capacity_blocks,
            engine: Default::default(),
            bootstrap_port: None,
        };
        self.add_worker(info, cfg)
    }

    /// Whether engines' KV events are delivered as [`ClusterEvent::KvEvents`] (off by default:
    /// they are drained and dropped, so long replays do not accumulate them).
    pub fn set_forward_kv_events(&mut self, on: bool) {
        self.forward_kv_events = on;
    }

    /// CPU time per prompt token a disaggregated request spends between its prefill leg and
    /// its KV transfer (0 by default): on the real stack the decode worker parses and
    /// tokenizes the decode leg's body before it pulls the KV. `per_new_token` for the tokens
    /// the decode worker does not cache, `per_cached_token` for those it does (it tokenized
    /// their text before, and its tokenizer keeps a segment cache). Negative or non-finite
    /// values count as 0.
    pub fn set_handoff_cpu_ms(&mut self, per_new_token: f64, per_cached_token: f64) {
        let usable = |ms: f64| if ms.is_finite() { ms.max(0.0) } else { 0.0 };
        self.handoff_cpu_ms_per_prompt_token = usable(per_new_token);
        self.handoff_cpu_ms_per_cached_token = usable(per_cached_token);
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether the cluster has no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// A worker, for its messages (heartbeat, load report, resync dump).
    pub fn worker(&self, idx: EngineIdx) -> &WorkerCore {
        &self.workers[idx]
    }

    /// A worker, for a resync dump. Do not step it yourself: the cluster steps every worker
    /// in time order.
    pub fn worker_mut(&mut self, idx: EngineIdx) -> &mut WorkerCore {
        &mut self.workers[idx]
    }

    /// A worker's engine, for queries (load, cached prefix, config).
    pub fn engine(&self, idx: EngineIdx) -> &Engine {
        self.workers[idx].engine()
    }

    /// A worker's engine, e.g. to abort a request or release held KV.
    pub fn engine_mut(&mut self, idx: EngineIdx) -> &mut Engine {
        self.workers[idx].engine_mut()
    }

    /// A worker's name (its id).
    pub fn name(&self, idx: EngineIdx) -> &str {
        &self.workers[idx].info().worker_id.0
    }

    /// The worker called `name`.
    pub fn index_of(&self, name: &str) -> Option<EngineIdx> {
        self.workers
            .iter()
            .position(|w| w.info().worker_id.0 == name)
    }

    /// Current virtual time (ms).
    pub fn now_ms(&self) -> f64 {
        self.clock_ms
    }

    /// Schedules an arrival at `at_ms` (times before now count as now).
    pub fn schedule(&mut self, at_ms: f64, arrival: Arrival) {
        self.arrivals.push(at_ms.max(self.clock_ms), arrival);
    }

    /// Submits an arrival now. A decode-leg refusal shows up later as [`ClusterEvent::Rejected`].
    ///
    /// # Errors
    /// The engine's refusal of the request (for a disaggregated arrival, the prefill leg's).
    pub fn submit(&mut self, arrival: Arrival) -> Result<(), EngineError> {
        let now = self.clock_ms;
        match arrival {
            Arrival::Direct { engine, req } => self.workers[engine].submit(req, now),
            Arrival::Disaggregated {
                prefill,
                decode,
                req,
            } => {
                let leg = EngineRequest::prefill_for_remote_decode(req.id, req.prompt.clone());
                self.workers[prefill].submit(leg, now)?;
                self.handoffs
                    .insert((prefill, req.id), Handoff { decode, req });
                Ok(())
            }
        }
    }

    /// When the next event is due; `None` when nothing is left to happen.
    pub fn next_event_ms(&self) -> Option<f64> {
        let engines = self.workers.iter().filter_map(WorkerCore::next_event_ms);
        let arrivals = self.arrivals.next_ms();
        let transfers = self.transfers.next_ms();
        engines
            .chain(arrivals)
            .chain(transfers)
            .min_by(f64::total_cmp)
    }

    /// Handles everything due at the next event time and returns that time: finished
    /// transfers reach their decode engines, arrivals enter, then engines step.
    pub fn step_next(&mut self, sink: &mut impl FnMut(ClusterEvent)) -> Option<f64> {
        let t = self.next_event_ms()?.max(self.clock_ms);
        self.clock_ms = t;
        while let Some((_, done)) = self.transfers.pop_due(t) {
            self.finish_transfer(done, sink);
        }
        while let Some((_, arrival)) = self.arrivals.pop_due(t) {
            let (engine, id) = match &arrival {
                Arrival::Direct { engine, req } => (*engine, req.id),
                Arrival::Disaggregated { prefill, req, .. } => (*prefill, req.id),
            };
            if let Err(error) = self.submit(arrival) {
                sink(ClusterEvent::Rejected {
                    engine,
                    id,
                    error,
                    at_ms: t,
                });
            }
        }
        for idx in 0..self.workers.len() {
            self.step_engine(idx, t, sink);
        }
        Some(t)
    }

    /// Runs every event up to and including `until_ms`.
    pub fn run_until(&mut self, until_ms: f64, sink: &mut impl FnMut(ClusterEvent)) {
        while self.next_event_ms().is_some_and(|t| t <= until_ms) {
            self.step_next(sink);
        }
    }

    /// Runs until nothing is left to happen (every request finished, every lease expired or
    /// released).
    pub fn run(&mut self, sink: &mut impl FnMut(ClusterEvent)) {
        while self.step_next(sink).is_some() {}
    }

    fn step_engine(&mut self, idx: EngineIdx, t: f64, sink: &mut impl FnMut(ClusterEvent)) {
        if !self.workers[idx].next_event_ms().is_some_and(|n| n <= t) {
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.workers[idx].step_into(t, &mut buf);
        for output in buf.drain(..) {
            if let EngineOutput::Finished {
                id,
                kv_held: true,
                at_ms,
                ..
            } = output
            {
                self.start_transfer(idx, id, at_ms, sink);
            }
            sink(ClusterEvent::Output {
                engine: idx,
                output,
            });
        }
        self.buf = buf;
        if !self.forward_kv_events {
            self.workers[idx].discard_kv_events();
            return;
        }
        let batches = self.workers[idx].kv_batches();
        if !batches.is_empty() {
            sink(ClusterEvent::KvBatches {
                engine: idx,
                batches,
            });
        }
    }

    fn start_transfer(
        &mut self,
        prefill: EngineIdx,
        id: u64,
        at_ms: f64,
        sink: &mut impl FnMut(ClusterEvent),
    ) {
        let Some(handoff) = self.handoffs.get(&(prefill, id)) else {
            // A hold nobody waits for (submitted directly): let the lease expire it.
            return;
        };
        let decode = self.engine(handoff.decode);
        let decode_cached = decode.cached_prefix_tokens(&handoff.req.prompt);
        let decode_reads = decode.readable_prefix_tokens(&handoff.req.prompt);
        let model = &self.engine(prefill).config().transfer;
        let tokens =
            model.tokens_to_move(u64::from(handoff.req.prompt.len()), u64::from(decode_reads));
        let cached = decode_cached.min(handoff.req.prompt.len());
        let cpu_ms = self.handoff_cpu_ms_per_prompt_token
            * f64::from(handoff.req.prompt.len() - cached)
            + self.handoff_cpu_ms_per_cached_token * f64::from(cached);
        // The decode leg's tokenization comes first, then the transfer; `at_ms` stays the
        // prefill leg's end, `until_ms` is when the decode engine gets the request.
        let until_ms = at_ms + cpu_ms + model.time_ms(tokens);
        sink(ClusterEvent::TransferStarted {
            id,
            prefill,
            decode: handoff.decode,
            tokens,
            at_ms,
            until_ms,
        });
        self.transfers.push(until_ms, Transfer { prefill, id });
    }

    fn finish_transfer(&mut self, transfer: Transfer, sink: &mut impl FnMut(ClusterEvent)) {
        let now = self.clock_ms;
        self.engine_mut(transfer.prefill).release_held(transfer.id);
        let Some(Handoff { decode, mut req }) =
            self.handoffs.remove(&(transfer.prefill, transfer.id))
        else {
            return;
        };
        req.kv = KvSource::Remote;
        req.hold_for_remote_decode = false;
        let id = req.id;
        if let Err(error) = self.workers[decode].submit(req, now) {
            sink(ClusterEvent::Rejected {
                engine: decode,
                id,
                error,
                at_ms: now,
            });
        }
    }
}

#[cfg(test)]
mod tests;
