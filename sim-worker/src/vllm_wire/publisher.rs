//! The ZMQ PUB socket: each step's batch encoded in vLLM's msgpack, kept for replay, and
//! published as `[topic, seq, payload]`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use switchyard_adapters::vllm::encode::{encode_message, encode_payload, EncodeOptions};
use tokio::sync::mpsc;
use zeromq::{PubSocket, SocketSend, ZmqMessage};

use super::buffer::ReplayBuffer;
use super::sink::VllmStep;
use crate::metrics::WorkerMetrics;

/// vLLM's data-parallel rank of the (single) simulated engine.
const DATA_PARALLEL_RANK: i64 = 0;

/// Publishes every step from `steps` until the engine task ends.
pub(crate) async fn publish(
    mut socket: PubSocket,
    mut steps: mpsc::Receiver<VllmStep>,
    buffer: Arc<Mutex<ReplayBuffer>>,
    topic: String,
    encoding: EncodeOptions,
    metrics: Arc<WorkerMetrics>,
) {
    while let Some(step) = steps.recv().await {
        let payload = match encode_payload(
            step.ts,
            &step.events,
            Some(DATA_PARALLEL_RANK),
            encoding,
        ) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(seq = step.seq, error = %e, "cannot encode a KV event batch; dropped");
                metrics
                    .kv_event_batches_dropped
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let [topic_frame, seq_frame, payload] = encode_message(&topic, step.seq, payload);
        let payload = Bytes::from(payload);
        // Buffered before it is sent, so a subscriber that sees it can already replay it.
        if let Ok(mut ring) = buffer.lock() {
            ring.push(step.seq, payload.clone());
        }
        let frames = vec![Bytes::from(topic_frame), Bytes::from(seq_frame), payload];
        let Ok(message) = ZmqMessage::try_from(frames) else {
            continue; // Three frames are never empty.
        };
        // Like ZMQ, the socket drops messages nobody subscribed to; they stay replayable.
        match socket.send(message).await {
            Ok(()) => {
                metrics.kv_event_batches.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(seq = step.seq, error = %e, "cannot publish a KV event batch");
                metrics
                    .kv_event_batches_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
