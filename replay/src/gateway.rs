//! The gateway's CPU time before a request reaches its first engine: the control plane's route
//! call (a bounded FIFO of tokenizing threads) and the first worker's tokenization
//! (processor-shared), on a fixed number of cores, with the filter's route timeout.
//!
//! **Simulated.** On the real stack a request does not reach a worker's engine at the instant
//! the client sends it:
//!
//! 1. the filter sends the body to the control plane, which parses it, applies the chat
//!    template and tokenizes the prompt to route it. Text it has tokenized before (a
//!    conversation's earlier turns, a growing message's start) comes from its segment cache
//!    and costs only parsing, rendering and lookups ([`GatewayModel::route_ms_per_cached_token`]);
//!    the rest is encoded ([`GatewayModel::route_ms_per_prompt_token`]). At most
//!    [`GatewayModel::route_threads`] route calls tokenize at once per lane (the control
//!    plane's `--route-tokenize-threads` semaphores, FIFO): long prompts
//!    ([`GatewayModel::long_lane_min_tokens`], the control plane's 64 KiB bodies) and short
//!    ones each have a lane, so long cold prompts never hold up short ones.
//! 2. If no verdict arrives within the filter's route timeout (a base plus a budget per
//!    prompt token, the filter's per-MiB budget, capped), the request **fails open**:
//!    Envoy forwards it unrouted to a decode worker (least-request over the decode cluster),
//!    which prefills it locally. The control plane's tokenization that already started runs
//!    to completion anyway (a blocking thread cannot be cancelled; its permit is held until
//!    then) and its verdict is thrown away; a call still waiting for a permit is dropped.
//! 3. The worker the request goes to first (agg/decode worker, or the prefill worker of a
//!    disaggregated request) tokenizes it again on a blocking thread, unbounded.
//!
//! Every running tokenization shares the machine's cores (processor sharing: `n` running
//! jobs each progress at `min(1, cpus / n)`). Two consequences the engine model alone misses:
//! every TTFT grows by the request's own gateway time (more under a burst), and a burst of
//! simultaneous arrivals reaches the engines roughly **shortest prompt first**, so a single
//! prefill worker's FCFS queue is not in arrival order (`docs/virtual-time.md`). The default
//! [`GatewayModel::FREE`] turns the stage off (the modelled GPUs only); the real-stack
//! cross-check sets it from a measurement of the tokenizer on the same machine.

/// CPU cost of the gateway path per request, how it is shared, and the route timeout.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct GatewayModel {
    /// CPU time per prompt token before the route call is dispatched (the client rendering
    /// and sending the body, Envoy buffering it), modelled ms; processor-shared, so a burst
    /// sent at once reaches the control plane's FIFO shortest body first.
    pub body_ms_per_prompt_token: f64,
    /// The control plane's CPU time per prompt token for one route call (parse, chat
    /// template, tokenizer), in the run's time unit (modelled ms), for text it has not seen.
    pub route_ms_per_prompt_token: f64,
    /// The same for prompt tokens whose text the control plane tokenized before (its segment
    /// cache holds them: parse, template and lookups only), modelled ms.
    pub route_ms_per_cached_token: f64,
    /// Route calls that tokenize at once per lane; later ones wait in FIFO order (the control
    /// plane's `--route-tokenize-threads`). 0: no bound.
    pub route_threads: u32,
    /// Prompts of at least this many tokens take the long lane, the others the short one
    /// (the control plane's lanes split bodies at 64 KiB). 0: one lane for all.
    pub long_lane_min_tokens: u64,
    /// The first worker's CPU time per prompt token before its engine sees the request,
    /// modelled ms, for text it has not tokenized before.
    pub worker_ms_per_prompt_token: f64,
    /// The same for text it has: workers keep a segment cache as the control plane does.
    /// The control plane's cached share stands in for the worker's own (a session's turns go
    /// to the worker that served the earlier ones, which saw the same text), modelled ms.
    pub worker_ms_per_cached_token: f64,
    /// Cores all of the gateway work shares (fractional: the machine's cores less what other
    /// work took on average).
    pub cpus: f64,
    /// CPU time per prompt token a disaggregated request spends between its prefill leg and
    /// its KV transfer (the decode worker tokenizes the decode leg's body), modelled ms; not
    /// shared, see [`switchyard_engine::vtime::Cluster::set_handoff_cpu_ms`]; for tokens the
    /// decode worker does not cache.
    pub decode_leg_ms_per_prompt_token: f64,
    /// The same for tokens it caches (it tokenized their text before), modelled ms.
    pub decode_leg_ms_per_cached_token: f64,
    /// The filter's route call timeout, modelled ms: a request whose route tokenization has
    /// not finished this long after it was sent fails open. `None`: never.
    pub route_timeout_ms: Option<f64>,
    /// Extra route timeout per prompt token, modelled ms (the filter's
    /// `route_timeout_ms_per_mib` at the workload's bytes per token).
    pub route_timeout_ms_per_token: f64,
    /// The longest route timeout whatever the prompt, modelled ms (the filter's cap).
    /// `None`: no cap.
    pub route_timeout_cap_ms: Option<f64>,
}

