//! What a worker says on NATS: heartbeats (which double as registration), load reports, KV
//! event batches, and resync dumps on request.
//!
//! NATS being down never stops a worker: the client connects in the background and keeps
//! retrying, heartbeats and load reports are skipped while disconnected, and KV batches that
//! cannot be handed over are counted as dropped (the control plane sees the sequence gap and
//! asks for a resync once it hears from the worker again).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use switchyard_protocol::kv::{KvEventBatch, ResyncRequest};
use switchyard_protocol::registration::unix_now_ms;
use switchyard_protocol::subjects;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::context::WorkerContext;

/// Longest a single publish may wait for room in the client's outgoing buffer.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

/// Starts the worker's NATS tasks: heartbeats, load reports, the KV event publisher (fed by
/// `kv_batches`) and the resync listener.
pub fn spawn_nats_tasks(
    ctx: Arc<WorkerContext>,
    client: async_nats::Client,
    kv_batches: mpsc::Receiver<KvEventBatch>,
    heartbeat_interval: Duration,
    load_interval: Duration,
) -> NatsTasks {
    NatsTasks {
        heartbeats: tokio::spawn(heartbeats(ctx.clone(), client.clone(), heartbeat_interval)),
        others: vec![
            tokio::spawn(load_reports(ctx.clone(), client.clone(), load_interval)),
            tokio::spawn(kv_publisher(ctx.clone(), client.clone(), kv_batches)),
            tokio::spawn(resync_listener(ctx, client)),
        ],
    }
}

/// The NATS tasks of a worker: the heartbeats apart, as a drain stops them first.
pub struct NatsTasks {
    /// The heartbeat publisher.
    pub heartbeats: JoinHandle<()>,
    /// Load reports, KV events, resync requests.
    pub others: Vec<JoinHandle<()>>,
}

fn connected(client: &async_nats::Client) -> bool {
    switchyard_bus::is_connected(client)
}

async fn publish_json<T: Serialize>(
    ctx: &WorkerContext,
    client: &async_nats::Client,
    subject: String,
    message: &T,
) -> bool {
    let payload = match serde_json::to_vec(message) {
        Ok(p) => p,
        Err(_) => return false,
    };
    let sent = tokio::time::timeout(PUBLISH_TIMEOUT, client.publish(subject, payload.into())).await;
    let ok = matches!(sent, Ok(Ok(())));
    if !ok {
        ctx.metrics
            .nats_publish_errors
            .fetch_add(1, Ordering::Relaxed);
    }
    ok
}

async fn heartbeats(ctx: Arc<WorkerContext>, client: async_nats::Client, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    loop {
        ticker.tick().await;
        // The first tick comes before the connection is up, and one after an outage may too:
        // the heartbeat goes out as soon as it is, not a whole interval later (the worker
        // serves from its start; unregistered, it gets no verdicts).
        while !connected(&client) {
            tokio::time::sleep(CONNECTION_POLL).await;
        }
        let heartbeat = ctx.heartbeat(interval_ms, unix_now_ms());
        publish_json(&ctx, &client, subjects::heartbeat(&ctx.id), &heartbeat).await;
    }
}

/// How often a heartbeat due while NATS is unreachable checks the connection again.
const CONNECTION_POLL: Duration = Duration::from_millis(20);

async fn load_reports(ctx: Arc<WorkerContext>, client: async_nats::Client, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if connected(&client) {
            let report = ctx
                .engine
                .load()
                .to_load_report(ctx.id.clone(), ctx.instance_id);
            publish_json(&ctx, &client, subjects::load(&ctx.id), &report).await;
        }
    }
}

async fn kv_publisher(
    ctx: Arc<WorkerContext>,
    client: async_nats::Client,
    mut batches: mpsc::Receiver<KvEventBatch>,
) {
    let subject = subjects::kv_events(&ctx.id);
    while let Some(batch) = batches.recv().await {
        if ctx.kv_outage.active(tokio::time::Instant::now()) {
            ctx.metrics
                .kv_event_batches_dropped
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if publish_json(&ctx, &client, subject.clone(), &batch).await {
            ctx.metrics.kv_event_batches.fetch_add(1, Ordering::Relaxed);
        } else {
            ctx.metrics
                .kv_event_batches_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn resync_listener(ctx: Arc<WorkerContext>, client: async_nats::Client) {
    let subject = subjects::kv_resync(&ctx.id);
    // Subscribing only queues a command; it is (re)sent whenever the client (re)connects.
    let mut requests = loop {
        match client.subscribe(subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(worker = %ctx.id, error = %e, "cannot subscribe to resync requests; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    while let Some(message) = requests.next().await {
        match serde_json::from_slice::<ResyncRequest>(&message.payload) {
            Ok(req) if req.worker_id == ctx.id => {
                tracing::info!(worker = %ctx.id, reason = %req.reason, "resync requested; dumping KV cache");
                ctx.engine.request_resync();
            }
            Ok(req) => {
                tracing::warn!(worker = %ctx.id, other = %req.worker_id, "resync request for another worker ignored");
            }
            Err(e) => {
                tracing::warn!(worker = %ctx.id, error = %e, "malformed resync request ignored");
            }
        }
    }
}
