//! Active-active: several control planes behind one gateway (`--replica-id`), each with its
//! own KV index from the workers' events, sharing what one replica alone cannot see.
//!
//! - **Load.** Every routing decision and every lifecycle report a replica receives goes out
//!   on [`SYNC_SUBJECT`] ([`ReplicaLink::share`], published by [`publish`]); the others apply
//!   it as their own ([`subscribe`]), so a burst split across replicas spreads across workers
//!   as one replica would spread it. How stale a view gets is NATS's delivery time plus the
//!   owner's queue, measured per update in `switchyard_replica_sync_lag_seconds`; while NATS
//!   is down each replica sees only its own decisions (and the workers' reports stop too).
//! - **Config.** The router config lives in a NATS KV bucket ([`config_store`]); a `PUT` on
//!   any replica writes it there with a compare-and-set on its revision, and every replica
//!   applies each new revision it watches.
//! - **Readiness** (`/readyz`, [`crate::readiness`]): a replica that joins late answers 503
//!   until it has heard the workers and their KV dumps, and Envoy's health check keeps route
//!   calls away until then.

pub mod config_store;

use tokio::sync::mpsc;

use switchyard_protocol::registration::unix_now_ms;
use switchyard_protocol::replica::{ReplicaSync, ReplicaUpdate, SYNC_SUBJECT};
use switchyard_protocol::PROTOCOL_VERSION;

use crate::consumers::{decode, subscribe_with_retry};
use crate::metrics::Metrics;
use crate::service::ServiceHandle;

/// Updates queued for publishing before new ones are dropped (counted): a replica that
/// cannot publish must not grow without bound or slow its route calls.
const PUBLISH_QUEUE: usize = 8_192;

/// Whether a replica id can be used: non-empty, at most 64 characters of `[A-Za-z0-9_-]`.
pub fn is_valid_replica_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && switchyard_protocol::subjects::is_valid_worker_token(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_process_under_this_replicas_id_is_told_apart() {
        let me = ReplicaIdentity {
            id: "cp-0".into(),
            process: 42,
        };
        assert_eq!(me.sender("cp-0", 42), Sender::Itself);
        assert_eq!(me.sender("cp-0", 0), Sender::Itself, "an older replica");
        assert_eq!(me.sender("cp-1", 42), Sender::Peer);
        assert_eq!(me.sender("cp-0", 43), Sender::SameIdElsewhere);
        assert_ne!(ReplicaIdentity::new("a".into()).process, 0);
    }
}

/// This replica as its updates name it: its `--replica-id`, and a number its process drew at
/// start, so that two processes started under one id see each other's updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaIdentity {
    /// `--replica-id`.
    pub id: String,
    /// Made at start from the start time and process id (never 0).
    pub process: u64,
}

impl ReplicaIdentity {
    /// Replica `id` in this process.
    pub fn new(id: String) -> Self {
        // Start time and process id: two processes under one id almost never share both.
        let process = ((unix_now_ms() << 20) ^ u64::from(std::process::id())).max(1);
        ReplicaIdentity { id, process }
    }

    /// Who sent an update naming `replica` and `process`.
    pub fn sender(&self, replica: &str, process: u64) -> Sender {
        if replica != self.id {
            Sender::Peer
        } else if process == 0 || process == self.process {
            Sender::Itself
        } else {
            Sender::SameIdElsewhere
        }
    }
}

/// Who sent an update, as [`ReplicaIdentity::sender`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// This process (NATS delivers a replica's own updates back to it).
    Itself,
    /// Another replica.
    Peer,
    /// Another process under this replica's id.
    SameIdElsewhere,
}

/// The router owner's side of the sync: hands updates to the publisher without waiting.
#[derive(Debug, Clone)]
pub struct ReplicaLink {
    tx: mpsc::Sender<ReplicaUpdate>,
    metrics: Metrics,
}

impl ReplicaLink {
    /// A link and the queue [`publish`] drains.
    pub fn new(metrics: Metrics) -> (ReplicaLink, mpsc::Receiver<ReplicaUpdate>) {
        let (tx, rx) = mpsc::channel(PUBLISH_QUEUE);
        (ReplicaLink { tx, metrics }, rx)
    }

    /// Queues `update` for the other replicas; a full queue drops it (counted `dropped`).
    /// NATS delivers at most once, so an update published while it is away may also be lost,
    /// uncounted (`sent` counts what it accepted): the peers' queued tokens and blocks
    /// correct themselves at the workers' next load reports, their in-flight counts once the
    /// reports have shown the surplus for `load.stale_in_flight_ms`.
    pub fn share(&self, update: ReplicaUpdate) {
        if self.tx.try_send(update).is_err() {
            self.metrics.replica_update("dropped");
        }
    }
}

/// Publishes queued updates on [`SYNC_SUBJECT`] as replica `me` until the link is dropped.
pub async fn publish(
    nats: async_nats::Client,
    me: ReplicaIdentity,
    mut updates: mpsc::Receiver<ReplicaUpdate>,
    metrics: Metrics,
) {
    while let Some(update) = updates.recv().await {
        let sync = ReplicaSync {
            v: PROTOCOL_VERSION,
            replica: me.id.clone(),
            process: me.process,
            sent_at_unix_ms: unix_now_ms(),
            update,
        };
        let sent = match serde_json::to_vec(&sync) {
            Ok(bytes) => nats.publish(SYNC_SUBJECT, bytes.into()).await.is_ok(),
            Err(_) => false,
        };
        metrics.replica_update(if sent { "sent" } else { "dropped" });
    }
}

/// Applies the other replicas' updates (skipping this one's own, which NATS also delivers
/// here) until the router owner stops.
pub async fn subscribe(
    nats: async_nats::Client,
    me: ReplicaIdentity,
    service: ServiceHandle,
    metrics: Metrics,
) {
    let mut warned_about = std::collections::HashSet::new();
    use futures::StreamExt;
    let mut sub = subscribe_with_retry(&nats, SYNC_SUBJECT).await;
    while let Some(message) = sub.next().await {
        let sync = match decode::<ReplicaSync>(&message.payload, |m| m.v) {
            Ok(sync) => sync,
            Err(error) => {
                metrics.bad_message("replica_sync");
                tracing::warn!(%error, "undecodable replica update");
                continue;
            }
        };
        match me.sender(&sync.replica, sync.process) {
            Sender::Itself => continue,
            Sender::Peer => {}
            Sender::SameIdElsewhere => {
                // Its decisions are still another replica's: applied, and said loudly, since
                // each process under one id skipped the other's until now.
                metrics.replica_update("duplicate_id");
                if warned_about.len() < 64 && warned_about.insert(sync.process) {
                    tracing::error!(
                        replica = %me.id,
                        "another control-plane process runs under this --replica-id: give every replica its own id (their updates are applied, but /metrics and logs cannot tell them apart)"
                    );
                }
            }
        }
        let lag_ms = unix_now_ms().saturating_sub(sync.sent_at_unix_ms);
        metrics
            .replica_sync_lag_seconds
            .observe(lag_ms as f64 / 1_000.0);
        if service.peer(sync.update).await.is_err() {
            break;
        }
    }
}
