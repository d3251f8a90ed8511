//! Predicted KV: the blocks a worker is about to hold because the router just sent it their
//! prompt.
//!
//! A worker announces the blocks it stores only once it has computed them (or received them
//! over NIXL), so for the length of a prefill plus the event's trip the index does not know
//! them. An agent that sends its next turn back to back, or sub-agents that fork from one
//! prompt at once, would then be routed as if nothing were cached and scatter over the
//! workers. So every verdict records its prompt's blocks as *predicted* on the worker(s) it
//! names, for `load.kv_prediction_ms`, unless the index holds them all there already; a route
//! query counts a block as cached on a worker if the index has it **or** it is predicted
//! there. The worker's own events then take over: when it announces the prompt's last block,
//! the prediction goes, so the index alone answers and a later eviction shows; a prediction
//! that the worker never confirms (it evicted at once) simply runs out. A request that ended before
//! its first token (its client left during the prefill leg or while the worker prefilled, or
//! the filter failed it open) withdraws its prediction: its worker may never have seen it,
//! and whatever it did compute, its events say.
//!
//! A block may be predicted on several workers (a disaggregated verdict predicts it on its
//! prefill and its decode worker). Each worker keeps its live predictions as the prompts'
//! hash chains ([`crate::chains`]), so a route query costs a few probes per prediction, not a
//! lookup per block; a prediction whose prompt a newer one on the same worker extends is
//! folded into it, so a conversation holds one per worker. Folded, not dropped: if the newer
//! request is withdrawn, the older ones it covered stand again (their requests still run). At most [`MAX_PER_WORKER`] are kept per
//! worker, the newest: predictions bridge the time until the worker's own events arrive,
//! well under a second, so older ones are seldom still needed.
//!
//! Pure: time comes in as `now_ms`.

use std::collections::VecDeque;

use crate::chains::{longest_shared_prefix, Chain};
use crate::index::WorkerSlot;
use switchyard_protocol::hash::SequenceHash;

/// Live predictions kept per worker (see the module docs).
pub const MAX_PER_WORKER: usize = 1024;

/// Older predictions a record keeps for the case it is withdrawn, at most: each is an earlier
/// turn of the conversation still within its time, so a handful is typical.
const MAX_COVERED: usize = 64;

/// One verdict's prediction.
#[derive(Debug)]
struct Record {
    expires_ms: u64,
    hashes: Chain,
    /// The older predictions on this worker this one covers, oldest first, without their
    /// own `covered` (flattened into this list).
    covered: Vec<Record>,
}

impl Record {
    /// Whether `newer` covers this record: it predicts every block of this one, for as long.
    fn covered_by(&self, newer: &Record) -> bool {
        newer.expires_ms >= self.expires_ms
            && self
                .hashes
                .last()
                .is_none_or(|&last| newer.hashes.get(self.hashes.len() - 1) == Some(&last))
    }
}

/// Live predictions (see the module docs).
#[derive(Debug, Default)]
pub struct Predictions {
    /// Per worker slot: its predictions, oldest first.
    per_worker: Vec<VecDeque<Record>>,
}

impl Predictions {
    /// None.
    pub fn new() -> Self {
        Self::default()
    }

    /// Predicts `hashes` (a prompt's blocks, in order) on `slot` until `now_ms + ttl_ms`.
    /// A zero `ttl_ms` predicts nothing.
    pub fn predict(&mut self, slot: WorkerSlot, hashes: &Chain, now_ms: u64, ttl_ms: u64) {
        self.expire(now_ms);
        if ttl_ms == 0 || hashes.is_empty() {
            return;
        }
        let i = usize::from(slot.0);
        if self.per_worker.len() <= i {
            self.per_worker.resize_with(i + 1, VecDeque::new);
        }
        let mut record = Record {
            expires_ms: now_ms.saturating_add(ttl_ms),
            hashes: hashes.clone(),
            covered: Vec::new(),
        };
        let records = &mut self.per_worker[i];
        // In place: a route call predicts, and the newer turn covers one record or none.
        let mut at = 0;
        while at < records.len() {
            if !records[at].covered_by(&record) {
                at += 1;
                continue;
            }
            let mut old = records.remove(at).expect("a record at this position");
            record.covered.append(&mut old.covered);
            record.covered.push(old);
        }
        record.covered.retain(|r| r.expires_ms > now_ms);
        let excess = record.covered.len().saturating_sub(MAX_COVERED);
        record.covered.drain(..excess);
        if records.len() == MAX_PER_WORKER {
            records.pop_front();
        }
        records.push_back(record);
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
        let Some(records) = self.per_worker.get(usize::from(slot.0)) else {
            return cached;
        };
        // Newest first: the likeliest to share the most.
        let live = records
            .iter()
            .rev()
            .filter(|r| r.expires_ms > now_ms)
            .map(|r| &r.hashes[..]);
        let held = longest_shared_prefix(live, hashes, cached as usize);
        u32::try_from(held).unwrap_or(u32::MAX).max(cached)
    }

