//! The Switchyard batches a feed publishes for one worker, whichever the engine: numbered from
//! 1 after each (re)registration and stamped with the worker and its instance, so the router
//! can tell a gap or a restart in what it is sent.

use switchyard_protocol::kv::{KvEvent, KvEventBatch};
use switchyard_protocol::worker::WorkerId;

use crate::vllm::mapper::HashMapper;

/// One worker's outgoing batch numbering.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    worker_id: WorkerId,
    instance_id: u64,
    /// The last sequence number published; 0 before the first.
    published: u64,
}

impl Outgoing {
    /// Nothing published yet for `worker_id`, registered as `instance_id`.
    pub(crate) fn new(worker_id: WorkerId, instance_id: u64) -> Self {
        Outgoing {
            worker_id,
            instance_id,
            published: 0,
        }
    }

    /// The registration batches are stamped with.
    pub(crate) fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// Numbers start over for the worker registered (again) as `instance_id`.
    pub(crate) fn restart(&mut self, instance_id: u64) {
        self.instance_id = instance_id;
        self.published = 0;
    }

    /// Whether nothing was published since the last (re)start: the first batch out must
    /// clear the worker, so the router never mixes two views of it.
    pub(crate) fn nothing_published(&self) -> bool {
        self.published == 0
    }

    /// The next batch, carrying `events`.
    pub(crate) fn batch(&mut self, events: Vec<KvEvent>, resync: bool) -> KvEventBatch {
        bump(&mut self.published);
        KvEventBatch {
            v: 1,
            worker_id: self.worker_id.clone(),
            instance_id: self.instance_id,
            seq: self.published,
            resync,
            events,
        }
    }

    /// A resync batch that clears the worker's blocks in the router, with `mapper` cleared
    /// too.
    pub(crate) fn reset(&mut self, mapper: &mut HashMapper) -> KvEventBatch {
        let cleared = mapper.reset();
        self.batch(vec![cleared], true)
    }
}

/// Counters and sequence numbers saturate rather than wrap (a u64 of batches never fills).
pub(crate) fn bump(counter: &mut u64) {
    *counter = counter.saturating_add(1);
}
