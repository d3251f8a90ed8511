//! Where the engine task hands its KV events: the seam between the engine loop and a wire.
//!
//! The engine task calls a [`KvSink`] in engine order — each request's start and end, then
//! once per engine step with that step's batches — so a sink that needs more than the events
//! (the vLLM wire needs each stored block's token ids) can follow the requests without a
//! second channel that could reorder them. [`NatsSink`] is Switchyard's own wire: the batches
//! go to the NATS publisher as they are.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use switchyard_engine::Prompt;
use switchyard_protocol::kv::KvEventBatch;
use tokio::sync::mpsc;

use super::metrics::WorkerMetrics;

/// Receives one worker's KV events from its engine task (see the module docs).
pub trait KvSink: Send {
    /// Request `id` is about to be submitted with `prompt`.
    fn request_submitted(&mut self, id: u64, prompt: &Prompt) {
        let _ = (id, prompt);
    }

    /// Request `id` finished, was aborted or was refused. Its blocks' events of the current
    /// step have not been published yet: they come with the next [`KvSink::publish_step`].
    fn request_ended(&mut self, id: u64) {
        let _ = id;
    }

    /// The batches of one engine step (possibly none), in order.
    fn publish_step(&mut self, batches: Vec<KvEventBatch>);
}

/// Switchyard's wire: batches to the NATS publisher's queue. A full queue drops the batch
/// (counted); the control plane sees the gap in sequence numbers and asks for a resync.
#[derive(Debug)]
pub struct NatsSink {
    out: mpsc::Sender<KvEventBatch>,
    metrics: Arc<WorkerMetrics>,
}

impl NatsSink {
    /// A sink feeding `out`, counting drops in `metrics`.
    pub fn new(out: mpsc::Sender<KvEventBatch>, metrics: Arc<WorkerMetrics>) -> Self {
        NatsSink { out, metrics }
    }
}

impl KvSink for NatsSink {
    fn publish_step(&mut self, batches: Vec<KvEventBatch>) {
        for batch in batches {
            if self.out.try_send(batch).is_err() {
                self.metrics
                    .kv_event_batches_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
