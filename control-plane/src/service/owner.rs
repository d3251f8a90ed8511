//! The router owner's state and how it applies each [`Command`]. Runs on one task (see
//! [`super::spawn`]); nothing here awaits.

use tokio::time::Instant;

use switchyard_protocol::worker::WorkerRole;

use super::{Command, WorkerEntry, MIN_HEARTBEAT_INTERVAL_MS};
use crate::metrics::{Metrics, RoleLabels};
use crate::router::{KvCounters, Router, WorkerChange};

/// A gap this long between two things the owner does (it ticks every
/// [`super::EXPIRY_TICK`]) means the process or its host was stalled: heartbeats that arrived
/// meanwhile could not be processed, so silence in it says nothing about the workers.
pub const STALL_GAP_MS: u64 = 1_000;

/// The owner's state: the router plus what it needs to timestamp and count.
pub(super) struct Owner {
    router: Router,
    metrics: Metrics,
    heartbeat_misses: u32,
    started: Instant,
    /// When the owner last did anything, ms since `started`.
    last_active_ms: u64,
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
            last_active_ms: 0,
            kv_seen: KvCounters::default(),
        };
        owner.update_worker_gauges();
        owner
    }

    /// Milliseconds since start; a jump of more than [`STALL_GAP_MS`] since the last call
    /// grants every worker a fresh expiry window (see [`Router::grant_liveness_grace`]).
    fn now_ms(&mut self) -> u64 {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let gap = now.saturating_sub(self.last_active_ms);
        if gap > STALL_GAP_MS {
            tracing::warn!(
                gap_ms = gap,
                "the control plane did not run for a while (stopped or starved); workers get a fresh heartbeat window"
            );
            self.metrics.stalls.inc();
            self.router.grant_liveness_grace(now);
        }
        self.last_active_ms = now;
        now
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
            Command::Route { request, reply } => {
                let verdict = self.router.route_request(
                    &request.request_id,
                    &request.tokens,
                    request.choices,
                    now_ms,
                );
                let _ = reply.send(verdict);
            }
            Command::HeartbeatsReachable { reachable } => {
                if reachable {
                    tracing::info!("heartbeats reachable again: worker expiry resumes after a full heartbeat window");
                } else {
                    tracing::warn!("heartbeats unreachable (NATS down): keeping every known worker until they can arrive again");
                }
                self.router.set_heartbeats_reachable(reachable, now_ms);
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
        let now_ms = self.now_ms();
        let expired = self.router.expire_workers(now_ms);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchyard_protocol::worker::{WorkerHeartbeat, WorkerId, WorkerInfo, WorkerRole};
    use tokio::sync::oneshot;

    use super::*;

    fn heartbeat(id: &str) -> Command {
        let (reply, _) = oneshot::channel();
        Command::Heartbeat {
            heartbeat: WorkerHeartbeat {
                v: 1,
                worker: WorkerInfo {
                    worker_id: WorkerId(id.into()),
                    instance_id: 1,
                    role: WorkerRole::Decode,
                    address: "127.0.0.1:9000".into(),
                    model: "m".into(),
                    block_size: 16,
                    kv_capacity_blocks: 100,
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
        let mut owner = Owner::new(Router::new(), metrics.clone(), 3, Instant::now());
        owner.handle(heartbeat("decode-0"));
        owner.tick();
        // The process is stopped for 5 s (SIGSTOP): no tick, no heartbeat processed.
        tokio::time::advance(Duration::from_secs(5)).await;
        owner.tick();
        assert_eq!(owner.router.workers().len(), 1, "not expired by the stall");
        assert_eq!(metrics.stalls.get(), 1);
        // Heartbeats really stop: ordinary expiry after the window.
        for _ in 0..16 {
            tokio::time::advance(Duration::from_millis(200)).await;
            owner.tick();
        }
        assert!(
            owner.router.workers().is_empty(),
            "expired after the window"
        );
        assert_eq!(metrics.stalls.get(), 1, "ticks 200 ms apart are no stall");
    }
}
