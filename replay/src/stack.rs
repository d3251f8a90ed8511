//! The virtual stack: simulated workers and the control plane's core in one process, advanced
//! by a discrete-event clock.
//!
//! Nothing here re-implements the real components: each simulated worker is the same
//! [`WorkerCore`](switchyard_engine::worker_core::WorkerCore) the real-time worker drives
//! (engine, numbered KV batches, resync dumps, load reports, heartbeats), the control plane
//! is the same [`ControlCore`] its router task drives (registration, expiry, KV batches and
//! the resync decisions they call for, routing), and a request that fails open carries the
//! filter's own label. Only the transport is gone: messages go straight from one core to
//! the other at their virtual instant.
//!
//! One run, step by step (all at virtual times; ties resolve in this order):
//! 1. **Engines** ([`Cluster::step_next`]): iteration ends, transfers, prefill legs. Their KV
//!    batches go to the control core at once (as the NATS consumer would apply them, and a
//!    resync it asks for is dumped by the worker there and then), first tokens and
//!    completions go as lifecycle events (as the filter reports them), and the records are
//!    completed.
//! 2. **Periodic messages** (one event queue with the sends): every worker's load report each
//!    [`StackSpec::load_interval_ms`], its heartbeat each heartbeat interval, and the control
//!    core's tick (expiry) each [`TICK_MS`]. Workers register with their first heartbeat at
//!    time 0.
//! 3. **Gateway events** (only with a [`StackSpec::gateway`] cost, [`super::gateway`]): a
//!    request whose route tokenization finished is routed (the control core's state at that
//!    instant); one whose route call timed out **fails open** to the decode worker with the
//!    fewest open requests, without a verdict (as Envoy's least-request fallback); one whose
//!    first worker's tokenization finished enters the engines.
//! 4. **Sends**: the request's token ids are made; without a gateway cost (the default) it
//!    is routed at once and enters the engines the verdict names (straight to the decode
//!    worker, or prefill leg, KV transfer, decode leg). With one, it enters the gateway stage.

use std::collections::HashMap;

use switchyard_engine::queue::EventQueue;
use switchyard_filter::outcome::{Rejection, Served};
use switchyard_filter::verdict::FailOpenReason;
use switchyard_protocol::hash::{BlockSize, HashSeed};
use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::openai::{
    check_max_tokens, check_prompt_length, clamp_max_tokens, InvalidRequest,
};
use switchyard_protocol::route::{RejectReason, RouteMode};
use switchyard_protocol::worker::{WorkerId, WorkerInfo, DEFAULT_HEARTBEAT_INTERVAL_MS};
use switchyard_router::core::{Resync, TICK_MS};
use switchyard_router::{ControlCore, Router};

use super::gateway::{GatewayEvent, GatewayQueue};
use super::spec::{ReplayCounters, ReplayRun, StackSpec};
use super::tokens::{hashed_prompt, PromptSource};
use super::tracker::{RouteNote, Tracker};
use super::ReplayError;
use switchyard_engine::vtime::{Arrival, Cluster, ClusterEvent, EngineIdx};
use switchyard_engine::{EngineConfig, EngineOutput, EngineRequest};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::Workload;

/// Heartbeat misses before the control core expires a worker (the control plane's default).
const HEARTBEAT_MISSES: u32 = switchyard_protocol::worker::DEFAULT_HEARTBEAT_MISSES;

/// A periodic message (besides what the cluster and the gateway stage keep themselves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Periodic {
    /// Every worker reports its load.
    LoadReports,
    /// Every worker heartbeats.
    Heartbeats,
    /// The control core's periodic tick.
    Tick,
}

/// An idle stretch longer than this (nothing running, the next send further away) is skipped
/// rather than played message by message: a trace with days between arrivals (or Unix-epoch
/// timestamps beside relative ones) would otherwise take minutes of periodic messages that
/// change nothing. Long enough that no ordinary trace's pauses are touched.
const IDLE_SKIP_MS: f64 = 600_000.0;

/// Virtual time past the last planned arrival after which a run counts as stuck (10 days).
const FINISH_BOUND_MS: f64 = 10.0 * 86_400_000.0;