impl GatewayModel {
    /// No gateway cost: a request reaches the router and its engine when it is sent.
    pub const FREE: GatewayModel = GatewayModel {
        body_ms_per_prompt_token: 0.0,
        route_ms_per_prompt_token: 0.0,
        route_ms_per_cached_token: 0.0,
        route_threads: 0,
        long_lane_min_tokens: 0,
        worker_ms_per_prompt_token: 0.0,
        worker_ms_per_cached_token: 0.0,
        cpus: 1.0,
        decode_leg_ms_per_prompt_token: 0.0,
        decode_leg_ms_per_cached_token: 0.0,
        route_timeout_ms: None,
        route_timeout_ms_per_token: 0.0,
        route_timeout_cap_ms: None,
    };

    /// Whether the stage costs nothing (then requests skip it, and nothing fails open).
    pub fn is_free(&self) -> bool {
        self.body_ms_per_prompt_token <= 0.0
            && self.route_ms_per_prompt_token <= 0.0
            && self.worker_ms_per_prompt_token <= 0.0
    }

    /// The body's CPU work before the route call for `prompt_tokens` tokens, ms.
    pub fn body_work_ms(&self, prompt_tokens: u64) -> f64 {
        self.body_ms_per_prompt_token.max(0.0) * prompt_tokens as f64
    }

    /// The control plane's CPU work for a prompt of `prompt_tokens` tokens of which it has
    /// seen the first `cached_tokens` before, ms.
    pub fn route_work_ms(&self, prompt_tokens: u64, cached_tokens: u64) -> f64 {
        let cached = cached_tokens.min(prompt_tokens);
        self.route_ms_per_cached_token.max(0.0) * cached as f64
            + self.route_ms_per_prompt_token.max(0.0) * (prompt_tokens - cached) as f64
    }

    /// The filter's route timeout for a prompt of `prompt_tokens` tokens, ms; `None`: never.
    pub fn route_timeout_for(&self, prompt_tokens: u64) -> Option<f64> {
        let base = self.route_timeout_ms?;
        let timeout = base + self.route_timeout_ms_per_token.max(0.0) * prompt_tokens as f64;
        Some(
            self.route_timeout_cap_ms
                .map_or(timeout, |cap| timeout.min(cap)),
        )
    }

    fn long_lane(&self, prompt_tokens: u64) -> bool {
        self.long_lane_min_tokens > 0 && prompt_tokens >= self.long_lane_min_tokens
    }