    /// Drops the predictions on `slot` whose last block the worker just announced it stores
    /// (`stored`): its events hold the whole prompt now, and only they show when it is
    /// evicted. Kept to the end of their time, predictions claimed blocks a small cache had
    /// evicted long before.
    pub fn confirm(&mut self, slot: WorkerSlot, stored: impl Fn(&SequenceHash) -> bool) {
        if let Some(records) = self.per_worker.get_mut(usize::from(slot.0)) {
            records.retain(|r| r.hashes.last().is_none_or(|tail| !stored(tail)));
        }
    }

    /// Drops the prediction of `hashes` on `slot`, if it is still there: the request it was
    /// made for never reached that worker. The older predictions it covered stand again.
    pub fn withdraw(&mut self, slot: WorkerSlot, hashes: &Chain) {
        let Some(records) = self.per_worker.get_mut(usize::from(slot.0)) else {
            return;
        };
        let made_for = |r: &Record| std::sync::Arc::ptr_eq(&r.hashes, hashes);
        if let Some(at) = records.iter().position(made_for) {
            let withdrawn = records.remove(at).expect("found at this position");
            for (k, older) in withdrawn.covered.into_iter().enumerate() {
                records.insert(at + k, older);
            }
            return;
        }
        // Covered by a newer prediction: it must not stand again if that one is withdrawn.
        for record in records.iter_mut() {
            record.covered.retain(|r| !made_for(r));
        }
    }

    /// Drops every prediction on `slot` (the worker left or restarted with a cold cache).
    pub fn forget_worker(&mut self, slot: WorkerSlot) {
        if let Some(records) = self.per_worker.get_mut(usize::from(slot.0)) {
            records.clear();
        }
    }

    /// Drops predictions that ran out by `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        for records in &mut self.per_worker {
            // Kept in prediction order, so with one TTL the oldest run out first; after a
            // TTL change a later one may run out earlier, and stays until those before it
            // do (queries skip it).
            while records.front().is_some_and(|r| r.expires_ms <= now_ms) {
                records.pop_front();
            }
        }
    }

    /// Predictions held (expired ones behind a live one included).
    pub fn len(&self) -> usize {
        self.per_worker.iter().map(VecDeque::len).sum()
    }

    /// Whether nothing is predicted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(range: std::ops::Range<u64>) -> Chain {
        range.map(|i| SequenceHash(1000 + i)).collect()
    }

    fn chain(hashes: &[SequenceHash]) -> Chain {
        hashes.into()
    }

    const A: WorkerSlot = WorkerSlot(0);
    const B: WorkerSlot = WorkerSlot(1);

    #[test]
    fn a_prediction_extends_the_cached_prefix_until_it_runs_out() {
        let mut p = Predictions::new();
        let prompt = hashes(0..10);
        p.predict(A, &chain(&prompt[..6]), 100, 1_000);
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
        p.predict(B, &chain(&prompt[..2]), 10, 1_000);
        assert_eq!(p.extend(A, &prompt, 0, 20), 4);
        assert_eq!(p.extend(B, &prompt, 0, 20), 2);
        // A again, later: its pairs now point at the newer record, which outlives the first.
        p.predict(A, &chain(&prompt[..1]), 500, 1_000);
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

    #[test]
    fn withdrawing_a_newer_prediction_leaves_the_older_ones_it_covered() {
        let mut p = Predictions::new();
        let full = hashes(0..8);
        let first = chain(&full[..4]);
        let second = chain(&full[..6]);
        p.predict(A, &first, 0, 30_000);
        p.predict(A, &second, 10, 30_000);
        p.predict(A, &full, 20, 30_000);
        assert_eq!(p.len(), 1, "one per conversation");
        // The third turn's client left before its first token: the second's blocks are still
        // on their way to A.
        p.withdraw(A, &full);
        assert_eq!(p.extend(A, &full, 0, 30), 6);
        p.withdraw(A, &second);
        assert_eq!(p.extend(A, &full, 0, 30), 4);
        // Withdrawn while covered: it does not stand again when the newer one goes.
        p.predict(A, &second, 40, 30_000);
        p.predict(A, &full, 50, 30_000);
        p.withdraw(A, &second);
        p.withdraw(A, &full);
        assert_eq!(p.extend(A, &full, 0, 60), 4);
        // Covered ones run out in their own time.
        assert_eq!(p.extend(A, &full, 0, 30_001), 0);
    }
}