/// Workers, control core and the event loop of one run (see the module docs).
pub struct VirtualStack<'a> {
    spec: StackSpec,
    workload: &'a Workload,
    source: &'a PromptSource,
    cluster: Cluster,
    control: ControlCore,
    block_size: BlockSize,
    hash_seed: HashSeed,
    /// Periodic messages; each is always queued once.
    periodic: EventQueue<Periodic>,
    /// The client's sends (request ids), after periodic messages due at the same instant.
    sends: EventQueue<usize>,
    tracker: Tracker,
    counters: ReplayCounters,
    events: Vec<ClusterEvent>,
    gateway: GatewayQueue,
    /// What the control plane's segment cache holds, for the gateway model.
    route_cache: SeenText,
    /// Requests routed (or failed open) and still in their first worker's tokenization: what
    /// enters the engines when it ends.
    pending: HashMap<usize, Pending>,
    /// Engines a request that fails open can go to (Envoy's decode cluster: decode or agg).
    fail_open_targets: Vec<EngineIdx>,
}

impl<'a> VirtualStack<'a> {
    /// Cold workers, registered with a fresh control core, for `workload`.
    ///
    /// # Errors
    /// [`ReplayError`] for an unusable spec, engine or router config, or request ids that
    /// are not positions.
    pub fn new(
        spec: StackSpec,
        workload: &'a Workload,
        source: &'a PromptSource,
    ) -> Result<Self, ReplayError> {
        for (position, r) in workload.requests.iter().enumerate() {
            if r.id != position {
                return Err(ReplayError::BadRequestId { position, id: r.id });
            }
        }
        spec.gateway.validate().map_err(ReplayError::InvalidSetup)?;
        if spec.load_interval_ms == 0 {
            return Err(ReplayError::InvalidSetup(
                "load interval must be at least 1 ms".into(),
            ));
        }
        let mut router_config = spec.router.clone();
        router_config.serving_mode = spec.mode;
        // A load report reaches this router the moment it is sampled, and without a modelled
        // gateway a request reaches its engine the moment it is routed: no report can miss a
        // request routed before it, and the grace that bridges a real network's delays would
        // only count those requests twice. (A modelled gateway forwards the body after the
        // verdict, as a real one does; the config's grace stands then.)
        if spec.gateway.is_free() {
            router_config.load.report_grace_ms = 0;
        }
        // Virtual prefill legs never time out and no lifecycle report is lost: a decode leg
        // still awaiting its handoff is still in a prefill queue, however long.
        router_config.load.handoff_timeout_ms = 0;
        router_config.validate()?;
        let control = ControlCore::new(
            Router::with_config(router_config, spec.seed),
            HEARTBEAT_MISSES,
        );
        let mut cluster = Cluster::new();
        cluster.set_forward_kv_events(true);
        cluster.set_handoff_cpu_ms(
            spec.gateway.decode_leg_ms_per_prompt_token,
            spec.gateway.decode_leg_ms_per_cached_token,
        );
        let mut counts = [0u32; 3];
        let mut block_size = None;
        let roles = spec.roles()?;
        let fail_open_targets = roles
            .iter()
            .enumerate()
            .filter(|(_, r)| r.serves_decode())
            .map(|(i, _)| i)
            .collect();
        for role in roles {
            let mut cfg = EngineConfig::with_preset(role, spec.preset);
            // Records need TTFT and E2E only; ITL follows from them as the report defines it.
            cfg.emit_token_outputs = false;
            let k = &mut counts[role as usize];
            let name = format!("{}-{k}", role.as_str());
            *k += 1;
            let info = WorkerInfo {
                worker_id: WorkerId(name.clone()),
                instance_id: 1,
                role,
                address: format!("vtime/{name}"),
                model: switchyard_engine::DEFAULT_MODEL_NAME.to_string(),
                block_size: cfg.block_size,
                kv_capacity_blocks: cfg.kv_capacity_blocks,
                engine: Default::default(),
                bootstrap_port: None,
            };
            block_size = Some(cfg.block_size()?);
            cluster.add_worker(info, cfg)?;
        }
        let block_size =
            block_size.ok_or_else(|| ReplayError::InvalidSetup("no workers".into()))?;
        let mut tracker = Tracker::new(workload, spec.arrival_scale);
        if let Some(sent) = &spec.sent_ms {
            tracker.set_sent_override(sent.clone());
        }
        let mut stack = VirtualStack {
            cluster,
            control,
            block_size,
            hash_seed: HashSeed::default(),
            periodic: EventQueue::new(),
            sends: EventQueue::new(),
            tracker,
            counters: ReplayCounters::default(),
            events: Vec::new(),
            gateway: GatewayQueue::new(spec.gateway),
            route_cache: SeenText::default(),
            pending: HashMap::new(),
            fail_open_targets,
            spec,
            workload,
            source,
        };
        // Workers register with their first heartbeat, before anything is sent.
        stack.heartbeats(0.0);
        for due in [Periodic::LoadReports, Periodic::Heartbeats, Periodic::Tick] {
            stack.periodic.push(0.0, due);
        }
        let ready: Vec<(usize, f64)> = stack.tracker.initially_ready(workload).collect();
        stack.push_ready(ready);
        Ok(stack)
    }

