//! The router owner's state and how it applies each [`Command`]. Runs on one task (see
//! [`super::spawn`]); nothing here awaits. What a message does to the routing state is the
//! [`ControlCore`]'s (the same code the virtual-time replay drives); the owner adds the clock
//! and the metrics.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use switchyard_protocol::replica::ReplicaUpdate;
use switchyard_protocol::worker::WorkerRole;

use super::{Command, WorkerEntry};
use crate::config::RouterConfig;
use crate::config_version::{IfMatch, PatchRefusal};
use crate::metrics::{
    set_gauges, variant_label, Metrics, ModelLabels, ModelRoleLabels, RoleLabels, WorkerLabels,
};
use crate::replicas::ReplicaLink;
use crate::router::{ControlCore, KvApplyOutcome, KvCounters, Router, WorkerChange};

/// The owner's state: the control core plus what it needs to timestamp and count.
pub(super) struct Owner {
    core: ControlCore,
    metrics: Metrics,
    started: Instant,
    /// Router KV counters and stalls already folded into the metrics.
    kv_seen: KvCounters,
    late_routes_seen: u64,
    stale_released_seen: u64,
    stalls_seen: u64,
    nats_dropped_seen: u64,
    /// Per-model gauges set so far (removed once their model has no live worker).
    model_workers_seen: BTreeSet<ModelRoleLabels>,
    model_blocks_seen: BTreeSet<ModelLabels>,
    /// Per-worker gauges set so far (removed once their worker left).
    workers_seen: BTreeSet<WorkerLabels>,
    /// The other replicas, when this is one of several.
    replicas: Option<ReplicaLink>,
    /// Version of the shared config in force (0: the start-up config, not shared yet).
    config_version: u64,
}

impl Owner {
    pub(super) fn new(
        router: Router,
        metrics: Metrics,
        heartbeat_misses: u32,
        started: Instant,
        replicas: Option<ReplicaLink>,
    ) -> Self {
        let mut owner = Owner {
            core: ControlCore::new(router, heartbeat_misses),
            metrics,
            started,
            kv_seen: KvCounters::default(),
            late_routes_seen: 0,
            stale_released_seen: 0,
            stalls_seen: 0,
            // The count is the process's: drops before this owner began are not its own (a
            // test process runs several control planes).
            nats_dropped_seen: switchyard_bus::slow_consumer_events(),
            model_workers_seen: BTreeSet::new(),
            model_blocks_seen: BTreeSet::new(),
            workers_seen: BTreeSet::new(),
            replicas,
            config_version: 0,
        };
        owner.update_worker_gauges();
        owner
    }

    /// Milliseconds since start on tokio's clock (tests pause it).
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn router(&self) -> &Router {
        self.core.router()
    }

