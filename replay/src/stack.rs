//! The virtual stack: simulated engines and the control plane's router in one process,
//! advanced by a discrete-event clock.
//!
//! One run, step by step (all at virtual times; ties resolve in this order):
//! 1. **Engines** ([`Cluster::step_next`]): iteration ends, transfers, prefill legs. Their KV
//!    events go to the router at once as numbered [`KvEventBatch`]es (as the NATS consumer
//!    would apply them), first tokens and completions as lifecycle events (as the filter
//!    reports them), and the records are completed.
//! 2. **Load reports** every [`StackSpec::load_interval_ms`]: each engine's
//!    [`switchyard_engine::LoadSnapshot`] as the worker would publish it.
//! 3. **Gateway events** (only with a [`StackSpec::gateway`] cost, [`super::gateway`]): a
//!    request whose route tokenization finished is routed ([`Router::route`] with the
//!    router's state at that instant); one whose route call timed out **fails open** to the
//!    decode worker with the fewest open requests, without a verdict (as Envoy's
//!    least-request fallback); one whose first worker's tokenization finished enters the
//!    engines.
//! 4. **Arrivals**: the request's token ids are made; without a gateway cost (the default)
//!    it is routed at once and enters the engines the verdict names (straight to the decode
//!    worker, or prefill leg, KV transfer, decode leg). With one, it enters the gateway stage.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use switchyard_protocol::hash::{BlockSize, HashSeed};
use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::RouteMode;
use switchyard_protocol::worker::{WorkerId, WorkerInfo, WorkerRole};
use switchyard_router::{KvApplyOutcome, Router};

use super::gateway::{GatewayEvent, GatewayQueue};
use super::spec::{ReplayCounters, ReplayRun, StackSpec};
use super::tokens::{hashed_prompt, PromptSource};
use super::tracker::{RouteNote, Tracker};
use super::ReplayError;
use switchyard_engine::vtime::{Arrival, Cluster, ClusterEvent, EngineIdx};
use switchyard_engine::{EngineConfig, EngineOutput, EngineRequest};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::Workload;

/// Virtual time past the last planned arrival after which a run counts as stuck (10 days).
const FINISH_BOUND_MS: f64 = 10.0 * 86_400_000.0;

/// A request due to be sent at a virtual time; the earliest first, then in push order.
#[derive(Debug, PartialEq)]
struct Due {
    at_ms: f64,
    order: u64,
    id: usize,
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_ms
            .total_cmp(&self.at_ms)
            .then(other.order.cmp(&self.order))
    }
}

/// Engines, router and the event loop of one run (see the module docs).
pub struct VirtualStack<'a> {
    spec: StackSpec,
    workload: &'a Workload,
    source: &'a PromptSource,
    cluster: Cluster,
    router: Router,
    worker_ids: Vec<WorkerId>,
    kv_seq: Vec<u64>,
    block_size: BlockSize,
    hash_seed: HashSeed,
    arrivals: BinaryHeap<Due>,
    order: u64,
    next_tick_ms: f64,
    tracker: Tracker,
    counters: ReplayCounters,
    events: Vec<ClusterEvent>,
    gateway: GatewayQueue,
    /// Requests routed (or failed open) and still in their first worker's tokenization: what
    /// enters the engines when it ends.
    pending: HashMap<usize, Arrival>,
    /// Engines a request that fails open can go to (Envoy's decode cluster: decode or agg).
    fail_open_targets: Vec<EngineIdx>,
}

