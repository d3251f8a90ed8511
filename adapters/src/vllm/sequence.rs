//! A publisher's sequence numbers → whether batches were missed, repeated, or the engine
//! restarted, so the caller knows when to ask for a replay.
//!
//! vLLM numbers the batches of each publisher (one per data-parallel rank) 0, 1, 2, ... from
//! the engine's start. Keep one [`SequenceTracker`] per publisher and show it the live
//! stream's numbers. On [`SeqStatus::Gap`], request a replay from `from` ([`super::replay`])
//! and apply the replayed batches (not shown to the tracker: they are old by construction)
//! before the one that revealed the gap; on [`SeqStatus::Restarted`], the engine's cache
//! started empty: reset the worker's mapper and index.

use serde::{Deserialize, Serialize};

/// How a sequence number relates to the ones seen before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeqStatus {
    /// The next one expected (or 0, the first one ever).
    InOrder,
    /// Batches `from..=to` were missed (on the first message, `from` is 0: everything since
    /// the engine started).
    Gap {
        /// First missed.
        from: u64,
        /// Last missed.
        to: u64,
    },
    /// The same as the last one (seen twice, e.g. live and replayed); ignore it.
    Duplicate,
    /// Older than the last one, but not 0: a late or replayed batch. On a live PUB stream,
    /// which keeps order, it means a restart whose first batches were missed; the tracker
    /// cannot tell which stream it came from, so the caller decides
    /// ([`super::feed::KvFeed::on_live`] treats it as a restart).
    Stale {
        /// The last sequence number seen.
        last: u64,
    },
    /// Back to 0 after `last`: the engine restarted.
    Restarted {
        /// The last sequence number before the restart.
        last: u64,
    },
}

/// Tracks one publisher's sequence numbers (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SequenceTracker {
    last: Option<u64>,
}

impl SequenceTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last sequence number accepted, if any.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// The sequence number expected next (where a replay after a gap would start).
    pub fn next_expected(&self) -> u64 {
        self.last.map_or(0, |l| l.saturating_add(1))
    }

    /// Forgets everything (a new engine instance, or a deliberate resubscribe).
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// Classifies `seq` and, unless it is a duplicate or stale, moves on to it.
    pub fn observe(&mut self, seq: u64) -> SeqStatus {
        let status = match self.last {
            None if seq == 0 => SeqStatus::InOrder,
            None => SeqStatus::Gap {
                from: 0,
                to: seq.saturating_sub(1),
            },
            Some(last) if seq == last => return SeqStatus::Duplicate,
            Some(last) if seq < last && seq == 0 => SeqStatus::Restarted { last },
            Some(last) if seq < last => return SeqStatus::Stale { last },
            Some(last) if Some(seq) == last.checked_add(1) => SeqStatus::InOrder,
            Some(last) => SeqStatus::Gap {
                from: last.saturating_add(1),
                to: seq.saturating_sub(1),
            },
        };
        self.last = Some(seq);
        status
    }
}