    pub(super) fn handle(&mut self, command: Command) {
        let now_ms = self.now_ms();
        match command {
            Command::Heartbeat { heartbeat, reply } => {
                let outcome = self.core.heartbeat(&heartbeat, now_ms);
                if matches!(outcome.change, WorkerChange::New | WorkerChange::Restarted) {
                    self.update_worker_gauges();
                }
                let _ = reply.send(outcome);
            }
            Command::Declared {
                worker,
                expires_after_ms,
                reply,
            } => {
                let outcome = self.core.declared(&worker, expires_after_ms, now_ms);
                if matches!(outcome.change, WorkerChange::New | WorkerChange::Restarted) {
                    self.update_worker_gauges();
                }
                let _ = reply.send(outcome);
            }
            Command::DeclaredIds { ids, reply } => {
                let taken = self.core.set_declared_ids(ids, now_ms);
                if !taken.is_empty() {
                    self.update_worker_gauges();
                }
                let _ = reply.send(taken);
            }
            Command::Withdraw { worker, reply } => {
                let removed = self.core.withdraw(&worker, now_ms);
                if removed {
                    self.update_worker_gauges();
                }
                let _ = reply.send(removed);
            }
            Command::KvBatch { batch, reply } => {
                let outcome = self.core.kv_batch(&batch, now_ms);
                // Counted here, whichever source the batch came from (NATS, a vLLM feed).
                match &outcome.result {
                    Ok(KvApplyOutcome::OverCapacity { held, limit }) => {
                        self.metrics.kv_batches_applied.inc();
                        tracing::warn!(
                            worker = %batch.worker_id,
                            held,
                            limit,
                            "the worker's KV events hold more blocks than twice its cache: they were all dropped from the index and a resync asked (missed removals, or a publisher that is not its engine; if its registered capacity is too low, correct it)"
                        );
                    }
                    Ok(_) => {
                        self.metrics.kv_batches_applied.inc();
                    }
                    Err(e) => self.metrics.kv_rejected(&variant_label(e)),
                }
                let _ = reply.send(outcome);
            }
            Command::Load { report } => {
                // An unknown worker's report is ordinary (it comes before the heartbeat);
                // one of another process under a registered id is counted.
                let known = self.core.router().knows(&report.worker_id);
                if !self.core.load(&report, now_ms) && known {
                    self.metrics.load_reports_ignored.inc();
                    tracing::debug!(worker = %report.worker_id, instance = ?report.instance_id, "load report of another process than the registered one ignored");
                }
            }
            Command::Lifecycle { batch } => {
                for event in &batch.events {
                    self.core.lifecycle(event, now_ms);
                }
                if let Some(link) = &self.replicas {
                    link.share(ReplicaUpdate::Lifecycle {
                        events: batch.events,
                    });
                }
            }
            Command::Route { request, reply } if request.dry_run => {
                let _ = reply.send(self.core.preview(
                    &request.request_id,
                    request.prompt.as_prompt(),
                    request.choices,
                    request.model.as_deref(),
                    now_ms,
                ));
            }
            Command::Route { request, reply } => {
                let verdict = self.core.route_numbered(
                    &request.request_id,
                    request.route_call,
                    request.prompt.as_prompt(),
                    request.choices,
                    request.model.as_deref(),
                    now_ms,
                );
                if let (Ok(_), Some(link)) = (&verdict, &self.replicas) {
                    if let Some((decode, prefill)) =
                        self.core.router().shared_route(&request.request_id)
                    {
                        link.share(ReplicaUpdate::Routed {
                            request_id: request.request_id,
                            decode,
                            prefill,
                        });
                    }
                }
                let _ = reply.send(verdict);
            }
            Command::Peer { update } => self.apply_peer(update, now_ms),
            Command::SetSharedConfig {
                config,
                version,
                current,
                reply,
            } => {
                let stale = version < self.config_version && !current;
                let result = if version == self.config_version || stale {
                    Ok(())
                } else {
                    if version < self.config_version {
                        tracing::warn!(
                            version,
                            was = self.config_version,
                            "the shared config store's revisions restarted (NATS lost or recreated its JetStream data): following it from this revision"
                        );
                    }
                    self.core.router_mut().set_config(config).map(|()| {
                        self.set_config_version(version);
                        tracing::info!(version, config = %serde_json::to_string(self.router().config()).unwrap_or_default(), "shared router config applied");
                    })
                };
                let _ = reply.send(result);
            }
            Command::DumpsPending { reply } => {
                let _ = reply.send(self.core.dumps_pending(now_ms));
            }
            Command::HeartbeatsReachable { reachable, reply } => {
                if reachable {
                    tracing::info!("heartbeats reachable again: worker expiry resumes after a full heartbeat window");
                } else {
                    tracing::warn!("heartbeats unreachable (NATS down): keeping every known worker until they can arrive again");
                }
                let _ = reply.send(self.core.heartbeats_reachable(reachable, now_ms));
            }
            Command::Workers { reply } => {
                let _ = reply.send(self.worker_entries());
            }
            Command::Config { reply } => {
                let _ = reply.send((self.router().config().clone(), self.config_version));
            }
            Command::PatchConfig {
                patch,
                if_match,
                reply,
            } => {
                let _ = reply.send(self.patch_config(&patch, if_match.as_ref()));
            }
        }
        self.fold_stalls();
    }