    /// The first worker's CPU work for a prompt of `prompt_tokens` tokens whose first
    /// `cached_tokens` it has tokenized before, ms.
    pub fn worker_work_ms(&self, prompt_tokens: u64, cached_tokens: u64) -> f64 {
        let cached = cached_tokens.min(prompt_tokens);
        self.worker_ms_per_cached_token.max(0.0) * cached as f64
            + self.worker_ms_per_prompt_token.max(0.0) * (prompt_tokens - cached) as f64
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// A message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("body ms per prompt token", self.body_ms_per_prompt_token),
            ("route ms per prompt token", self.route_ms_per_prompt_token),
            ("route ms per cached token", self.route_ms_per_cached_token),
            (
                "route timeout ms per token",
                self.route_timeout_ms_per_token,
            ),
            (
                "worker ms per prompt token",
                self.worker_ms_per_prompt_token,
            ),
            (
                "worker ms per cached token",
                self.worker_ms_per_cached_token,
            ),
            (
                "decode-leg ms per prompt token",
                self.decode_leg_ms_per_prompt_token,
            ),
            (
                "decode-leg ms per cached token",
                self.decode_leg_ms_per_cached_token,
            ),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("gateway {name} must be finite and >= 0, got {v}"));
            }
        }
        for (name, t) in [
            ("route timeout", self.route_timeout_ms),
            ("route timeout cap", self.route_timeout_cap_ms),
        ] {
            if let Some(t) = t {
                if !(t.is_finite() && t > 0.0) {
                    return Err(format!("gateway {name} must be finite and > 0 ms, got {t}"));
                }
            }
        }
        if !(self.cpus.is_finite() && self.cpus > 0.0) {
            return Err(format!(
                "gateway cpus must be finite and > 0, got {}",
                self.cpus
            ));
        }
        Ok(())
    }
}

impl Default for GatewayModel {
    fn default() -> Self {
        GatewayModel::FREE
    }
}

/// Work below this (ms) counts as done, absorbing floating-point rounding.
const DONE_EPS_MS: f64 = 1e-9;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The body on its way to the route call (client, Envoy).
    Body,
    /// Waiting for a route-tokenizing thread (FIFO).
    Queued,
    /// The control plane is tokenizing it for the route call.
    Route,
    /// The route call timed out while tokenizing: the work goes on, its verdict is dropped.
    Orphan,
    /// The first worker is tokenizing it.
    Worker,
}

/// One job in the stage.
#[derive(Debug, Clone, Copy)]
struct Job {
    id: usize,
    sent_ms: f64,
    stage: Stage,
    remaining_ms: f64,
    route_ms: f64,
    worker_ms: f64,
    /// When the route call was dispatched (its timeout runs from there).
    dispatched_ms: f64,
    /// Its route timeout, ms (`None`: never).
    timeout_ms: Option<f64>,
    /// Whether it takes the long lane.
    long_lane: bool,
    /// Place in the route FIFO.
    seq: u64,
}

impl Job {
    fn running(&self) -> bool {
        self.stage != Stage::Queued
    }

    fn holds_route_thread(&self) -> bool {
        matches!(self.stage, Stage::Route | Stage::Orphan)
    }

    fn awaits_verdict(&self) -> bool {
        matches!(self.stage, Stage::Queued | Stage::Route)
    }
}

/// What happened to a request in the stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum GatewayEvent {
    /// Its route tokenization finished in time: route it now; its worker tokenization
    /// starts (cancel it with [`GatewayQueue::cancel`] if routing fails).
    Routed { id: usize, sent_ms: f64 },
    /// Its route call timed out: send it unrouted to a decode worker now; its worker
    /// tokenization starts.
    FailedOpen { id: usize, sent_ms: f64 },
    /// Its worker tokenization finished: it reaches its engine now.
    Ready { id: usize, sent_ms: f64 },
}

/// Requests in the gateway stage. Pure: times are passed in and never go backwards.
#[derive(Debug)]
pub(crate) struct GatewayQueue {
    model: GatewayModel,
    now_ms: f64,
    next_seq: u64,
    /// In entry order (the FIFO order of queued route calls).
    jobs: Vec<Job>,
}

impl GatewayQueue {
    pub(crate) fn new(model: GatewayModel) -> Self {
        GatewayQueue {
            model,
            now_ms: 0.0,
            next_seq: 0,
            jobs: Vec::new(),
        }
    }

