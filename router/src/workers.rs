//! The worker registry: heartbeats register, refresh and restart workers; silence expires
//! them. Each worker gets a dense slot for the KV index and load tracker.

use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::worker::{WorkerId, WorkerInfo};

use super::{Router, WorkerChange, WorkerState, MAX_WORKERS};
use crate::index::WorkerSlot;

impl Router {
    /// Registers or refreshes a worker from a heartbeat. `expires_after_ms` is how long the
    /// worker stays live without another heartbeat.
    pub fn upsert_worker(
        &mut self,
        info: &WorkerInfo,
        expires_after_ms: u64,
        now_ms: u64,
    ) -> WorkerChange {
        if BlockSize::try_new(info.block_size).is_err() {
            return WorkerChange::Rejected;
        }
        if let Some(state) = self.workers.get_mut(&info.worker_id) {
            let restarted = state.info.instance_id != info.instance_id;
            let resized = state.info.block_size != info.block_size;
            state.info = info.clone();
            state.last_seen_ms = now_ms;
            state.expires_after_ms = expires_after_ms;
            let slot = state.slot;
            if restarted || resized {
                // A cold cache (or hashes in another block size): forget it all.
                state.last_kv_seq = None;
                self.count_blocks_dropped(slot);
                self.index
                    .add_worker_with_capacity(slot, engine_table_size(info));
                self.load.remove_worker(slot);
                self.load.add_worker(slot, info.kv_capacity_blocks);
                self.predictions.forget_worker(slot);
                return WorkerChange::Restarted;
            }
            self.load
                .set_registered_capacity(slot, info.kv_capacity_blocks);
            return WorkerChange::Refreshed;
        }
        let Some(slot) = self.allocate_slot() else {
            return WorkerChange::Rejected;
        };
        self.index
            .add_worker_with_capacity(slot, engine_table_size(info));
        // Size the hash table for the cluster's total KV capacity, so that it never rehashes
        // on the event path (a rehash of millions of blocks would stall routing).
        self.reserved_blocks += engine_table_size(info);
        self.index.reserve_total(self.reserved_blocks);
        self.load.add_worker(slot, info.kv_capacity_blocks);
        self.workers.insert(
            info.worker_id.clone(),
            WorkerState {
                info: info.clone(),
                slot,
                last_seen_ms: now_ms,
                expires_after_ms,
                last_kv_seq: None,
            },
        );
        WorkerChange::New
    }

    /// The live worker of another id registered at `worker`'s address, if `worker` would
    /// newly take that address (it is new, or moves there); `None` for a refresh in place.
    pub fn address_holder(&self, worker: &WorkerInfo, now_ms: u64) -> Option<&WorkerId> {
        let in_place = self
            .workers
            .get(&worker.worker_id)
            .is_some_and(|w| w.info.address == worker.address);
        if in_place {
            return None;
        }
        self.workers
            .iter()
            .find(|(id, w)| {
                **id != worker.worker_id
                    && w.info.address == worker.address
                    && self.is_live(w, now_ms)
            })
            .map(|(id, _)| id)
    }

    /// Whether a live worker of `worker`'s model, under another id, runs another engine than
    /// `worker` (a model's workers run one engine).
    pub fn model_runs_another_engine(&self, worker: &WorkerInfo, now_ms: u64) -> bool {
        self.workers.iter().any(|(id, w)| {
            *id != worker.worker_id
                && w.info.model == worker.model
                && w.info.engine != worker.engine
                && self.is_live(w, now_ms)
        })
    }

    /// Whether a live worker of `worker`'s id runs as another process instance at another
    /// address (a restart comes back at the same address; a second process under the id
    /// does not).
    pub fn id_held_elsewhere(&self, worker: &WorkerInfo, now_ms: u64) -> bool {
        self.workers.get(&worker.worker_id).is_some_and(|w| {
            w.info.instance_id != worker.instance_id
                && w.info.address != worker.address
                && self.is_live(w, now_ms)
        })
    }

    fn allocate_slot(&mut self) -> Option<WorkerSlot> {
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None if usize::from(self.allocated_slots) < MAX_WORKERS => {
                self.allocated_slots += 1;
                self.allocated_slots - 1
            }
            None => return None,
        };
        Some(WorkerSlot(slot))
    }

    /// Frees the load of requests whose lifecycle reports are overdue
    /// (`load.prefill_timeout_ms`, `load.request_timeout_ms`) and forgets failed-open ids
    /// past their minute. Routing does it before each decision; the control core's tick
    /// does it too, so that in-flight counts fall when traffic stops.
    pub fn expire_overdue_requests(&mut self, now_ms: u64) {
        self.load.expire(now_ms, &self.config.load);
    }

    /// Drops workers whose heartbeats stopped; returns who expired.
    pub fn expire_workers(&mut self, now_ms: u64) -> Vec<WorkerId> {
        let expired: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| !self.is_live(w, now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.remove_worker(id);
        }
        expired
    }

    /// Forgets a worker and everything known about it (cached blocks, predicted load).
    pub fn remove_worker(&mut self, id: &WorkerId) {
        let Some(state) = self.workers.remove(id) else {
            return;
        };
        self.count_blocks_dropped(state.slot);
        self.index.remove_worker(state.slot);
        self.reserved_blocks = self
            .reserved_blocks
            .saturating_sub(engine_table_size(&state.info));
        self.load.remove_worker(state.slot);
        self.predictions.forget_worker(state.slot);
        self.free_slots.push(state.slot.0);
    }
}

/// Blocks to size a worker's engine-id table for: its KV capacity, capped so that a bogus
/// heartbeat cannot make the router allocate gigabytes (the table still grows past it).
fn engine_table_size(info: &WorkerInfo) -> usize {
    const CAP: u64 = 1 << 20;
    info.kv_capacity_blocks.min(CAP) as usize
}
