//! Predicted KV: the blocks a worker is about to hold because the router just sent it their
//! prompt.
//!
//! A worker announces the blocks it stores only once it has computed them (or received them
//! over NIXL), so for the length of a prefill plus the event's trip the index does not know
//! them. An agent that sends its next turn back to back, or sub-agents that fork from one
//! prompt at once, would then be routed as if nothing were cached and scatter over the
//! workers. So every verdict records its prompt's blocks as *predicted* on the worker(s) it
//! names, for `load.kv_prediction_ms`; a route query counts a block as cached on a worker if
//! the index has it **or** it is predicted there. The worker's own events then take over:
//! once stored, the index has the blocks whatever the prediction says; a prediction that the
//! worker never confirms (it failed the request, evicted at once) simply runs out.
//!
//! A block may be predicted on several workers (a disaggregated verdict predicts it on its
//! prefill and its decode worker); each (worker, block) pair keeps its latest prediction.
//!
//! Pure: time comes in as `now_ms`.

use std::collections::VecDeque;

use switchyard_protocol::hash::SequenceHash;

use crate::index::table::U64Table;
use crate::index::WorkerSlot;

/// One verdict's prediction.
#[derive(Debug)]
struct Record {
    slot: WorkerSlot,
    expires_ms: u64,
    hashes: Vec<SequenceHash>,
}

/// Live predictions (see the module docs).
#[derive(Debug, Default)]
pub struct Predictions {
    /// (worker, sequence hash) key -> ticket of the latest record that predicted the pair.
    latest: U64Table,
    /// Records, oldest first; their tickets are consecutive from `front_ticket`.
    records: VecDeque<Record>,
    front_ticket: u32,
}

/// The table key of a (worker, block) pair: the hash plus a per-worker odd offset. Sequence
/// hashes are uniform 64-bit values, so two pairs collide with odds of about 2^-64.
fn key(slot: WorkerSlot, h: SequenceHash) -> u64 {
    h.0.wrapping_add((u64::from(slot.0) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

impl Predictions {
    /// None.
    pub fn new() -> Self {
        Self::default()
    }

    fn record(&self, ticket: u32) -> Option<&Record> {
        self.records
            .get(ticket.wrapping_sub(self.front_ticket) as usize)
    }

    /// Predicts `hashes` (a prompt's blocks, in order) on `slot` until `now_ms + ttl_ms`.
    /// A zero `ttl_ms` predicts nothing.
    pub fn predict(&mut self, slot: WorkerSlot, hashes: &[SequenceHash], now_ms: u64, ttl_ms: u64) {
        self.expire(now_ms);
        if ttl_ms == 0 || hashes.is_empty() {
            return;
        }
        let ticket = self.front_ticket.wrapping_add(self.records.len() as u32);
        for &h in hashes {
            self.latest.insert(key(slot, h), ticket);
        }
        self.records.push_back(Record {
            slot,
            expires_ms: now_ms.saturating_add(ttl_ms),
            hashes: hashes.to_vec(),
        });
    }

    /// The leading blocks of `hashes` cached or predicted on `slot`, given that its first
    /// `cached` blocks are cached: `cached`, extended while the next block is predicted there.
    pub fn extend(
        &self,
        slot: WorkerSlot,
        hashes: &[SequenceHash],
        cached: u32,
        now_ms: u64,
    ) -> u32 {
        let mut held = cached as usize;
        while let Some(&h) = hashes.get(held) {
            let predicted = self
                .latest
                .get(key(slot, h))
                .and_then(|t| self.record(t))
                .is_some_and(|r| r.slot == slot && r.expires_ms > now_ms);
            if !predicted {
                break;
            }
            held += 1;
        }
        u32::try_from(held).unwrap_or(u32::MAX)
    }

    /// Drops every prediction on `slot` (the worker left or restarted with a cold cache).
    pub fn forget_worker(&mut self, slot: WorkerSlot) {
        for r in self.records.iter_mut().filter(|r| r.slot == slot) {
            r.expires_ms = 0;
        }
        self.expire(0);
    }

    /// Drops predictions that ran out by `now_ms` from the front (and, after
    /// [`Predictions::forget_worker`], every forgotten one behind them in time).
    pub fn expire(&mut self, now_ms: u64) {
        while self.records.front().is_some_and(|r| r.expires_ms <= now_ms) {
            let Some(record) = self.records.pop_front() else {
                break;
            };
            let ticket = self.front_ticket;
            self.front_ticket = self.front_ticket.wrapping_add(1);
            for &h in &record.hashes {
                let k = key(record.slot, h);
                if self.latest.get(k) == Some(ticket) {
                    self.latest.remove(k);
                }
            }
        }
    }

    /// Records held (expired ones behind a live one included).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is predicted.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(range: std::ops::Range<u64>) -> Vec<SequenceHash> {
        range.map(|i| SequenceHash(1000 + i)).collect()
    }

    const A: WorkerSlot = WorkerSlot(0);
    const B: WorkerSlot = WorkerSlot(1);

    #[test]
    fn a_prediction_extends_the_cached_prefix_until_it_runs_out() {
        let mut p = Predictions::new();
        let prompt = hashes(0..10);
        p.predict(A, &prompt[..6], 100, 1_000);
        assert_eq!(p.extend(A, &prompt, 0, 200), 6);
        assert_eq!(
            p.extend(A, &prompt, 8, 200),
            8,
            "cached beyond the prediction"
        );
        assert_eq!(p.extend(B, &prompt, 0, 200), 0, "another worker");
        assert_eq!(p.extend(A, &prompt, 0, 1_100), 0, "expired");
        p.expire(1_100);
        assert!(p.is_empty());
    }

    #[test]
    fn a_prefix_may_be_predicted_on_several_workers_each_with_its_latest_prediction() {
        let mut p = Predictions::new();
        let prompt = hashes(0..4);
        p.predict(A, &prompt, 0, 1_000);
        p.predict(B, &prompt[..2], 10, 1_000);
        assert_eq!(p.extend(A, &prompt, 0, 20), 4);
        assert_eq!(p.extend(B, &prompt, 0, 20), 2);
        // A again, later: its pairs now point at the newer record, which outlives the first.
        p.predict(A, &prompt[..1], 500, 1_000);
        p.expire(1_005);
        assert_eq!(p.extend(A, &prompt, 0, 1_005), 1);
        assert_eq!(p.extend(B, &prompt, 0, 1_005), 2);
    }

    #[test]
    fn forgetting_a_worker_drops_only_its_predictions() {
        let mut p = Predictions::new();
        p.predict(A, &hashes(0..3), 0, 1_000);
        p.predict(B, &hashes(10..13), 0, 1_000);
        p.forget_worker(A);
        assert_eq!(p.extend(A, &hashes(0..3), 0, 1), 0);
        assert_eq!(p.extend(B, &hashes(10..13), 0, 1), 3);
        p.forget_worker(B);
        assert!(p.is_empty());
    }

    #[test]
    fn zero_ttl_predicts_nothing() {
        let mut p = Predictions::new();
        p.predict(A, &hashes(0..3), 0, 0);
        assert!(p.is_empty());
        assert_eq!(p.extend(A, &hashes(0..3), 1, 0), 1);
    }
}