    /// Share of one core each running job gets now.
    fn rate(&self) -> f64 {
        let running = self.jobs.iter().filter(|j| j.running()).count();
        if running == 0 {
            1.0
        } else {
            (self.model.cpus / running as f64).min(1.0)
        }
    }

    fn advance_to(&mut self, t: f64) {
        if t > self.now_ms {
            let done = (t - self.now_ms) * self.rate();
            for job in self.jobs.iter_mut().filter(|j| j.running()) {
                job.remaining_ms -= done;
            }
            self.now_ms = t;
        }
    }

    /// Starts queued route calls while their lane has a thread free.
    fn admit(&mut self) {
        let limit = match self.model.route_threads {
            0 => usize::MAX,
            n => n as usize,
        };
        for long_lane in [false, true] {
            let in_lane = |j: &&mut Job| j.long_lane == long_lane;
            let mut busy = self
                .jobs
                .iter()
                .filter(|j| j.long_lane == long_lane && j.holds_route_thread())
                .count();
            while busy < limit {
                let next = self
                    .jobs
                    .iter_mut()
                    .filter(in_lane)
                    .filter(|j| j.stage == Stage::Queued)
                    .min_by_key(|j| j.seq);
                let Some(job) = next else { break };
                job.stage = Stage::Route;
                busy += 1;
            }
        }
    }

    /// The route call of `job` is dispatched now: it joins the FIFO.
    fn dispatch(&mut self, mut job: Job) -> Job {
        job.stage = Stage::Queued;
        job.remaining_ms = job.route_ms;
        job.dispatched_ms = self.now_ms;
        job.seq = self.next_seq;
        self.next_seq += 1;
        job
    }

    fn deadline(&self, job: &Job) -> Option<f64> {
        let timeout = job.timeout_ms?;
        job.awaits_verdict().then_some(job.dispatched_ms + timeout)
    }

    /// Request `id` with a prompt of `prompt_tokens`, the first `cached_tokens` of which the
    /// control plane has tokenized before, sent at `t`, enters the stage with the body, route
    /// and worker CPU work the model gives it.
    pub(crate) fn push(&mut self, t: f64, id: usize, prompt_tokens: u64, cached_tokens: u64) {
        self.advance_to(t);
        let body_ms = self.model.body_work_ms(prompt_tokens);
        let job = Job {
            id,
            sent_ms: t,
            stage: Stage::Body,
            remaining_ms: body_ms,
            route_ms: self.model.route_work_ms(prompt_tokens, cached_tokens),
            worker_ms: self.model.worker_work_ms(prompt_tokens, cached_tokens),
            dispatched_ms: t,
            timeout_ms: self.model.route_timeout_for(prompt_tokens),
            long_lane: self.model.long_lane(prompt_tokens),
            seq: 0,
        };
        let job = if body_ms <= DONE_EPS_MS {
            self.dispatch(job)
        } else {
            job
        };
        self.jobs.push(job);
        self.admit();
    }

    /// When the next job changes stage (at the current sharing), or a route call times out.
    pub(crate) fn next_event_ms(&self) -> Option<f64> {
        let rate = self.rate();
        let done = self
            .jobs
            .iter()
            .filter(|j| j.running())
            .map(|j| self.now_ms + j.remaining_ms.max(0.0) / rate);
        let timeouts = self.jobs.iter().filter_map(|j| self.deadline(j));
        done.chain(timeouts).min_by(f64::total_cmp)
    }

