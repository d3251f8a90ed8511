//! vLLM's wire, spoken by a simulated worker (`--wire vllm`), so that a stack of simulated
//! workers runs exactly like a vLLM fleet. **Simulated**: the engine is Switchyard's
//! performance model; only the protocols are vLLM's.
//!
//! - No NATS: no registration, heartbeats, load reports or KV subjects. The control plane
//!   learns the worker from its pool file, as it would a vLLM worker.
//! - KV events on a ZMQ PUB socket (vLLM's `endpoint`), one message `[topic, seq, msgpack]` per
//!   engine step that changed the cache, `seq` from 0 — vLLM 0.32's bytes, written by
//!   [`switchyard_adapters::vllm::encode`]. `BlockStored` carries the blocks' real token ids
//!   ([`blocks`] says which blocks are announced).
//! - Replay on a ZMQ ROUTER socket (vLLM's `replay_endpoint`) from a ring of the last
//!   `buffer_steps` batches ([`buffer`]), ending with vLLM's end marker.
//! - Load on `/metrics` under vLLM's names (the HTTP API serves it in either wire).
//!
//! Layout: [`config`] the settings, [`blocks`] engine events → vLLM events with tokens,
//! [`sink`] the engine task's side (numbering), [`publisher`] the PUB socket, [`replay`] the
//! ROUTER socket.

pub mod blocks;
pub mod buffer;
pub mod config;
mod publisher;
mod replay;
pub mod sink;

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket};

pub use blocks::{vllm_block_hash, BlockBook};
pub use buffer::ReplayBuffer;
pub use config::{VllmWireConfig, Wire, DEFAULT_BUFFER_STEPS, DEFAULT_TOPIC};
pub use sink::{VllmSink, VllmStep};

use crate::error::StartError;
use crate::metrics::WorkerMetrics;

/// The vLLM wire's sockets, bound (so a bad endpoint fails the start) but not yet serving.
pub struct BoundSockets {
    publisher: PubSocket,
    replay: Option<RouterSocket>,
    /// Where the PUB socket listens, port resolved (`tcp://127.0.0.1:40123`).
    pub events_endpoint: String,
    /// Where the ROUTER socket listens, port resolved.
    pub replay_endpoint: Option<String>,
}

impl std::fmt::Debug for BoundSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundSockets")
            .field("events_endpoint", &self.events_endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .finish_non_exhaustive()
    }
}

/// vLLM's configs bind `tcp://*:PORT`; the ZMQ crate wants an address.
fn bindable(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

async fn bind_one<S: Socket>(socket: &mut S, endpoint: &str) -> Result<String, StartError> {
    socket
        .bind(&bindable(endpoint))
        .await
        .map(|bound| bound.to_string())
        .map_err(|source| StartError::Zmq {
            endpoint: endpoint.to_owned(),
            source,
        })
}

/// Binds the PUB socket and, if configured, the ROUTER replay socket.
///
/// # Errors
/// [`StartError::Zmq`] naming the endpoint that cannot be bound.
pub async fn bind(cfg: &VllmWireConfig) -> Result<BoundSockets, StartError> {
    let mut publisher = PubSocket::new();
    let events_endpoint = bind_one(&mut publisher, &cfg.events_endpoint).await?;
    let (replay, replay_endpoint) = match &cfg.replay_endpoint {
        Some(endpoint) => {
            let mut router = RouterSocket::new();
            let bound = bind_one(&mut router, endpoint).await?;
            (Some(router), Some(bound))
        }
        None => (None, None),
    };
    Ok(BoundSockets {
        publisher,
        replay,
        events_endpoint,
        replay_endpoint,
    })
}

/// Starts publishing the steps from `steps` on the bound sockets, and answering replays.
pub fn spawn(
    sockets: BoundSockets,
    cfg: VllmWireConfig,
    steps: mpsc::Receiver<VllmStep>,
    metrics: Arc<WorkerMetrics>,
) -> Vec<JoinHandle<()>> {
    let buffer = Arc::new(Mutex::new(ReplayBuffer::new(cfg.buffer_steps)));
    let mut tasks = vec![tokio::spawn(publisher::publish(
        sockets.publisher,
        steps,
        buffer.clone(),
        cfg.topic.clone(),
        cfg.encoding,
        metrics.clone(),
    ))];
    if let Some(router) = sockets.replay {
        tasks.push(tokio::spawn(replay::serve(
            router, buffer, cfg.topic, metrics,
        )));
    }
    tasks
}