    /// The version of the config in force, kept and exported (`switchyard_config_version`).
    fn set_config_version(&mut self, version: u64) {
        self.config_version = version;
        self.metrics
            .config_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// A change to this process's own config (no `--replica-id`): made if `if_match`
    /// admits the current version, which then counts one up.
    fn patch_config(
        &mut self,
        patch: &serde_json::Value,
        if_match: Option<&IfMatch>,
    ) -> Result<(RouterConfig, u64), PatchRefusal> {
        if if_match.is_some_and(|condition| !condition.admits(self.config_version)) {
            return Err(PatchRefusal::Stale {
                current: self.config_version,
            });
        }
        let next = self.router().config().apply_json_patch(patch)?;
        // A change that changes nothing keeps the version: an operator's `If-Match` on it
        // still holds, and nothing is logged as changed.
        if next == *self.router().config() {
            return Ok((next, self.config_version));
        }
        let router = self.core.router_mut();
        router.set_config(next)?;
        let config = router.config().clone();
        self.set_config_version(self.config_version + 1);
        tracing::info!(version = self.config_version, config = %serde_json::to_string(&config).unwrap_or_default(), "router config changed");
        Ok((config, self.config_version))
    }

    /// Another replica's decision or lifecycle reports, applied as if they were this one's.
    fn apply_peer(&mut self, update: ReplicaUpdate, now_ms: u64) {
        match update {
            ReplicaUpdate::Routed {
                request_id,
                decode,
                prefill,
            } => match self
                .core
                .peer_route(&request_id, &decode, prefill.as_ref(), now_ms)
            {
                Ok(()) => self.metrics.replica_update("applied"),
                Err(error) => {
                    tracing::debug!(%error, request_id, "peer decision not applied");
                    self.metrics.replica_update("rejected");
                }
            },
            ReplicaUpdate::Lifecycle { events } => {
                for event in &events {
                    self.core.lifecycle(event, now_ms);
                }
                self.metrics.replica_update("applied");
            }
        }
    }

    /// Periodic housekeeping: expire silent workers, refresh the index gauges.
    pub(super) fn tick(&mut self) {
        let expired = self.core.tick(self.now_ms());
        if !expired.is_empty() {
            for id in &expired {
                tracing::info!(worker = %id, "worker expired (heartbeats stopped)");
            }
            self.metrics.workers_expired.inc_by(expired.len() as u64);
            self.update_worker_gauges();
            // No decode worker left: every request now fails open to an Envoy cluster that may
            // have no host left, and clients get 503s. Said at each expiry while none is left.
            let left = self.router().workers();
            if !left.iter().any(|w| w.info.role.serves_decode()) {
                tracing::warn!(
                    expired = expired.len(),
                    "no live decode worker left: requests fail open, and Envoy answers 503 \
                     while its decode cluster has no host; check the workers and how they \
                     reach the control plane (heartbeats over NATS, the pool file's health polls)"
                );
            }
        }
        self.fold_stalls();
        self.fold_nats_drops();
        // The router's block counters are cumulative; fold in what changed since last tick.
        let kv = self.router().kv_counters();
        let seen = std::mem::replace(&mut self.kv_seen, kv);
        self.metrics
            .kv_blocks_stored
            .inc_by(kv.blocks_stored.saturating_sub(seen.blocks_stored));
        self.metrics
            .kv_blocks_removed
            .inc_by(kv.blocks_removed.saturating_sub(seen.blocks_removed));
        self.metrics
            .kv_unknown_removals
            .inc_by(kv.unknown_removals.saturating_sub(seen.unknown_removals));
        self.metrics
            .kv_clears
            .inc_by(kv.clears.saturating_sub(seen.clears));
        self.metrics.kv_over_capacity_drops.inc_by(
            kv.over_capacity_drops
                .saturating_sub(seen.over_capacity_drops),
        );
        let late = self.router().late_routes();
        let seen = std::mem::replace(&mut self.late_routes_seen, late);
        self.metrics
            .late_route_calls
            .inc_by(late.saturating_sub(seen));
        let stale = self.router().stale_in_flight_released();
        let seen = std::mem::replace(&mut self.stale_released_seen, stale);
        self.metrics
            .stale_in_flight_released
            .inc_by(stale.saturating_sub(seen));
        let stats = self.router().index_stats();
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.metrics.index_blocks.set(gauge(stats.pairs));
        self.metrics.index_hashes.set(gauge(stats.distinct_hashes));
        self.metrics.index_bytes.set(gauge(stats.approx_bytes));
        self.metrics
            .index_table_hashes
            .set(gauge(stats.table_hashes));
        self.metrics
            .index_every_hash
            .set(i64::from(stats.every_hash));
        let learned = self.router().learned_timing();
        for (part, ratio) in [("prefill", learned.prefill), ("decode", learned.decode)] {
            self.metrics
                .slo_cost_learned_scale
                .get_or_create(&crate::metrics::PartLabels { part })
                .set(ratio.scale());
        }
        let mut blocks: BTreeMap<ModelLabels, i64> = BTreeMap::new();
        let mut per_worker = BTreeMap::new();
        for worker in self.router().worker_stats() {
            let load = worker.load;
            per_worker.insert(
                WorkerLabels {
                    worker: worker.worker_id.0.clone(),
                    role: worker.role.as_str(),
                    model: worker.model.clone(),
                },
                [
                    i64::from(load.in_flight),
                    gauge(load.active_blocks),
                    gauge(load.prefill_tokens),
                    gauge(worker.cached_blocks),
                ],
            );
            *blocks
                .entry(ModelLabels {
                    model: worker.model,
                })
                .or_default() += gauge(worker.cached_blocks);
        }
        set_gauges(
            &self.metrics.model_index_blocks,
            &mut self.model_blocks_seen,
            blocks,
        );
        self.metrics
            .set_worker_gauges(&mut self.workers_seen, per_worker);
    }

    /// Counts (and says) every stall the core saw since the last call.
    fn fold_stalls(&mut self) {
        let stalls = self.core.stalls();
        if stalls > self.stalls_seen {
            tracing::warn!("the control plane did not run for a while (stopped or starved); workers got a fresh heartbeat window");
            self.metrics.stalls.inc_by(stalls - self.stalls_seen);
            self.stalls_seen = stalls;
        }
    }

    /// Counts the NATS messages the client dropped since the last call (see
    /// [`switchyard_bus::slow_consumer_events`]).
    fn fold_nats_drops(&mut self) {
        let dropped = switchyard_bus::slow_consumer_events();
        if dropped > self.nats_dropped_seen {
            self.metrics
                .nats_dropped_messages
                .inc_by(dropped - self.nats_dropped_seen);
            self.nats_dropped_seen = dropped;
        }
    }

    fn worker_entries(&self) -> Vec<WorkerEntry> {
        let mut stats: std::collections::HashMap<_, _> = self
            .router()
            .worker_stats()
            .into_iter()
            .map(|s| (s.worker_id.clone(), s))
            .collect();
        self.router()
            .live_workers(self.now_ms())
            .into_iter()
            .map(|view| {
                let stats = stats.remove(&view.info.worker_id);
                WorkerEntry {
                    load: stats.as_ref().map(|s| s.load),
                    cached_blocks: stats.map(|s| s.cached_blocks).unwrap_or(0),
                    view,
                }
            })
            .collect()
    }

    fn update_worker_gauges(&mut self) {
        let workers = self.router().workers();
        let mut per_model: BTreeMap<ModelRoleLabels, i64> = BTreeMap::new();
        for worker in &workers {
            *per_model
                .entry(ModelRoleLabels {
                    model: worker.info.model.clone(),
                    role: worker.info.role.as_str(),
                })
                .or_default() += 1;
        }
        set_gauges(
            &self.metrics.model_live_workers,
            &mut self.model_workers_seen,
            per_model,
        );
        for role in [WorkerRole::Prefill, WorkerRole::Decode, WorkerRole::Agg] {
            let live = workers.iter().filter(|w| w.info.role == role).count();
            self.metrics
                .live_workers
                .get_or_create(&RoleLabels {
                    role: role.as_str().to_string(),
                })
                .set(i64::try_from(live).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchyard_protocol::worker::{WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};
    use tokio::sync::oneshot;

    use super::*;

    fn heartbeat(id: &str) -> Command {
        heartbeat_of_model(id, "m")
    }

    /// A heartbeat of worker `id` serving `model`, at an address of its own (one address is
    /// one engine): the id's hash picks the port.
    fn heartbeat_of_model(id: &str, model: &str) -> Command {
        use std::hash::BuildHasher;
        let (reply, _) = oneshot::channel();
        let hashed = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
        let port = 10_000 + hashed.hash_one(id) % 50_000;
        Command::Heartbeat {
            heartbeat: WorkerHeartbeat {
                v: 1,
                worker: WorkerInfo {
                    worker_id: WorkerId(id.into()),
                    instance_id: 1,
                    role: WorkerRole::Decode,
                    address: format!("127.0.0.1:{port}"),
                    model: model.into(),
                    block_size: 16,
                    kv_capacity_blocks: 100,
                    engine: Default::default(),
                    bootstrap_port: None,
                },
                interval_ms: 1_000,
                sent_at_ms: 0,
                signature: None,
            },
            reply,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_longer_than_the_heartbeat_window_expires_nobody() {
        let metrics = Metrics::default();
        let mut owner = Owner::new(Router::new(), metrics.clone(), 3, Instant::now(), None);
        owner.handle(heartbeat("decode-0"));
        owner.tick();
        // The process is stopped for 5 s (SIGSTOP): no tick, no heartbeat processed.
        tokio::time::advance(Duration::from_secs(5)).await;
        owner.tick();
        assert_eq!(
            owner.router().workers().len(),
            1,
            "not expired by the stall"
        );
        assert_eq!(metrics.stalls.get(), 1);
        // Heartbeats really stop: ordinary expiry after the window.
        for _ in 0..16 {
            tokio::time::advance(Duration::from_millis(200)).await;
            owner.tick();
        }
        assert!(
            owner.router().workers().is_empty(),
            "expired after the window"
        );
        assert_eq!(metrics.stalls.get(), 1, "ticks 200 ms apart are no stall");
    }

    #[tokio::test(start_paused = true)]
    async fn nats_drops_are_counted_from_the_owners_start() {
        // Before this control plane began (another in the same process, say): not counted.
        switchyard_bus::log_event(async_nats::Event::SlowConsumer(7));
        let metrics = Metrics::default();
        let mut owner = Owner::new(Router::new(), metrics.clone(), 3, Instant::now(), None);
        owner.tick();
        assert_eq!(metrics.nats_dropped_messages.get(), 0);
        switchyard_bus::log_event(async_nats::Event::SlowConsumer(7));
        owner.tick();
        assert_eq!(metrics.nats_dropped_messages.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn per_model_and_per_worker_gauges_follow_the_live_workers_and_drop_those_that_left() {
        let metrics = Metrics::default();
        let mut owner = Owner::new(Router::new(), metrics.clone(), 3, Instant::now(), None);
        owner.handle(heartbeat_of_model("a-0", "alpha"));
        owner.handle(heartbeat_of_model("a-1", "alpha"));
        owner.handle(heartbeat_of_model("b-0", "beta"));
        owner.tick();
        let live = |model: &str| {
            metrics
                .model_live_workers
                .get(&ModelRoleLabels {
                    model: model.into(),
                    role: "decode",
                })
                .map(|g| g.get())
        };
        let blocks = |model: &str| {
            metrics
                .model_index_blocks
                .get(&ModelLabels {
                    model: model.into(),
                })
                .map(|g| g.get())
        };
        let worker_series = |id: &str, model: &str| {
            let labels = WorkerLabels {
                worker: id.into(),
                role: "decode",
                model: model.into(),
            };
            [
                &metrics.worker_in_flight,
                &metrics.worker_active_blocks,
                &metrics.worker_prefill_tokens,
                &metrics.worker_cached_blocks,
            ]
            .map(|family| family.get(&labels).map(|g| g.get()))
        };
        assert_eq!((live("alpha"), live("beta")), (Some(2), Some(1)));
        assert_eq!((blocks("alpha"), blocks("beta")), (Some(0), Some(0)));
        assert_eq!(worker_series("b-0", "beta"), [Some(0); 4]);
        // Only alpha's workers keep beating: beta expires and its series go.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(200)).await;
            owner.handle(heartbeat_of_model("a-0", "alpha"));
            owner.handle(heartbeat_of_model("a-1", "alpha"));
            owner.tick();
        }
        assert_eq!((live("alpha"), live("beta")), (Some(2), None));
        assert_eq!((blocks("alpha"), blocks("beta")), (Some(0), None));
        assert_eq!(
            worker_series("b-0", "beta"),
            [None; 4],
            "a worker that left has no series"
        );
        assert_eq!(worker_series("a-1", "alpha"), [Some(0); 4]);
    }
}