    /// Advances to `t` (at most [`Self::next_event_ms`]) and returns what happened by then, in
    /// entry order: finished work first (a verdict that lands on its deadline is in time),
    /// then timeouts.
    pub(crate) fn take_events(&mut self, t: f64) -> Vec<GatewayEvent> {
        self.advance_to(t);
        let mut events = Vec::new();
        // Zero-work stages finish at once, so repeat until nothing changes.
        loop {
            let before = events.len();
            let mut next = Vec::with_capacity(self.jobs.len());
            for mut job in std::mem::take(&mut self.jobs) {
                let (id, sent_ms) = (job.id, job.sent_ms);
                if job.running() && job.remaining_ms <= DONE_EPS_MS {
                    match job.stage {
                        Stage::Body => {
                            let job = self.dispatch(job);
                            next.push(job);
                        }
                        Stage::Route => {
                            events.push(GatewayEvent::Routed { id, sent_ms });
                            job.stage = Stage::Worker;
                            job.remaining_ms = job.worker_ms;
                            next.push(job);
                        }
                        Stage::Worker => events.push(GatewayEvent::Ready { id, sent_ms }),
                        Stage::Orphan | Stage::Queued => {}
                    }
                    continue;
                }
                if self.deadline(&job).is_some_and(|d| d <= t) {
                    events.push(GatewayEvent::FailedOpen { id, sent_ms });
                    if job.stage == Stage::Route {
                        next.push(Job {
                            stage: Stage::Orphan,
                            ..job
                        });
                    }
                    next.push(Job {
                        stage: Stage::Worker,
                        remaining_ms: job.worker_ms,
                        ..job
                    });
                    continue;
                }
                next.push(job);
            }
            self.jobs = next;
            self.admit();
            if events.len() == before {
                break;
            }
        }
        events
    }