    fn push_ready(&mut self, ready: Vec<(usize, f64)>) {
        for (id, at_ms) in ready {
            self.sends.push(at_ms, id);
        }
    }

    /// Runs every request to completion.
    ///
    /// # Errors
    /// [`ReplayError::DidNotFinish`] if the virtual clock passes its bound (ten days after
    /// the last planned arrival) with requests still open.
    pub fn run(mut self) -> Result<ReplayRun, ReplayError> {
        let last_arrival = self
            .workload
            .requests
            .iter()
            .map(|r| self.spec.arrival_scale.scale_ms(r.arrival_ms as f64))
            .fold(0.0, f64::max);
        let limit_ms = last_arrival + FINISH_BOUND_MS;
        let mut now = 0.0f64;
        loop {
            let engines = self.cluster.next_event_ms();
            let gateway = self.gateway.next_event_ms();
            // Periodic messages keep their queue full forever; they matter only while
            // something else is left to happen.
            let next_send = self.sends.next_ms();
            if engines.is_none() && gateway.is_none() {
                match next_send {
                    None => break,
                    Some(at) => self.skip_idle(at),
                }
            }
            self.step_one(engines, gateway, next_send, limit_ms)?;
            now = now.max(self.cluster.now_ms());
        }
        let (records, notes, not_sent) = self.tracker.finish();
        self.counters.index_every_hash = self.control.router().index_stats().every_hash;
        Ok(ReplayRun {
            spec: self.spec,
            records,
            notes,
            not_sent,
            counters: self.counters,
            end_ms: now,
        })
    }

    /// Handles the earliest of: the engines' next event, the next periodic message, the
    /// gateway stage's next event, the next send. Ties: engines, then periodic messages, then
    /// the gateway stage, then sends.
    fn step_one(
        &mut self,
        engines: Option<f64>,
        gateway: Option<f64>,
        next_send: Option<f64>,
        limit_ms: f64,
    ) -> Result<(), ReplayError> {
        let periodic = self.periodic.next_ms();
        let next = [engines, gateway, periodic, next_send]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        if next > limit_ms {
            return Err(ReplayError::DidNotFinish {
                limit_ms,
                unfinished: self.tracker.open(),
            });
        }
        if engines.is_some_and(|t| t <= next) {
            self.step_engines();
        } else if periodic.is_some_and(|t| t <= next) {
            if let Some((at, due)) = self.periodic.pop() {
                self.on_periodic(due, at);
            }
        } else if let Some(at) = gateway.filter(|&g| g <= next) {
            for event in self.gateway.take_events(at) {
                self.on_gateway(event, at);
            }
        } else if let Some((at, id)) = self.sends.pop() {
            self.send(id, at);
        }
        Ok(())
    }

