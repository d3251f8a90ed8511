//! One declared worker's task: health polls put it in and out of the pools, metrics scrapes
//! give its load, its KV events feed the index (ZMQ for vLLM and SGLang, polled for
//! TensorRT-LLM).
//!
//! Decisions are the pure parts' ([`HealthTracker`], [`KvFeed`], [`TrtllmFeed`],
//! [`EngineLoad`]); this task only does I/O and carries out what they decide, one step at a
//! time, so a slow poll never interleaves with a half-applied batch.
//!
//! - **In and out.** The first good health poll registers the worker (with a fresh instance
//!   id and its feed restarted, so the router's view of its cache starts clean), every good
//!   poll after that keeps it live for `interval × unhealthy_after + timeout`, and
//!   `unhealthy_after` failed polls in a row withdraw it at once (it leaves EDS and the
//!   index). The expiry is the backstop if this task itself stops.
//! - **Load.** While healthy, each scrape becomes a load report; a capacity read from
//!   `vllm:cache_config_info` (when the pool file gives none) re-registers the worker with it.
//! - **KV events.** The SUB socket runs from the start, healthy or not, so the feed keeps
//!   vLLM's numbering; batches reach the router only while the worker is registered.
//!   A TensorRT-LLM worker's events are polled (`POST`, which drains them) at the metrics
//!   interval while it is healthy.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{interval, Instant, MissedTickBehavior};

use switchyard_adapters::trtllm::decode::{decode_body, Limits};
use switchyard_adapters::trtllm::feed::{TrtllmCounters, TrtllmFeed};
use switchyard_adapters::vllm::feed::{FeedAction, FeedCounters, KvFeed};
use switchyard_adapters::vllm::mapper::MapperConfig;
use switchyard_protocol::worker::{WorkerInfo, MAX_KV_BLOCKS};

use super::file::{DeclaredWorker, HealthSettings, KvEventsSource, MetricsSettings};
use super::first_polls::FirstPollToken;
use super::health::{HealthChange, HealthTracker};
use super::scrape::EngineLoad;
use super::zmq::{self, LiveMessage, ReplayEvent};
use crate::metrics::Metrics;
use crate::router::KvApplyOutcome;
use crate::service::ServiceHandle;

/// Live KV messages queued between the socket and this task.
const LIVE_QUEUE: usize = 1_024;
/// How long a replay may take before the gap counts as lost.
const REPLAY_DEADLINE: Duration = Duration::from_secs(5);

/// What a declared worker's task needs.
#[derive(Clone)]
pub struct WorkerContext {
    /// The router owner.
    pub service: ServiceHandle,
    /// Counters.
    pub metrics: Metrics,
    /// For health polls and scrapes.
    pub http: reqwest::Client,
    /// Health polling.
    pub health: HealthSettings,
    /// Load scraping.
    pub scrape: MetricsSettings,
}

/// Runs until aborted (the worker is no longer declared, or the service stops). The caller
/// withdraws the worker from the router after aborting. `first_poll` is released once the
/// first health poll is done.
pub async fn run(
    worker: DeclaredWorker,
    cx: WorkerContext,
    mut first_poll: Option<FirstPollToken>,
) {
    let (live_tx, mut live_rx) = mpsc::channel(LIVE_QUEUE);
    // Polled events come on their own tick; the live channel then stays open and empty.
    let mut _idle_live_tx = None;
    let _stop_subscriber = match worker.kv_events.clone() {
        KvEventsSource::Zmq(socket) => {
            Some(AbortOnDrop(tokio::spawn(zmq::subscribe(socket, live_tx))))
        }
        KvEventsSource::Polled(_) => {
            _idle_live_tx = Some(live_tx);
            None
        }
    };
    let (replay_tx, mut replay_rx) = mpsc::channel(LIVE_QUEUE);
    let mut state = Declared::new(worker, cx.clone(), replay_tx);

    let mut health_tick = interval(Duration::from_millis(cx.health.interval_ms));
    health_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut scrape_tick = interval(Duration::from_millis(cx.scrape.interval_ms));
    scrape_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut kv_tick = interval(Duration::from_millis(cx.scrape.interval_ms));
    kv_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = health_tick.tick() => {
                state.poll_health().await;
                first_poll.take();
            }
            _ = scrape_tick.tick(), if state.health.healthy() => state.scrape().await,
            _ = kv_tick.tick(), if state.polled.is_some() && state.health.healthy() => {
                state.poll_kv_events().await
            }
            Some(message) = live_rx.recv() => state.on_live(message).await,
            Some(event) = replay_rx.recv() => state.on_replay(event).await,
        }
    }
}

