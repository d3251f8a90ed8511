//! The ZMQ ROUTER replay socket: answers `[identity, b"", start_seq]` with every buffered batch
//! from `start_seq` on, then vLLM's end marker (frames as in
//! [`switchyard_adapters::vllm::replay`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchyard_adapters::vllm::replay::{decode_request, encode_reply_batch, encode_reply_end};
use zeromq::{RouterSocket, SocketRecv, SocketSend, ZmqMessage};

use super::buffer::ReplayBuffer;
use crate::metrics::WorkerMetrics;

/// Pause after a failed receive, so a broken socket cannot spin a core.
const RECV_RETRY: Duration = Duration::from_millis(100);

/// Serves replay requests until the worker stops.
pub(crate) async fn serve(
    mut socket: RouterSocket,
    buffer: Arc<Mutex<ReplayBuffer>>,
    topic: String,
    metrics: Arc<WorkerMetrics>,
) {
    loop {
        let request = match socket.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "replay socket receive failed");
                tokio::time::sleep(RECV_RETRY).await;
                continue;
            }
        };
        // The ROUTER put the client's identity first; the rest is the client's request.
        let Some((identity, body)) = request.split_first() else {
            continue;
        };
        let start = match decode_request(body) {
            Ok(seq) => seq,
            Err(e) => {
                // vLLM logs and ignores a malformed request; so does the sim.
                tracing::warn!(error = %e, "malformed replay request ignored");
                continue;
            }
        };
        metrics.kv_replay_requests.fetch_add(1, Ordering::Relaxed);
        let batches = buffer
            .lock()
            .map(|ring| ring.since(start))
            .unwrap_or_default();
        tracing::debug!(start, batches = batches.len(), "answering a replay request");
        for (seq, payload) in batches {
            let frames = encode_reply_batch(topic.as_bytes(), seq, &payload);
            if !send(&mut socket, identity, frames).await {
                break;
            }
        }
        send(&mut socket, identity, encode_reply_end()).await;
    }
}

/// Sends `frames` to the client `identity`; false if it is gone.
async fn send(socket: &mut RouterSocket, identity: &Bytes, frames: [Vec<u8>; 4]) -> bool {
    let mut all = Vec::with_capacity(5);
    all.push(identity.clone());
    all.extend(frames.into_iter().map(Bytes::from));
    let Ok(message) = ZmqMessage::try_from(all) else {
        return false;
    };
    match socket.send(message).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot answer a replay request");
            false
        }
    }
}