impl<'a> VirtualStack<'a> {
    /// Cold workers and a fresh router for `workload`.
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
        if !(spec.time_scale.is_finite() && spec.time_scale >= 0.0) {
            return Err(ReplayError::InvalidSetup(format!(
                "time scale must be finite and >= 0, got {}",
                spec.time_scale
            )));
        }
        spec.gateway.validate().map_err(ReplayError::InvalidSetup)?;
        if spec.load_interval_ms == 0 {
            return Err(ReplayError::InvalidSetup(
                "load interval must be at least 1 ms".into(),
            ));
        }
        let mut router_config = spec.router.clone();
        router_config.serving_mode = spec.mode;
        router_config.validate()?;
        let mut router = Router::with_config(router_config, spec.seed);
        let mut cluster = Cluster::new();
        cluster.set_forward_kv_events(true);
        cluster.set_handoff_cpu_ms_per_prompt_token(spec.gateway.decode_leg_ms_per_prompt_token);
        let mut worker_ids = Vec::new();
        let mut counts = [0u32; 3];
        let mut block_size = None;
        let roles = spec.roles()?;
        let fail_open_targets = roles
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, WorkerRole::Decode | WorkerRole::Agg))
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
            };
            block_size = Some(cfg.block_size()?);
            cluster.add_engine(name, cfg)?;
            // Virtual workers never miss a heartbeat: one registration that never expires.
            router.upsert_worker(&info, u64::MAX, 0);
            worker_ids.push(info.worker_id);
        }
        let block_size =
            block_size.ok_or_else(|| ReplayError::InvalidSetup("no workers".into()))?;
        let mut tracker = Tracker::new(workload, spec.time_scale);
        if let Some(sent) = &spec.sent_ms {
            tracker.set_sent_override(sent.clone());
        }
        let mut stack = VirtualStack {
            kv_seq: vec![0; worker_ids.len()],
            worker_ids,
            cluster,
            router,
            block_size,
            hash_seed: HashSeed::default(),
            arrivals: BinaryHeap::new(),
            order: 0,
            next_tick_ms: 0.0,
            tracker,
            counters: ReplayCounters::default(),
            events: Vec::new(),
            gateway: GatewayQueue::new(spec.gateway),
            pending: HashMap::new(),
            fail_open_targets,
            spec,
            workload,
            source,
        };
        let ready: Vec<(usize, f64)> = stack.tracker.initially_ready(workload).collect();
        stack.push_ready(ready);
        Ok(stack)
    }

    fn push_ready(&mut self, ready: Vec<(usize, f64)>) {
        for (id, at_ms) in ready {
            self.order += 1;
            self.arrivals.push(Due {
                at_ms,
                order: self.order,
                id,
            });
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
            .map(|r| r.arrival_ms as f64 * self.spec.time_scale)
            .fold(0.0, f64::max);
        let limit_ms = last_arrival + FINISH_BOUND_MS;
        let mut now = 0.0f64;
        loop {
            let engines = self.cluster.next_event_ms();
            let arrival = self.arrivals.peek().map(|d| d.at_ms);
            let gateway = self.gateway.next_event_ms();
            let Some(next) = [engines, arrival, gateway]
                .into_iter()
                .flatten()
                .min_by(f64::total_cmp)
            else {
                break;
            };
            if next.min(self.next_tick_ms) > limit_ms {
                return Err(ReplayError::DidNotFinish {
                    limit_ms,
                    unfinished: self.tracker.open(),
                });
            }
            if engines.is_some_and(|t| t <= self.next_tick_ms && t <= next) {
                self.step_engines();
            } else if self.next_tick_ms <= next {
                self.report_load();
            } else if let Some(at) = gateway.filter(|&g| g <= next) {
                for event in self.gateway.take_events(at) {
                    self.on_gateway(event, at);
                }
            } else if let Some(due) = self.arrivals.pop() {
                self.send(due.id, due.at_ms);
            }
            now = now.max(self.cluster.now_ms());
        }
        let (records, notes, not_sent) = self.tracker.finish();
        Ok(ReplayRun {
            spec: self.spec,
            records,
            notes,
            not_sent,
            counters: self.counters,
            end_ms: now,
        })
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
            ClusterEvent::KvEvents { engine, events } => {
                self.kv_seq[engine] += 1;
                let batch = KvEventBatch {
                    v: switchyard_protocol::PROTOCOL_VERSION,
                    worker_id: self.worker_ids[engine].clone(),
                    instance_id: 1,
                    seq: self.kv_seq[engine],
                    resync: false,
                    events,
                };
                self.counters.kv_batches += 1;
                match self.router.apply_kv_batch(&batch, router_ms(now)) {
                    Ok(KvApplyOutcome::Applied) => {}
                    Ok(KvApplyOutcome::NeedsResync) | Err(_) => {
                        self.counters.kv_batch_problems += 1;
                    }
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
                self.router.apply_lifecycle(&event, router_ms(at_ms));
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
        };
        self.router.apply_lifecycle(&event, router_ms(at_ms));
    }

    fn report_load(&mut self) {
        let now = router_ms(self.next_tick_ms);
        for (idx, id) in self.worker_ids.iter().enumerate() {
            let report = self.cluster.engine(idx).load().to_load_report(id.clone());
            self.router.apply_load_report(&report, now);
            self.counters.load_reports += 1;
        }
        self.next_tick_ms += self.spec.load_interval_ms as f64;
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
        let tokens = self.source.prompt_tokens(&self.workload.requests[id]);
        self.gateway.push(at_ms, id, tokens);
    }

    fn on_gateway(&mut self, event: GatewayEvent, at_ms: f64) {
        match event {
            GatewayEvent::Routed { id, sent_ms } => match self.route(id, sent_ms, at_ms) {
                Some(arrival) => {
                    self.pending.insert(id, arrival);
                }
                None => self.gateway.cancel(id),
            },
            GatewayEvent::FailedOpen { id, sent_ms } => {
                if let Some(arrival) = self.fail_open(id, sent_ms) {
                    self.pending.insert(id, arrival);
                }
            }
            GatewayEvent::Ready { id, .. } => {
                if let Some(arrival) = self.pending.remove(&id) {
                    self.cluster.schedule(at_ms, arrival);
                }
            }
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
    fn fail_open(&mut self, id: usize, sent_ms: f64) -> Option<Arrival> {
        let engine = self
            .fail_open_targets
            .iter()
            .copied()
            .min_by_key(|&e| self.tracker.open_on(e))?;
        self.counters.failed_open += 1;
        let planned = &self.workload.requests[id];
        let tokens = self.source.token_ids(planned);
        let prompt = hashed_prompt(&tokens, self.block_size, self.hash_seed);
        let req = EngineRequest::local(id as u64, prompt, planned.osl);
        let record = RequestRecord {
            route: Some(FAIL_OPEN_TIMEOUT.to_string()),
            worker: Some(self.worker_ids[engine].0.clone()),
            ..self.planned_record(id, sent_ms)
        };
        self.tracker.on_sent(engine, record, None);
        Some(Arrival::Direct { engine, req })
    }

    /// Routes request `id` (sent by the client at `sent_ms`) at `at_ms` and returns how it
    /// enters the engines (`None` if routing failed; the request is then closed). TTFT and
    /// E2E count from `sent_ms`, as the real client measures them.
    fn route(&mut self, id: usize, sent_ms: f64, at_ms: f64) -> Option<Arrival> {
        let record = self.planned_record(id, sent_ms);
        let planned = &self.workload.requests[id];
        let tokens = self.source.token_ids(planned);
        let verdict = match self
            .router
            .route(&request_id(id), &tokens, router_ms(at_ms))
        {
            Ok(v) => v,
            Err(e) => {
                self.counters.route_errors += 1;
                let ready =
                    self.tracker
                        .fail_unsent(self.workload, record, format!("route: {e}"), at_ms);
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
                .fail_unsent(self.workload, record, error, at_ms);
            self.push_ready(ready);
            return None;
        };
        let prompt = hashed_prompt(&tokens, self.block_size, self.hash_seed);
        drop(tokens);
        let req = EngineRequest::local(id as u64, prompt, planned.osl);
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
        let record = RequestRecord {
            route: Some(verdict.mode.as_str().to_string()),
            worker: Some(verdict.decode.worker_id.0),
            ..record
        };
        self.tracker.on_sent(decode, record, Some(note));
        Some(arrival)
    }
}

/// The route header of a request whose route call timed out, as the filter writes it.
pub const FAIL_OPEN_TIMEOUT: &str = "fail-open;reason=timeout";

/// The request id the router and lifecycle reports use (the filter's `x-request-id`).
fn request_id(id: usize) -> String {
    format!("vt-{id}")
}

/// Router time: whole milliseconds of the virtual clock.
fn router_ms(t: f64) -> u64 {
    t.max(0.0).floor() as u64
}