/// The body of `response`, refused past `max` bytes (an engine's answer is not trusted to be
/// small).
async fn read_limited(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len().saturating_add(chunk.len()) > max {
            return Err(format!("an answer of more than {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The task's state.
struct Declared {
    worker: DeclaredWorker,
    cx: WorkerContext,
    health: HealthTracker,
    feed: KvFeed,
    /// A TensorRT-LLM worker's feed (its events are polled); `None` for ZMQ publishers.
    polled: Option<TrtllmFeed>,
    /// The registration in force, while healthy.
    registered: Option<WorkerInfo>,
    /// Capacity in blocks: declared, else scraped, else 0 (unknown).
    capacity_blocks: u64,
    replay_tx: mpsc::Sender<ReplayEvent>,
    /// Feed counters already counted in the metrics.
    counted: FeedCounters,
    /// The polled feed's counters already counted.
    polled_counted: TrtllmCounters,
    /// Source of instance ids: a new one per registration.
    started: Instant,
    registrations: u64,
    /// The engine's block size when it differs from the pool file's (said once).
    block_size_mismatch: Option<u32>,
    /// The model name the engine serves when it is not the pool file's (said once per name).
    model_mismatch: Option<String>,
    /// Health polls failed before the worker first came up (its never answering is warned
    /// once).
    failed_before_first_up: u32,
    /// Why the metrics scrapes fail, while they do (warned once per streak).
    scrape_failing: Option<String>,
    /// Attempts in a row, while healthy, that found nobody at the KV event publisher's
    /// endpoint (warned once per streak, at [`KV_UNREACHABLE_WARN_AFTER`]).
    kv_unreachable_while_healthy: u32,
    /// When the feed last started over because the router dropped the worker's blocks for
    /// passing its capacity ([`OVER_CAPACITY_REJOIN_INTERVAL`] apart at most).
    over_capacity_rejoined: Option<Instant>,
    /// Whether refused KV events were warned of (once per task: they come in bursts).
    refused_said: bool,
}

/// Failed attempts in a row, with the worker healthy, before its unreachable KV event
/// publisher is warned about: a healthy engine binds its publisher before it serves, so a few
/// seconds of refused connections mean a misconfiguration (most often both sides connecting:
/// an engine endpoint naming a host connects out, and then the pool file must say
/// `kv_events_listen`).
const KV_UNREACHABLE_WARN_AFTER: u32 = 3;

/// Least time between two restarts of a feed whose events overfilled the index: an engine
/// whose own replay overfills it again is not asked again at once.
const OVER_CAPACITY_REJOIN_INTERVAL: Duration = Duration::from_secs(30);

impl Declared {
    fn new(
        worker: DeclaredWorker,
        cx: WorkerContext,
        replay_tx: mpsc::Sender<ReplayEvent>,
    ) -> Self {
        let feed = KvFeed::new(worker.id.clone(), 0, MapperConfig::new(worker.block_size));
        let polled = matches!(worker.kv_events, KvEventsSource::Polled(_))
            .then(|| TrtllmFeed::new(worker.id.clone(), 0, MapperConfig::new(worker.block_size)));
        Declared {
            polled,
            polled_counted: TrtllmCounters::default(),
            health: HealthTracker::new(cx.health.unhealthy_after),
            capacity_blocks: worker.kv_capacity_blocks.unwrap_or(0),
            worker,
            cx,
            feed,
            registered: None,
            replay_tx,
            counted: FeedCounters::default(),
            started: Instant::now(),
            registrations: 0,
            block_size_mismatch: None,
            over_capacity_rejoined: None,
            refused_said: false,
            scrape_failing: None,
            kv_unreachable_while_healthy: 0,
            failed_before_first_up: 0,
            model_mismatch: None,
        }
    }

    fn expires_after_ms(&self) -> u64 {
        self.cx
            .health
            .interval_ms
            .saturating_mul(u64::from(self.cx.health.unhealthy_after))
            .saturating_add(self.cx.health.timeout_ms)
    }

    /// GETs `url` within `timeout_ms`.
    async fn get(&self, url: &str, timeout_ms: u64) -> reqwest::Result<reqwest::Response> {
        self.cx
            .http
            .get(url)
            .timeout(Duration::from_millis(timeout_ms))
            .send()
            .await
    }

    async fn poll_health(&mut self) {
        let timeout_ms = self.cx.health.timeout_ms;
        let asked = tokio::time::Instant::now();
        let answer = match self.get(&self.worker.health_url, timeout_ms).await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(format!("answered {}", response.status())),
            // A timeout that ended long after its bound says this process did not run (the
            // host starved it), not that the engine did not answer: inconclusive, neither
            // counted nor a reset, as a stall gives heartbeats a fresh window. Three such
            // polls emptied a pool of one while its engine streamed on.
            Err(e) if overran(e.is_timeout(), asked.elapsed(), timeout_ms) => {
                tracing::debug!(worker = %self.worker.id, took_ms = asked.elapsed().as_millis() as u64, timeout_ms, "health poll overran its timeout (this process was not running): not counted");
                return;
            }
            // With its causes: reqwest's own text ("error sending request") says no more.
            Err(e) => Err(switchyard_support::cli::error_line(&e)),
        };
        let ok = answer.is_ok();
        if let Err(error) = &answer {
            tracing::debug!(worker = %self.worker.id, %error, "health poll failed");
            self.failed_before_first_up += 1;
            // A worker that never came up is in no list (the pools, /v1/workers): say it once,
            // or an address typo leaves no trace.
            if self.registrations == 0
                && self.failed_before_first_up == self.cx.health.unhealthy_after.max(1)
            {
                self.cx.metrics.declared_event("never_healthy", 1);
                tracing::warn!(worker = %self.worker.id, url = %self.worker.health_url, %error, polls = self.failed_before_first_up, "declared worker has not answered its health check since it was declared: not in the pools until it does (check its address)");
            }
        }
        match self.health.observe(ok) {
            Some(HealthChange::Up) => {
                self.cx.metrics.declared_event("health_up", 1);
                if self.worker.kv_capacity_blocks.is_none() {
                    // Register with the engine's capacity when it can be had right away.
                    self.scrape().await;
                }
                self.register().await;
            }
            Some(HealthChange::Down) => {
                self.cx.metrics.declared_event("health_down", 1);
                let error = answer.as_ref().err().map_or("", String::as_str);
                tracing::warn!(worker = %self.worker.id, url = %self.worker.health_url, %error, polls = self.cx.health.unhealthy_after, "declared worker unhealthy: out of the pools");
                self.registered = None;
                // A streak of an unreachable publisher is counted while healthy: the next
                // healthy spell is a new one.
                self.kv_unreachable_while_healthy = 0;
                let _ = self.cx.service.withdraw(self.worker.id.clone()).await;
            }
            None if ok && self.registered.is_some() => self.refresh().await,
            None => {}
        }
    }

    /// Registers under a new instance id and restarts the feed (the router forgets what it
    /// knew of the worker's cache).
    async fn register(&mut self) {
        self.registrations += 1;
        let instance_id = u64::try_from(self.started.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .wrapping_add(self.registrations);
        let info = WorkerInfo {
            worker_id: self.worker.id.clone(),
            instance_id,
            role: self.worker.role,
            address: self.worker.address.clone(),
            model: self.worker.model.clone(),
            block_size: self.worker.block_size.get(),
            kv_capacity_blocks: self.capacity_blocks,
            engine: self.worker.engine,
            bootstrap_port: self.worker.bootstrap_port,
        };
        let Ok(outcome) = self
            .cx
            .service
            .declared(info.clone(), self.expires_after_ms())
            .await
        else {
            return;
        };
        tracing::info!(worker = %self.worker.id, change = ?outcome.change, capacity_blocks = self.capacity_blocks, "declared worker healthy: in the pools");
        self.registered = Some(info);
        let rejoin = self.restart_feed(instance_id);
        self.carry_out(rejoin).await;
    }

    /// Starts the worker's KV feed over under `instance_id`: the router's view is cleared and
    /// rebuilt from what the engine still has to give (a ZMQ feed's replay; nothing for a
    /// polled one).
    fn restart_feed(&mut self, instance_id: u64) -> Vec<FeedAction> {
        match &mut self.polled {
            Some(polled) => polled
                .rejoin(instance_id)
                .into_iter()
                .map(FeedAction::Publish)
                .collect(),
            None => self.feed.rejoin(instance_id),
        }
    }

    async fn refresh(&mut self) {
        if let Some(info) = self.registered.clone() {
            let _ = self
                .cx
                .service
                .declared(info, self.expires_after_ms())
                .await;
        }
    }

    async fn scrape(&mut self) {
        let text = match self
            .get(&self.worker.metrics_url, self.cx.scrape.timeout_ms)
            .await
        {
            Ok(response) if response.status().is_success() => response
                .text()
                .await
                .map_err(|e| format!("cannot read the body: {e}")),
            Ok(response) => Err(format!("answered {}", response.status())),
            Err(e) => Err(switchyard_support::cli::error_line(&e)),
        };
        let engine = self.worker.engine;
        let block_size = self.worker.block_size.get();
        let parsed = text.and_then(|text| {
            EngineLoad::parse(engine, &text, block_size).map_err(|e| e.to_string())
        });
        let load = match parsed {
            Ok(load) => load,
            Err(error) => return self.scrape_unusable(error),
        };
        if let Some(served) = load
            .served_model
            .as_ref()
            .filter(|m| **m != self.worker.model)
        {
            // Requests name the model the pool file declares; an engine serving another name
            // answers them 404 (a typo there, or a different --served-model-name).
            if self.model_mismatch.as_ref() != Some(served) {
                self.model_mismatch = Some(served.clone());
                self.cx.metrics.declared_event("model_mismatch", 1);
                tracing::error!(worker = %self.worker.id, engine = %served, declared = %self.worker.model, "the engine serves another model name than the pool file's: requests naming the pool file's get the engine's 404 until the two agree");
            }
        }
        if let Some(size) = load
            .block_size
            .filter(|s| *s != self.worker.block_size.get())
        {
            if self.block_size_mismatch != Some(size) {
                self.block_size_mismatch = Some(size);
                self.cx.metrics.declared_event("block_size_mismatch", 1);
                tracing::error!(worker = %self.worker.id, engine = size, declared = self.worker.block_size.get(), "the engine's block size is not the pool file's: its KV events are refused until the file says {size}");
            }
        }
        if self.worker.kv_capacity_blocks.is_none() {
            // A capacity past any engine's (a float's `1e30` saturates) is not taken.
            if let Some(blocks) = load
                .capacity_blocks
                .filter(|b| *b != self.capacity_blocks && *b <= MAX_KV_BLOCKS)
            {
                self.capacity_blocks = blocks;
                if let Some(info) = &mut self.registered {
                    info.kv_capacity_blocks = blocks;
                    self.refresh().await;
                }
            }
        }
        if self.registered.is_some() {
            let report = load.report(&self.worker.id, self.capacity_blocks);
            if let Err(e) = report.check() {
                return self.scrape_unusable(e.to_string());
            }
            let _ = self.cx.service.load(report).await;
        }
        if self.scrape_failing.take().is_some() {
            tracing::info!(worker = %self.worker.id, "metrics scrape usable again");
        }
    }

    /// Counts a scrape whose load cannot be used, and says why once per failing streak (an
    /// engine without metrics fails every interval).
    fn scrape_unusable(&mut self, error: String) {
        self.cx.metrics.declared_event("scrape_failed", 1);
        if self.scrape_failing.replace(error.clone()).is_none() {
            tracing::warn!(worker = %self.worker.id, url = %self.worker.metrics_url, %error, "metrics scrape unusable: the worker's load comes from the router's own accounting until a scrape succeeds");
        } else {
            tracing::debug!(worker = %self.worker.id, %error, "metrics scrape unusable");
        }
    }

    /// Polls a TensorRT-LLM worker's KV events once and publishes what they make.
    async fn poll_kv_events(&mut self) {
        let KvEventsSource::Polled(url) = &self.worker.kv_events else {
            return;
        };
        let response = self
            .cx
            .http
            .post(url)
            .timeout(Duration::from_millis(self.cx.scrape.timeout_ms))
            .send()
            .await;
        let body = match response {
            Ok(response) if response.status().is_success() => {
                read_limited(response, Limits::DEFAULT.max_body_bytes).await
            }
            Ok(response) => Err(format!("status {}", response.status())),
            Err(e) => Err(switchyard_support::cli::error_line(&e)),
        };
        let decoded =
            match body.and_then(|b| decode_body(&b, &Limits::DEFAULT).map_err(|e| e.to_string())) {
                Ok(decoded) => decoded,
                Err(e) => {
                    // The events in a lost answer are gone for good (the POST drained them); the
                    // feed sees the gap in their ids at the next answer.
                    self.cx.metrics.declared_event("kv_poll_failed", 1);
                    tracing::debug!(worker = %self.worker.id, error = %e, "KV event poll failed");
                    return;
                }
            };
        for malformed in decoded.iter().filter_map(|d| d.as_ref().err()) {
            tracing::warn!(worker = %self.worker.id, event_id = ?malformed.event_id, error = %malformed.error, "malformed KV event: the worker's blocks are dropped and rebuilt");
        }
        let Some(polled) = &mut self.polled else {
            return;
        };
        let batches = polled.on_poll(&decoded);
        self.carry_out(batches.into_iter().map(FeedAction::Publish).collect())
            .await;
    }

    async fn on_live(&mut self, message: LiveMessage) {
        match message {
            LiveMessage::Unreachable(error) => {
                if !self.health.healthy() {
                    tracing::debug!(worker = %self.worker.id, %error, "KV event publisher not reachable yet");
                    return;
                }
                self.kv_unreachable_while_healthy += 1;
                if self.kv_unreachable_while_healthy == KV_UNREACHABLE_WARN_AFTER {
                    self.cx.metrics.declared_event("kv_unreachable", 1);
                    tracing::warn!(worker = %self.worker.id, kv_events = %self.worker.kv_events, %error, "the worker is healthy but nothing listens at its KV event endpoint, so its cache is not followed: the index holds at most what its replay socket gave when it joined, never updated (removals unseen, so its hits may be stale): if the engine's publisher connects out (its endpoint names a host), give the pool file `kv_events_listen` instead of `kv_events`");
                } else {
                    tracing::debug!(worker = %self.worker.id, %error, "KV event publisher not reachable");
                }
            }
            LiveMessage::Subscribed => {
                self.kv_unreachable_while_healthy = 0;
                let actions = self.feed.on_subscribed();
                self.carry_out(actions).await;
            }
            LiveMessage::Reconnected => {
                self.cx.metrics.declared_event("kv_reconnected", 1);
                let actions = self.feed.on_reconnected();
                self.carry_out(actions).await;
            }
            LiveMessage::Batch(Ok(batch)) => {
                let actions = self.feed.on_live(batch);
                self.carry_out(actions).await;
            }
            LiveMessage::Batch(Err(e)) => {
                self.cx.metrics.declared_event("kv_malformed", 1);
                tracing::warn!(worker = %self.worker.id, error = %e, "malformed KV event message skipped");
            }
        }
    }

    async fn on_replay(&mut self, event: ReplayEvent) {
        let actions = match event {
            ReplayEvent::Frame(frame) => self.feed.on_replay(frame),
            ReplayEvent::Malformed(e) => {
                self.cx.metrics.declared_event("kv_malformed", 1);
                tracing::warn!(worker = %self.worker.id, error = %e, "malformed replay message: the worker's blocks are dropped (what it changed is unknown) and rebuilt from the rest of the replay");
                self.feed.on_replay_malformed()
            }
            // An engine not up yet cannot answer; its subscription asks again once it is.
            ReplayEvent::Failed(e) if !self.health.healthy() => {
                tracing::debug!(worker = %self.worker.id, error = %e, "KV replay failed before the worker was healthy");
                self.feed.on_replay_failed()
            }
            ReplayEvent::Failed(e) => {
                self.cx.metrics.declared_event("kv_replay_failed", 1);
                tracing::warn!(worker = %self.worker.id, error = %e, "KV replay failed");
                self.feed.on_replay_failed()
            }
        };
        self.carry_out(actions).await;
    }

    /// Publishes the feed's batches (while registered) and starts the replays it asks for.
    async fn carry_out(&mut self, mut actions: Vec<FeedAction>) {
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                match action {
                    FeedAction::Publish(batch) if self.registered.is_some() => {
                        match self.cx.service.kv_batch(batch).await.map(|o| o.result) {
                            Ok(Err(e)) => {
                                tracing::warn!(worker = %self.worker.id, error = %e, "KV batch refused by the router");
                            }
                            Ok(Ok(KvApplyOutcome::OverCapacity { .. })) => {
                                next.extend(self.rejoin_over_capacity());
                            }
                            _ => {}
                        }
                    }
                    FeedAction::Publish(_) => {}
                    FeedAction::RequestReplay { from } => match &self.worker.kv_replay {
                        Some(endpoint) => {
                            // At each subscription too, not only after a gap: a publisher
                            // drops what it sends while nobody listens.
                            tracing::info!(worker = %self.worker.id, from, "asking the worker's replay socket for its KV events");
                            tokio::spawn(zmq::replay(
                                endpoint.clone(),
                                from,
                                REPLAY_DEADLINE,
                                self.replay_tx.clone(),
                            ));
                        }
                        // No replay socket declared: the gap cannot be filled.
                        None => next.extend(self.feed.on_replay_failed()),
                    },
                }
            }
            actions = next;
        }
        self.count_feed();
    }

    /// The router dropped the worker's blocks for passing its capacity: the feed starts over
    /// under the same registration (its mapper cleared, the engine's buffered events replayed),
    /// as it does when the engine's socket reconnects; at most once per
    /// [`OVER_CAPACITY_REJOIN_INTERVAL`].
    fn rejoin_over_capacity(&mut self) -> Vec<FeedAction> {
        let Some(instance_id) = self.registered.as_ref().map(|r| r.instance_id) else {
            return Vec::new();
        };
        if self
            .over_capacity_rejoined
            .is_some_and(|at| at.elapsed() < OVER_CAPACITY_REJOIN_INTERVAL)
        {
            return Vec::new();
        }
        self.over_capacity_rejoined = Some(Instant::now());
        self.cx.metrics.declared_event("kv_over_capacity_rejoin", 1);
        self.restart_feed(instance_id)
    }

    /// Warns once that the engine's KV events were refused, when they first are.
    fn say_refused(&mut self, more: u64) {
        if more > 0 && !self.refused_said {
            self.refused_said = true;
            tracing::warn!(worker = %self.worker.id, refused = more, "KV events refused (a block size or token count other than the pool file's, or a block chained to one never seen): those blocks are not indexed; counted in switchyard_declared_worker_events_total{{reason=\"kv_refused_event\"}}, said once");
        }
    }

    fn count_feed(&mut self) {
        self.count_polled_feed();
        let now = self.feed.counters();
        let was = std::mem::replace(&mut self.counted, now);
        self.say_refused(now.refused_events - was.refused_events);
        let m = &self.cx.metrics;
        m.declared_event("kv_gap_replayed", now.replayed_gaps - was.replayed_gaps);
        m.declared_event(
            "kv_gap_unrecoverable",
            now.unrecoverable_gaps - was.unrecoverable_gaps,
        );
        m.declared_event("kv_restart", now.restarts - was.restarts);
        m.declared_event(
            "kv_partial_rejoin",
            now.partial_rejoins - was.partial_rejoins,
        );
        m.declared_event("kv_refused_event", now.refused_events - was.refused_events);
        if now.unrecoverable_gaps > was.unrecoverable_gaps {
            tracing::warn!(worker = %self.worker.id, "KV events lost (missed beyond the engine's replay buffer, or a replay that failed or did not decode): the worker's blocks were dropped and are rebuilt from new events");
        }
    }

    fn count_polled_feed(&mut self) {
        let Some(polled) = &self.polled else {
            return;
        };
        let now = polled.counters();
        let was = std::mem::replace(&mut self.polled_counted, now);
        self.say_refused(now.refused_events - was.refused_events);
        let m = &self.cx.metrics;
        m.declared_event("kv_gap_unrecoverable", now.gaps - was.gaps);
        m.declared_event("kv_restart", now.restarts - was.restarts);
        m.declared_event("kv_refused_event", now.refused_events - was.refused_events);
        m.declared_event("kv_malformed", now.malformed_events - was.malformed_events);
        m.declared_event("kv_other_window", now.other_window - was.other_window);
        if now.gaps > was.gaps {
            tracing::warn!(worker = %self.worker.id, "KV events missed (TensorRT-LLM keeps no replay): the worker's blocks were dropped and are rebuilt from new events");
        }
    }
}

/// Whether a poll that timed out after `took`, against a bound of `timeout_ms`, overran it by
/// so much that this process, not the engine, was not running: the timer fired late.
fn overran(timed_out: bool, took: Duration, timeout_ms: u64) -> bool {
    timed_out && took > Duration::from_millis(timeout_ms.saturating_mul(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_that_fired_long_after_its_bound_is_the_control_planes_stall() {
        // The engine did not answer within 500 ms: it counts.
        assert!(!overran(true, Duration::from_millis(510), 500));
        // The timer fired 3 s late: the process was starved, nothing is known of the engine.
        assert!(overran(true, Duration::from_millis(3_000), 500));
        // Other failures are the engine's however long they took.
        assert!(!overran(false, Duration::from_millis(3_000), 500));
    }
}