    /// Drops request `id`'s worker tokenization (its routing failed).
    pub(crate) fn cancel(&mut self, id: usize) {
        self.jobs
            .retain(|j| !(j.id == id && j.stage == Stage::Worker));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `route` and `worker` ms per token, route threads, cores, timeout.
    fn model(
        route: f64,
        worker: f64,
        threads: u32,
        cpus: f64,
        timeout: Option<f64>,
    ) -> GatewayModel {
        GatewayModel {
            body_ms_per_prompt_token: 0.0,
            route_ms_per_prompt_token: route,
            route_ms_per_cached_token: 0.0,
            route_threads: threads,
            long_lane_min_tokens: 0,
            route_timeout_ms_per_token: 0.0,
            route_timeout_cap_ms: None,
            worker_ms_per_prompt_token: worker,
            worker_ms_per_cached_token: 0.0,
            cpus,
            decode_leg_ms_per_prompt_token: 0.0,
            decode_leg_ms_per_cached_token: 0.0,
            route_timeout_ms: timeout,
        }
    }

    /// Every event until the stage is empty, with its time.
    fn drain(q: &mut GatewayQueue) -> Vec<(GatewayEvent, f64)> {
        let mut out = Vec::new();
        while let Some(t) = q.next_event_ms() {
            for e in q.take_events(t) {
                out.push((e, t));
            }
        }
        out
    }

    /// `(id, time)` of the events `pick` names, in the order they happened.
    fn times_of(
        events: &[(GatewayEvent, f64)],
        pick: impl Fn(&GatewayEvent) -> Option<usize>,
    ) -> Vec<(usize, f64)> {
        events
            .iter()
            .filter_map(|(e, t)| pick(e).map(|id| (id, *t)))
            .collect()
    }

    fn ready_order(events: &[(GatewayEvent, f64)]) -> Vec<(usize, f64)> {
        times_of(events, |e| match e {
            GatewayEvent::Ready { id, .. } => Some(*id),
            _ => None,
        })
    }

    fn routed(events: &[(GatewayEvent, f64)]) -> Vec<(usize, f64)> {
        times_of(events, |e| match e {
            GatewayEvent::Routed { id, .. } => Some(*id),
            _ => None,
        })
    }

    fn failed_open(events: &[(GatewayEvent, f64)]) -> Vec<(usize, f64)> {
        times_of(events, |e| match e {
            GatewayEvent::FailedOpen { id, .. } => Some(*id),
            _ => None,
        })
    }

    #[test]
    fn a_burst_leaves_shortest_first_under_processor_sharing() {
        let mut q = GatewayQueue::new(model(0.01, 0.0, 0, 1.0, None));
        // Sent together, longest first (as a trace burst in id order can be).
        for (id, tokens) in [(0, 3000u64), (1, 1000), (2, 2000)] {
            q.push(0.0, id, tokens, 0);
        }
        let ready = ready_order(&drain(&mut q));
        let order: Vec<usize> = ready.iter().map(|o| o.0).collect();
        assert_eq!(order, vec![1, 2, 0]);
        // One core shared three ways: the 10 ms job ends at 30 ms, the 20 ms one at
        // 30 + 10·2 = 50 ms, the 30 ms one at 50 + 10 = 60 ms (total work 60 ms).
        for ((_, got), want) in ready.iter().zip([30.0, 50.0, 60.0]) {
            assert!((got - want).abs() < 1e-6, "{ready:?}");
        }
        assert_eq!(q.next_event_ms(), None);
    }

    #[test]
    fn route_threads_serve_route_calls_in_arrival_order() {
        // One route thread, two cores: the 1000-token call waits for the 3000-token one.
        let mut q = GatewayQueue::new(model(0.01, 0.01, 1, 2.0, None));
        q.push(0.0, 0, 3000, 0);
        q.push(0.0, 1, 1000, 0);
        let events = drain(&mut q);
        let routed = routed(&events);
        // Request 0 routes at 30 ms; then request 1's route call (10 ms) and request 0's
        // worker tokenization (30 ms) run side by side on the two cores.
        assert_eq!(routed.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((routed[0].1 - 30.0).abs() < 1e-6 && (routed[1].1 - 40.0).abs() < 1e-6);
        let ready = ready_order(&events);
        assert!(
            (ready[0].1 - 50.0).abs() < 1e-6 && ready[0].0 == 1,
            "{ready:?}"
        );
        assert!(
            (ready[1].1 - 60.0).abs() < 1e-6 && ready[1].0 == 0,
            "{ready:?}"
        );
    }

    #[test]
    fn the_body_stage_orders_a_burst_shortest_first_into_the_route_fifo() {
        // One route thread: in send order the 3000-token call would go first. The bodies'
        // processor-shared transfer (0.001 ms per token) dispatches the short one first, and
        // the timeout counts from the dispatch.
        let mut m = model(0.01, 0.0, 1, 2.0, Some(35.0));
        m.body_ms_per_prompt_token = 0.001;
        let mut q = GatewayQueue::new(m);
        q.push(0.0, 0, 3000, 0);
        q.push(0.0, 1, 1000, 0);
        let events = drain(&mut q);
        let routed = routed(&events);
        // Bodies: 1 ms and 3 ms on two cores. Request 1's call runs 1–11 ms; request 0's,
        // dispatched at 3 ms, waits for the thread and runs 11–41 ms: 38 ms after its
        // dispatch, past the 35 ms timeout, so it fails open at 38 ms.
        assert_eq!(routed.len(), 1, "{events:?}");
        assert_eq!(routed[0].0, 1);
        assert!((routed[0].1 - 11.0).abs() < 1e-6, "{routed:?}");
        let failed = failed_open(&events);
        assert_eq!(failed.len(), 1, "{events:?}");
        assert_eq!(failed[0].0, 0);
        assert!((failed[0].1 - 38.0).abs() < 1e-6, "{failed:?}");
    }

    #[test]
    fn a_late_verdict_fails_open_and_its_tokenization_still_costs_cpu() {
        // One core, one route thread, 25 ms timeout. Request 0 needs 30 ms of route work:
        // it fails open at 25 ms and keeps its thread until its work is done at 30 ms (the
        // orphan shares the core with its own worker tokenization from 25 ms on); request 1,
        // queued behind it, times out at 26 ms without ever starting.
        let mut q = GatewayQueue::new(model(0.01, 0.01, 1, 1.0, Some(25.0)));
        q.push(0.0, 0, 3000, 0);
        q.push(1.0, 1, 100, 0);
        let events = drain(&mut q);
        let failed: Vec<(usize, f64)> = events
            .iter()
            .filter_map(|(e, t)| match e {
                GatewayEvent::FailedOpen { id, sent_ms } => {
                    assert_eq!(*sent_ms, if *id == 0 { 0.0 } else { 1.0 });
                    Some((*id, *t))
                }
                _ => None,
            })
            .collect();
        assert_eq!(failed, vec![(0, 25.0), (1, 26.0)]);
        assert!(
            !events
                .iter()
                .any(|(e, _)| matches!(e, GatewayEvent::Routed { .. })),
            "{events:?}"
        );
        // From 25 ms: the orphan (5 ms left) and request 0's worker work (30 ms) share the
        // core; from 26 ms request 1's worker work (1 ms) joins. Shares: 25–26 two ways
        // (0.5 ms each), then three ways: the 1 ms job ends at 26 + 3 = 29 ms, the orphan's
        // remaining 4.5 − 1 = 3.5 ms at 29 + 2·3.5 = 36 ms, request 0's worker job (29.5 −
        // 1 − 3.5 = 25 ms left) at 36 + 25 = 61 ms.
        let ready = ready_order(&events);
        assert_eq!(ready.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 0]);
        assert!((ready[0].1 - 29.0).abs() < 1e-6, "{ready:?}");
        assert!((ready[1].1 - 61.0).abs() < 1e-6, "{ready:?}");
    }

    #[test]
    fn a_verdict_on_its_deadline_is_in_time() {
        let mut q = GatewayQueue::new(model(0.01, 0.0, 1, 1.0, Some(10.0)));
        q.push(0.0, 0, 1000, 0);
        let events = drain(&mut q);
        assert_eq!(
            events,
            vec![
                (
                    GatewayEvent::Routed {
                        id: 0,
                        sent_ms: 0.0
                    },
                    10.0
                ),
                (
                    GatewayEvent::Ready {
                        id: 0,
                        sent_ms: 0.0
                    },
                    10.0
                )
            ]
        );
    }

    #[test]
    fn spare_cores_do_not_speed_up_one_request() {
        let mut q = GatewayQueue::new(model(0.01, 0.0, 0, 4.0, None));
        q.push(5.0, 7, 1000, 0);
        q.push(5.0, 8, 500, 0);
        assert_eq!(q.next_event_ms(), Some(10.0));
        let got = q.take_events(10.0);
        assert!(
            got.contains(&GatewayEvent::Ready {
                id: 8,
                sent_ms: 5.0
            }),
            "{got:?}"
        );
        assert_eq!(q.next_event_ms(), Some(15.0));
        assert!(q.take_events(14.0).is_empty(), "not done before its time");
        assert_eq!(
            q.take_events(15.0),
            vec![
                GatewayEvent::Routed {
                    id: 7,
                    sent_ms: 5.0
                },
                GatewayEvent::Ready {
                    id: 7,
                    sent_ms: 5.0
                }
            ]
        );
        assert_eq!(q.next_event_ms(), None);
    }

    #[test]
    fn a_cancelled_worker_tokenization_never_ends() {
        let mut q = GatewayQueue::new(model(0.01, 0.01, 0, 1.0, None));
        q.push(0.0, 1, 100, 0);
        assert_eq!(
            q.take_events(1.0),
            vec![GatewayEvent::Routed {
                id: 1,
                sent_ms: 0.0
            }]
        );
        q.cancel(1);
        assert_eq!(q.next_event_ms(), None);
    }

    #[test]
    fn validation_and_free_model() {
        assert!(GatewayModel::FREE.is_free());
        assert!(GatewayModel::FREE.validate().is_ok());
        assert!(model(-1.0, 0.0, 2, 1.0, None).validate().is_err());
        assert!(model(f64::NAN, 0.0, 2, 1.0, None).validate().is_err());
        assert!(model(0.0, f64::INFINITY, 2, 1.0, None).validate().is_err());
        assert!(model(0.01, 0.0, 2, 0.0, None).validate().is_err());
        assert!(model(0.01, 0.0, 2, 1.0, Some(0.0)).validate().is_err());
        let mut bad_leg = model(0.01, 0.0, 2, 1.0, None);
        bad_leg.decode_leg_ms_per_prompt_token = -0.5;
        assert!(bad_leg.validate().is_err());
        assert!(!model(0.0, 0.01, 2, 1.0, None).is_free());
        assert_eq!(model(0.5, 0.25, 2, 2.0, None).route_work_ms(10, 0), 5.0);
        assert_eq!(model(0.5, 0.25, 2, 2.0, None).worker_work_ms(10, 0), 2.5);
        let mut bad_cap = model(0.01, 0.0, 2, 1.0, Some(10.0));
        bad_cap.route_timeout_cap_ms = Some(-1.0);
        assert!(bad_cap.validate().is_err());
    }

    /// A worker tokenizes a later turn's earlier text from its segment cache too: charging
    /// every token the uncached rate made later turns' virtual TTFT several times the real
    /// stack's in the cross-check.
    #[test]
    fn text_the_worker_has_seen_costs_its_cached_rate() {
        let mut m = model(0.0, 0.5, 0, 1.0, None);
        m.worker_ms_per_cached_token = 0.01;
        assert_eq!(m.worker_work_ms(1000, 900), 900.0 * 0.01 + 100.0 * 0.5);
        assert_eq!(m.worker_work_ms(100, 500), 100.0 * 0.01);
    }

    #[test]
    fn text_the_control_plane_has_seen_costs_its_cached_rate() {
        let mut m = model(0.5, 0.0, 0, 1.0, None);
        m.route_ms_per_cached_token = 0.01;
        assert_eq!(m.route_work_ms(1000, 900), 900.0 * 0.01 + 100.0 * 0.5);
        assert_eq!(
            m.route_work_ms(100, 500),
            1.0,
            "never more cached than the prompt"
        );
    }

    #[test]
    fn a_longer_prompt_gets_a_longer_route_budget_up_to_the_cap() {
        let mut m = model(0.0, 0.0, 0, 1.0, Some(100.0));
        m.route_timeout_ms_per_token = 0.01;
        m.route_timeout_cap_ms = Some(500.0);
        assert_eq!(m.route_timeout_for(1000), Some(110.0));
        assert_eq!(m.route_timeout_for(1_000_000), Some(500.0));
        assert_eq!(model(0.0, 0.0, 0, 1.0, None).route_timeout_for(1000), None);

        // Both time out on the base budget alone; only the short one does with the extra.
        let mut q = GatewayQueue::new(GatewayModel {
            route_ms_per_prompt_token: 0.1,
            ..m
        });
        q.push(0.0, 0, 10_000, 0); // 1000 ms of work, budget 200 ms
        q.push(0.0, 1, 1_500, 0); // 150 ms of work, budget 115 ms
        assert_eq!(failed_open(&drain(&mut q)), vec![(1, 115.0), (0, 200.0)]);
    }

    #[test]
    fn long_prompts_queue_in_their_own_lane() {
        // One thread per lane; prompts of 1000 tokens or more are long.
        let mut m = model(0.1, 0.0, 1, 4.0, None);
        m.long_lane_min_tokens = 1000;
        let mut q = GatewayQueue::new(m);
        q.push(0.0, 0, 5000, 0); // long: 500 ms
        q.push(0.0, 1, 5000, 0); // long: waits for 0
        q.push(0.0, 2, 100, 0); // short: its own lane, 10 ms
        assert_eq!(
            routed(&drain(&mut q)),
            vec![(2, 10.0), (0, 500.0), (1, 1000.0)]
        );

        // With one lane the short prompt waits behind both long ones.
        let mut q = GatewayQueue::new(model(0.1, 0.0, 1, 4.0, None));
        q.push(0.0, 0, 5000, 0);
        q.push(0.0, 1, 5000, 0);
        q.push(0.0, 2, 100, 0);
        assert_eq!(
            routed(&drain(&mut q)),
            vec![(0, 500.0), (1, 1000.0), (2, 1010.0)]
        );
    }
}