    /// With nothing running and the next send more than [`IDLE_SKIP_MS`] away, moves every
    /// periodic message forward by the same whole number of their common period, so they
    /// keep their phases and order, to just before that send. What they would have done
    /// meanwhile changes nothing: idle workers report the same load, and the first tick
    /// after the skip expires whatever the skipped ones would have. So that no worker looks
    /// silent for the skipped time, every worker heartbeats and reports its load at once.
    fn skip_idle(&mut self, next_send: f64) {
        let Some(first) = self.periodic.next_ms() else {
            return;
        };
        if next_send - first <= IDLE_SKIP_MS {
            return;
        }
        let period = [
            self.spec.load_interval_ms,
            DEFAULT_HEARTBEAT_INTERVAL_MS,
            TICK_MS,
        ]
        .into_iter()
        .try_fold(1u64, |l, p| l.checked_mul(p / gcd(l, p)));
        let Some(period) = period.map(|p| p as f64).filter(|&p| p < IDLE_SKIP_MS) else {
            return;
        };
        let shift = ((next_send - first) / period).floor() * period - period;
        if shift <= 0.0 {
            return;
        }
        let mut due = Vec::with_capacity(3);
        while let Some(item) = self.periodic.pop() {
            due.push(item);
        }
        for (at, what) in due {
            self.periodic.push(at + shift, what);
        }
        self.heartbeats(first + shift);
        self.load_reports(first + shift);
        self.counters.idle_skipped_ms += shift;
    }

    /// A periodic message at `at_ms`, and the next one scheduled.
    fn on_periodic(&mut self, due: Periodic, at_ms: f64) {
        let every = match due {
            Periodic::LoadReports => {
                self.load_reports(at_ms);
                self.spec.load_interval_ms
            }
            Periodic::Heartbeats => {
                self.heartbeats(at_ms);
                DEFAULT_HEARTBEAT_INTERVAL_MS
            }
            Periodic::Tick => {
                let expired = self.control.tick(router_ms(at_ms));
                self.counters.expired_workers += expired.len() as u64;
                TICK_MS
            }
        };
        self.periodic.push(at_ms + every as f64, due);
    }

    fn step_engines(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        let step = self.cluster.step_next(&mut |e| events.push(e));
        if step.is_some() {
            self.counters.event_steps += 1;
        }
        let now = self.cluster.now_ms();
        for event in events.drain(..) {
            self.on_event(event, now);
        }
        self.events = events;
    }

    fn on_event(&mut self, event: ClusterEvent, now: f64) {
        match event {
            ClusterEvent::Output { engine, output } => self.on_output(engine, output),
            ClusterEvent::KvBatches { batches, .. } => {
                for batch in batches {
                    self.kv_batch(&batch, now);
                }
            }
            ClusterEvent::TransferStarted { tokens, .. } => {
                self.counters.transfers += 1;
                self.counters.transfer_tokens += tokens;
            }
            ClusterEvent::Rejected {
                id, error, at_ms, ..
            } => {
                self.counters.rejected += 1;
                let id = id as usize;
                self.lifecycle_done(id, None, false, at_ms);
                let ready =
                    self.tracker
                        .on_failed(self.workload, id, format!("engine: {error}"), at_ms);
                self.push_ready(ready);
            }
        }
    }

    /// A worker's KV batch reaches the control core; a resync it calls for is dumped by the
    /// worker at once (as the real worker answers the resync request on its event subject).
    fn kv_batch(&mut self, batch: &KvEventBatch, now: f64) {
        self.counters.kv_batches += 1;
        let outcome = self.control.kv_batch(batch, router_ms(now));
        if outcome.result.is_err() || outcome.resync.is_some() {
            self.counters.kv_batch_problems += 1;
        }
        self.carry_out(outcome.resync, now);
    }

    /// Carries out a resync the control core decided on.
    fn carry_out(&mut self, resync: Option<Resync>, now: f64) {
        let Some(Resync::Send { worker, .. }) = resync else {
            return;
        };
        let Some(idx) = self.cluster.index_of(&worker.0) else {
            return;
        };
        self.counters.resyncs += 1;
        for batch in self.cluster.worker_mut(idx).resync_dump() {
            self.counters.kv_batches += 1;
            let outcome = self.control.kv_batch(&batch, router_ms(now));
            if outcome.result.is_err() {
                self.counters.kv_batch_problems += 1;
            }
        }
    }

