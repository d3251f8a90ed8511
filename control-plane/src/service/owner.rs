//! The router owner's state and how it applies each [`Command`]. Runs on one task (see
//! [`super::spawn`]); nothing here awaits.

use tokio::time::Instant;

use switchyard_protocol::worker::WorkerRole;

use super::{Command, WorkerEntry, MIN_HEARTBEAT_INTERVAL_MS};
use crate::metrics::{Metrics, RoleLabels};
use crate::router::{KvCounters, Router, WorkerChange};

/// The owner's state: the router plus what it needs to timestamp and count.
pub(super) struct Owner {
    router: Router,
    metrics: Metrics,
    heartbeat_misses: u32,
    started: Instant,
    /// Router KV counters already folded into the metrics.
    kv_seen: KvCounters,
}

impl Owner {
    pub(super) fn new(
        router: Router,
        metrics: Metrics,
        heartbeat_misses: u32,
        started: Instant,
    ) -> Self {
        let owner = Owner {
            router,
            metrics,
            heartbeat_misses,
            started,
            kv_seen: KvCounters::default(),
        };
        owner.update_worker_gauges();
        owner
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn handle(&mut self, command: Command) {
        let now_ms = self.now_ms();
        match command {
            Command::Heartbeat { heartbeat, reply } => {
                let interval = heartbeat.interval_ms.max(MIN_HEARTBEAT_INTERVAL_MS);
                let expires = interval.saturating_mul(u64::from(self.heartbeat_misses));
                let change = self
                    .router
                    .upsert_worker(&heartbeat.worker, expires, now_ms);
                if matches!(change, WorkerChange::New | WorkerChange::Restarted) {
                    self.update_worker_gauges();
                }
                let _ = reply.send(change);
            }
            Command::KvBatch { batch, reply } => {
                let _ = reply.send(self.router.apply_kv_batch(&batch, now_ms));
            }
            Command::Load { report } => self.router.apply_load_report(&report, now_ms),
            Command::Lifecycle { batch } => {
                for event in &batch.events {
                    self.router.apply_lifecycle(event, now_ms);
                }
            }
            Command::Route {
                request_id,
                tokens,
                reply,
            } => {
                let _ = reply.send(self.router.route(&request_id, &tokens, now_ms));
            }
            Command::Workers { reply } => {
                let _ = reply.send(self.worker_entries());
            }
            Command::Config { reply } => {
                let _ = reply.send(self.router.config().clone());
            }
            Command::PatchConfig { patch, reply } => {
                let result = self
                    .router
                    .config()
                    .apply_json_patch(&patch)
                    .and_then(|next| {
                        self.router.set_config(next)?;
                        Ok(self.router.config().clone())
                    });
                if let Ok(config) = &result {
                    tracing::info!(config = %serde_json::to_string(config).unwrap_or_default(), "router config changed");
                }
                let _ = reply.send(result);
            }
        }
    }

    /// Periodic housekeeping: expire silent workers, refresh the index gauges.
    pub(super) fn tick(&mut self) {
        self.expire();
        // The router's block counters are cumulative; fold in what changed since last tick.
        let kv = self.router.kv_counters();
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
        let stats = self.router.index_stats();
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.metrics.index_blocks.set(gauge(stats.pairs));
        self.metrics.index_hashes.set(gauge(stats.distinct_hashes));
        self.metrics.index_bytes.set(gauge(stats.approx_bytes));
    }

    fn expire(&mut self) {
        let expired = self.router.expire_workers(self.now_ms());
        if !expired.is_empty() {
            for id in &expired {
                tracing::info!(worker = %id, "worker expired (heartbeats stopped)");
            }
            self.metrics.workers_expired.inc_by(expired.len() as u64);
            self.update_worker_gauges();
        }
    }

    fn worker_entries(&self) -> Vec<WorkerEntry> {
        let mut stats: std::collections::HashMap<_, _> = self
            .router
            .worker_stats()
            .into_iter()
            .map(|s| (s.worker_id.clone(), s))
            .collect();
        self.router
            .workers()
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

    fn update_worker_gauges(&self) {
        let workers = self.router.workers();
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
