//! The last batches published, for the replay socket (vLLM's `buffer_steps` ring).

use std::collections::VecDeque;

use bytes::Bytes;

/// The most recent `capacity` payloads, by sequence number (oldest dropped first).
#[derive(Debug)]
pub struct ReplayBuffer {
    capacity: usize,
    batches: VecDeque<(u64, Bytes)>,
}

impl ReplayBuffer {
    /// An empty buffer keeping at most `capacity` batches (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        ReplayBuffer {
            capacity,
            // Grown on demand: a large `buffer_steps` should not cost memory up front.
            batches: VecDeque::new(),
        }
    }

    /// Keeps the payload of batch `seq` (sequence numbers only grow).
    pub fn push(&mut self, seq: u64, payload: Bytes) {
        if self.capacity == 0 {
            return;
        }
        while self.batches.len() >= self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// The batches with `seq >= start`, oldest first (cheap: payloads are shared).
    pub fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        let first = self.batches.partition_point(|(seq, _)| *seq < start);
        self.batches.range(first..).cloned().collect()
    }

    /// Batches kept.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_answers_from_a_sequence_number() {
        let mut b = ReplayBuffer::new(3);
        for seq in 0..5 {
            b.push(seq, Bytes::from(vec![seq as u8]));
        }
        assert_eq!(b.len(), 3);
        let seqs = |v: Vec<(u64, Bytes)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(b.since(0)), [2, 3, 4]);
        assert_eq!(seqs(b.since(3)), [3, 4]);
        assert!(b.since(5).is_empty());
        let mut none = ReplayBuffer::new(0);
        none.push(0, Bytes::new());
        assert!(none.is_empty());
    }
}