    fn on_output(&mut self, engine: EngineIdx, output: EngineOutput) {
        let id = output.id() as usize;
        if let EngineOutput::Preempted { .. } = output {
            self.counters.preemptions += 1;
            return;
        }
        // Prefill legs report from the prefill engine; the client sees the decode engine.
        if self.tracker.decode_engine(id) != Some(engine) {
            return;
        }
        match output {
            EngineOutput::FirstToken {
                cached_tokens,
                at_ms,
                ..
            } => {
                self.tracker.on_first_token(id, cached_tokens, at_ms);
                let event = LifecycleEvent::FirstToken {
                    request_id: request_id(id),
                };
                self.control.lifecycle(&event, router_ms(at_ms));
            }
            EngineOutput::Finished {
                prompt_tokens,
                completion_tokens,
                at_ms,
                kv_held: false,
                ..
            } => {
                self.lifecycle_done(id, Some((prompt_tokens, completion_tokens)), true, at_ms);
                let ready = self.tracker.on_finished(
                    self.workload,
                    id,
                    prompt_tokens,
                    completion_tokens,
                    at_ms,
                );
                self.push_ready(ready);
            }
            _ => {}
        }
    }

    fn lifecycle_done(&mut self, id: usize, usage: Option<(u32, u32)>, ok: bool, at_ms: f64) {
        let event = LifecycleEvent::Done {
            request_id: request_id(id),
            prompt_tokens: usage.map(|u| u.0),
            completion_tokens: usage.map(|u| u.1),
            ok,
            failed_open: false,
            route_call: None,
        };
        self.control.lifecycle(&event, router_ms(at_ms));
    }

    fn load_reports(&mut self, at_ms: f64) {
        let now = router_ms(at_ms);
        for idx in 0..self.cluster.len() {
            let report = self.cluster.worker(idx).load_report();
            self.control.load(&report, now);
            self.counters.load_reports += 1;
        }
    }

    /// Every worker heartbeats (the first time: registers, and is asked for a resync).
    fn heartbeats(&mut self, at_ms: f64) {
        let now = router_ms(at_ms);
        for idx in 0..self.cluster.len() {
            let hb = self
                .cluster
                .worker(idx)
                .heartbeat(DEFAULT_HEARTBEAT_INTERVAL_MS, now);
            let outcome = self.control.heartbeat(&hb, now);
            self.carry_out(outcome.resync, at_ms);
        }
    }

    /// The client sends request `id` at `at_ms`: it is routed at once, or goes through the
    /// gateway stage when the spec models one.
    fn send(&mut self, id: usize, at_ms: f64) {
        if self.spec.gateway.is_free() {
            if let Some(arrival) = self.route(id, at_ms, at_ms) {
                self.cluster.schedule(at_ms, arrival);
            }
            return;
        }
        let planned = &self.workload.requests[id];
        let tokens = self.source.prompt_tokens(planned);
        let cached = self.route_cache.see(&self.source.token_ids(planned));
        self.gateway.push(at_ms, id, tokens, cached);
    }

    fn on_gateway(&mut self, event: GatewayEvent, at_ms: f64) {
        match event {
            GatewayEvent::Routed { id, sent_ms } => match self.route(id, sent_ms, at_ms) {
                Some(arrival) => {
                    self.pending.insert(id, Pending::Arrive(arrival));
                }
                None => self.gateway.cancel(id),
            },
            GatewayEvent::FailedOpen { id, sent_ms } => {
                if let Some(pending) = self.fail_open(id, sent_ms) {
                    self.pending.insert(id, pending);
                }
            }
            GatewayEvent::Ready { id, .. } => match self.pending.remove(&id) {
                Some(Pending::Arrive(arrival)) => self.cluster.schedule(at_ms, arrival),
                Some(Pending::Refuse(record, error)) => self.refuse(*record, error, at_ms),
                None => {}
            },
        }
    }

    fn planned_record(&self, id: usize, sent_ms: f64) -> RequestRecord {
        let planned = &self.workload.requests[id];
        RequestRecord {
            id,
            session: planned.session,
            turn: planned.turn,
            agent: planned.agent,
            ready_ms: sent_ms,
            sent_ms,
            planned_isl: planned.isl(),
            expected_prompt_tokens: self.source.prompt_tokens(planned),
            planned_osl: planned.osl,
            ..RequestRecord::default()
        }
    }

