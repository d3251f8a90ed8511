//! The engine task's side of the vLLM wire: each step's events converted, numbered and queued
//! for the ZMQ publisher.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use switchyard_adapters::vllm::VllmEvent;
use switchyard_engine::Prompt;
use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::registration::unix_now_ms;
use tokio::sync::mpsc;

use super::blocks::BlockBook;
use crate::kv_sink::KvSink;
use crate::metrics::WorkerMetrics;

/// One vLLM batch: what one engine step changed.
#[derive(Debug, Clone, PartialEq)]
pub struct VllmStep {
    /// vLLM's sequence number: 0 for the first batch, +1 per batch.
    pub seq: u64,
    /// When the batch was made, seconds since the Unix epoch (vLLM's `time.time()`).
    pub ts: f64,
    /// Its events, in engine order.
    pub events: Vec<VllmEvent>,
}

/// [`KvSink`] for the vLLM wire (one vLLM batch per engine step that changed the cache).
#[derive(Debug)]
pub struct VllmSink {
    book: BlockBook,
    next_seq: u64,
    out: mpsc::Sender<VllmStep>,
    metrics: Arc<WorkerMetrics>,
}

impl VllmSink {
    /// A sink converting with `book` and queueing on `out`.
    pub fn new(book: BlockBook, out: mpsc::Sender<VllmStep>, metrics: Arc<WorkerMetrics>) -> Self {
        VllmSink {
            book,
            next_seq: 0,
            out,
            metrics,
        }
    }
}

impl KvSink for VllmSink {
    fn request_submitted(&mut self, id: u64, prompt: &Prompt) {
        self.book.request_submitted(id, prompt);
    }

    fn request_ended(&mut self, id: u64) {
        self.book.request_ended(id);
    }

    fn publish_step(&mut self, batches: Vec<KvEventBatch>) {
        let engine_events: Vec<_> = batches.into_iter().flat_map(|b| b.events).collect();
        let events = self.book.convert(&engine_events);
        self.book.end_step();
        if events.is_empty() {
            return;
        }
        let step = VllmStep {
            seq: self.next_seq,
            ts: unix_now_secs(),
            events,
        };
        // A dropped step still uses its number: subscribers see the gap, as with a real
        // vLLM whose queue overflowed, rather than silently missing blocks.
        self.next_seq = self.next_seq.saturating_add(1);
        if self.out.try_send(step).is_err() {
            self.metrics
                .kv_event_batches_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// vLLM's `ts`, from the workspace's one wall clock (millisecond resolution is plenty: no
/// consumer orders batches by it).
fn unix_now_secs() -> f64 {
    unix_now_ms() as f64 / 1e3
}
