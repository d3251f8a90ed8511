//! The ZMQ sockets of one vLLM or SGLang worker (SGLang publishes as vLLM does): its KV-event
//! publisher (SUB) and its replay socket
//! (DEALER). Bytes in, decoded values out on channels; what they mean is the
//! [`KvFeed`](switchyard_adapters::vllm::feed::KvFeed)'s.
//!
//! ZMQ is `zeromq` (pure Rust on tokio): no libzmq to build or ship, and the control plane
//! already runs on tokio. It speaks ZMTP 3, which vLLM's pyzmq sockets speak.

use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::mpsc;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::replay::{decode_reply, encode_request, ReplayFrame};
use switchyard_adapters::vllm::{DecodeError, VllmBatch};

use super::file::KvEventsSocket;

/// Longest wait for a TCP connection to a worker's socket before trying again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two connection attempts to a worker that is not listening.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// What the live stream says.
#[derive(Debug)]
pub enum LiveMessage {
    /// The socket (re)subscribed: batches published while it was not were dropped by the
    /// publisher ([`KvFeed::on_subscribed`](switchyard_adapters::vllm::feed::KvFeed::on_subscribed)).
    Subscribed,
    /// The socket itself re-established its connection to the publisher (or, bound, accepted
    /// a publisher's new connection): the engine's PUB socket went away and came back, which
    /// is an engine restart unless a network blip
    /// ([`KvFeed::on_reconnected`](switchyard_adapters::vllm::feed::KvFeed::on_reconnected)).
    Reconnected,
    /// One message, decoded.
    Batch(Result<VllmBatch, DecodeError>),
    /// A connecting socket found nobody listening at the publisher's endpoint (one per failed
    /// attempt, [`RECONNECT_PAUSE`] and up to [`CONNECT_TIMEOUT`] apart): the engine is not up
    /// yet, or it connects out too and nobody binds.
    Unreachable(String),
}

/// One answer of a replay, or why it ended without its end marker.
#[derive(Debug)]
pub enum ReplayEvent {
    /// A replayed batch, or the end marker.
    Frame(ReplayFrame),
    /// A frame that does not decode; the replay goes on.
    Malformed(String),
    /// No end marker in time, or the socket failed.
    Failed(String),
}

fn options() -> SocketOptions {
    let mut options = SocketOptions::default();
    options.connect_timeout(CONNECT_TIMEOUT);
    options
}

/// Subscribes to a worker's KV events and sends every message, decoded, to `out` until
/// `out` closes. Connection and bind failures are retried forever (the worker may not be up
/// yet; the port may still be held by a previous run).
pub async fn subscribe(events: KvEventsSocket, out: mpsc::Sender<LiveMessage>) {
    let endpoint = events.endpoint().to_owned();
    let mut warned = false;
    loop {
        let mut socket = SubSocket::with_options(options());
        // Made before the socket connects (or binds), so that it sees the first connection
        // too, which is no reconnection.
        let mut monitor = socket.monitor();
        let connected = match &events {
            KvEventsSocket::Connect(e) => socket.connect(e).await,
            KvEventsSocket::Listen(e) => socket.bind(e).await.map(|_| ()),
        };
        if let Err(e) = connected {
            // A worker not up yet is usual; a port we cannot bind (held by another process)
            // keeps the worker without cache awareness until it frees: say it once.
            match events {
                KvEventsSocket::Listen(_) if !warned => {
                    warned = true;
                    tracing::warn!(%endpoint, error = %e, "cannot bind the KV event socket; retrying (the worker is routed without its cache until then)");
                }
                KvEventsSocket::Listen(_) => {
                    tracing::debug!(%endpoint, error = %e, "cannot bind the KV event socket yet")
                }
                // Whether this is a worker still starting is the worker task's to judge: it
                // knows the worker's health.
                KvEventsSocket::Connect(_) => {
                    if out
                        .send(LiveMessage::Unreachable(e.to_string()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            if out.is_closed() {
                return;
            }
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        }
        if let Err(e) = socket.subscribe("").await {
            tracing::warn!(%endpoint, error = %e, "could not subscribe to KV events");
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        }
        tracing::info!(%endpoint, "subscribed to KV events");
        if out.send(LiveMessage::Subscribed).await.is_err() {
            return;
        }
        // The socket reconnects to a publisher that went away by itself, silently: its
        // monitor is the only sign (a restarted engine that stays quiet would otherwise keep
        // the old engine's blocks in the index). The first connection is the subscription's
        // own, which the feed already asked a replay for: a second replay from the same
        // start at once would race the first.
        let mut connections = 0u64;
        loop {
            let message = tokio::select! {
                received = socket.recv() => received,
                Some(event) = monitor.next() => {
                    if matches!(event, SocketEvent::Connected(..) | SocketEvent::Accepted(..)) {
                        connections += 1;
                        if connections > 1 {
                            tracing::info!(%endpoint, "KV event publisher reconnected");
                            if out.send(LiveMessage::Reconnected).await.is_err() {
                                return;
                            }
                        }
                    }
                    continue;
                }
            };
            match message {
                Ok(message) => {
                    let frames = message.into_vec();
                    let batch = LiveMessage::Batch(decode_message(&frames));
                    if out.send(batch).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(%endpoint, error = %e, "KV event socket failed; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Asks `endpoint` for every buffered batch from `from` on and sends the answers to `out`,
/// ending with the end marker or [`ReplayEvent::Failed`] after `deadline`.
pub async fn replay(
    endpoint: String,
    from: u64,
    deadline: Duration,
    out: mpsc::Sender<ReplayEvent>,
) {
    let outcome = tokio::time::timeout(deadline, replay_inner(&endpoint, from, &out)).await;
    let failure = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(_) => format!("no end of replay within {deadline:?}"),
    };
    let _ = out.send(ReplayEvent::Failed(failure)).await;
}

async fn replay_inner(
    endpoint: &str,
    from: u64,
    out: &mpsc::Sender<ReplayEvent>,
) -> Result<(), String> {
    let mut socket = DealerSocket::with_options(options());
    socket
        .connect(endpoint)
        .await
        .map_err(|e| format!("connect {endpoint}: {e}"))?;
    let [delimiter, seq] = encode_request(from);
    let mut request = ZmqMessage::from(delimiter);
    request.push_back(seq.into());
    socket
        .send(request)
        .await
        .map_err(|e| format!("send to {endpoint}: {e}"))?;
    loop {
        let message = socket
            .recv()
            .await
            .map_err(|e| format!("receive from {endpoint}: {e}"))?;
        let frames = message.into_vec();
        let event = match decode_reply(&frames) {
            Ok(frame) => ReplayEvent::Frame(frame),
            Err(e) => ReplayEvent::Malformed(e.to_string()),
        };
        let end = matches!(event, ReplayEvent::Frame(ReplayFrame::End));
        if out.send(event).await.is_err() || end {
            return Ok(());
        }
    }
}