    /// Request `id`'s route call timed out: as the filter fails open, Envoy's least-request
    /// fallback sends it without a verdict to the decode (or agg) worker with the fewest
    /// open requests (ties: the first), which prefills it locally. The router never sees it.
    fn fail_open(&mut self, id: usize, sent_ms: f64) -> Option<Pending> {
        let engine = self
            .fail_open_targets
            .iter()
            .copied()
            .min_by_key(|&e| self.tracker.open_on(e))?;
        self.counters.failed_open += 1;
        let planned = &self.workload.requests[id];
        let tokens = self.source.token_ids(planned);
        let record = RequestRecord {
            // The label the filter gives a request whose route call timed out.
            route: Some(Served::FailOpen(FailOpenReason::Timeout).route_header_value()),
            worker: Some(self.cluster.name(engine).to_string()),
            ..self.planned_record(id, sent_ms)
        };
        // The worker checks the context as the control plane would have, once it has read
        // and tokenized the prompt: the refusal comes when the request would have arrived.
        let max_tokens = match context_allows(tokens.len(), planned.osl, self.spec.max_model_len) {
            Ok(max_tokens) => max_tokens,
            Err((_, error)) => return Some(Pending::Refuse(Box::new(record), error)),
        };
        let prompt = hashed_prompt(&tokens, self.block_size, self.hash_seed);
        let req = EngineRequest::local(id as u64, prompt, max_tokens);
        self.tracker.on_sent(engine, record, None);
        Some(Pending::Arrive(Arrival::Direct { engine, req }))
    }

    /// Routes request `id` (sent by the client at `sent_ms`) at `at_ms` and returns how it
    /// enters the engines (`None` if routing failed; the request is then closed). TTFT and
    /// E2E count from `sent_ms`, as the real client measures them.
    fn route(&mut self, id: usize, sent_ms: f64, at_ms: f64) -> Option<Arrival> {
        let record = self.planned_record(id, sent_ms);
        let planned = &self.workload.requests[id];
        let tokens = self.source.token_ids(planned);
        let max_tokens = match context_allows(tokens.len(), planned.osl, self.spec.max_model_len) {
            Ok(max_tokens) => max_tokens,
            Err((reason, error)) => {
                let route = Served::Rejected(Rejection::ControlPlane(reason));
                let record = RequestRecord {
                    route: Some(route.route_header_value()),
                    ..record
                };
                self.refuse(record, error, at_ms);
                return None;
            }
        };
        let verdict = match self
            .control
            .route(&request_id(id), &tokens, 1, router_ms(at_ms))
        {
            Ok(v) => v,
            Err(e) => {
                self.counters.route_errors += 1;
                let ready = self.tracker.fail_unsent(
                    self.workload,
                    record,
                    (503, format!("route: {e}")),
                    at_ms,
                );
                self.push_ready(ready);
                return None;
            }
        };
        let index = |name: &WorkerId| self.cluster.index_of(&name.0);
        let decode = index(&verdict.decode.worker_id);
        let prefill = verdict.prefill.as_ref().and_then(|p| index(&p.worker_id));
        let Some(decode) = decode else {
            let error = format!("route: unknown worker {}", verdict.decode.worker_id);
            let ready = self
                .tracker
                .fail_unsent(self.workload, record, (503, error), at_ms);
            self.push_ready(ready);
            return None;
        };
        let prompt = hashed_prompt(&tokens, self.block_size, self.hash_seed);
        drop(tokens);
        let req = EngineRequest::local(id as u64, prompt, max_tokens);
        let arrival = match (verdict.mode, prefill) {
            (RouteMode::Disagg, Some(prefill)) => Arrival::Disaggregated {
                prefill,
                decode,
                req,
            },
            _ => Arrival::Direct {
                engine: decode,
                req,
            },
        };
        let note = RouteNote::from_verdict(id, at_ms, &verdict);
        let served = Served::Routed {
            mode: verdict.mode,
            destination: verdict.decode.address.clone(),
        };
        let record = RequestRecord {
            route: Some(served.route_header_value()),
            worker: Some(verdict.decode.worker_id.0),
            ..record
        };
        self.tracker.on_sent(decode, record, Some(note));
        Some(arrival)
    }
}

/// What happens to a request once the gateway has it ready for its first engine.
enum Pending {
    /// It enters the engines.
    Arrive(Arrival),
    /// The worker it failed open to refuses it (400), as the client sees it.
    Refuse(Box<RequestRecord>, InvalidRequest),
}

impl VirtualStack<'_> {
    /// Closes a request refused 400 before any engine took it (`record` as the client sees
    /// it).
    fn refuse(&mut self, record: RequestRecord, error: InvalidRequest, at_ms: f64) {
        self.counters.refused_for_context += 1;
        let ready = self
            .tracker
            .fail_unsent(self.workload, record, (400, error.message), at_ms);
        self.push_ready(ready);
    }
}

/// The output a request of `prompt_tokens` asking for `osl` tokens gets within the model's
/// context, as the real control plane and workers allow it: an output larger than the
/// context, or a prompt that leaves no room for a token, is refused (with the reason the
/// control plane gives); a larger output than what the prompt leaves is cut to it.
pub(crate) fn context_allows(
    prompt_tokens: usize,
    osl: u32,
    max_model_len: u32,
) -> Result<u32, (RejectReason, InvalidRequest)> {
    check_max_tokens(
        "max_tokens",
        i128::from(osl),
        &osl.to_string(),
        max_model_len,
    )
    .map_err(|e| (RejectReason::InvalidRequest, e))?;
    check_prompt_length(prompt_tokens, max_model_len)
        .map_err(|e| (RejectReason::of_refused_prompt(prompt_tokens), e))?;
    Ok(clamp_max_tokens(osl, prompt_tokens, max_model_len))
}

/// The request id the router and lifecycle reports use (the filter's `x-request-id`).
fn request_id(id: usize) -> String {
    format!("vt-{id}")
}

/// Router time: whole milliseconds of the virtual clock.
fn router_ms(t: f64) -> u64 {
    t.max(0.0).floor() as u64
}

/// **Simulated.** The text the control plane has tokenized, as its segment cache holds it
/// (~1 KiB chunks keyed by content, `docs/tokenization.md`): a prompt's leading chunks that
/// an earlier prompt had too cost the route call only parsing and lookups. Modelled as
/// chunk-sized token blocks chained from the prompt's start, remembered for the whole run
/// (the real cache's capacity is far beyond a replay's distinct text), and seen when the
/// request is sent rather than when its tokenization ends.
#[derive(Debug, Default)]
struct SeenText {
    chunks: std::collections::HashSet<switchyard_protocol::hash::SequenceHash>,
}

impl SeenText {
    /// About 1 KiB of English text.
    const CHUNK_TOKENS: u32 = 256;

    /// Leading tokens of `tokens` seen before, in whole chunks; then remembers them all.
    fn see(&mut self, tokens: &[u32]) -> u64 {
        let Ok(chunk) = BlockSize::try_new(Self::CHUNK_TOKENS) else {
            return 0;
        };
        let hashes = switchyard_protocol::hash::sequence_hashes(tokens, chunk, HashSeed::default());
        let seen = hashes
            .iter()
            .take_while(|h| self.chunks.contains(h))
            .count();
        self.chunks.extend(hashes);
        seen as u64 * u64::from(Self::CHUNK_TOKENS)
    }
}

/// Greatest common divisor (the periods' least common multiple is built from it).
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod seen_text_tests {
    use super::SeenText;

    #[test]
    fn a_prompt_that_extends_an_earlier_one_is_cached_up_to_its_last_whole_shared_chunk() {
        let mut seen = SeenText::default();
        let first: Vec<u32> = (0..1000).collect();
        assert_eq!(seen.see(&first), 0, "nothing seen yet");
        let mut second = first.clone();
        second.extend(5000..5600);
        // 1000 shared tokens: 3 whole chunks of 256 (the 4th ends past the shared text).
        assert_eq!(seen.see(&second), 768);
        assert_eq!(
            seen.see(&second),
            1536,
            "all 6 whole chunks, the second time"
        );
        let other: Vec<u32> = (7..1007).collect();
        assert_eq!(seen.see(&other), 0, "different text from its start");
    }
}
