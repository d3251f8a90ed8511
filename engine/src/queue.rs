//! The one event queue of virtual time: things due at virtual times, earliest first, ties in
//! the order they were pushed.
//!
//! The virtual-time cluster keeps its arrivals and KV transfers in it, and the replay its
//! client sends and periodic messages (heartbeats, load reports, the control core's ticks),
//! so every discrete-event loop of the project orders events the same way: by time, then by
//! a rank the caller gives (lower first: the replay lets periodic messages go before sends
//! due at the same instant), then by when they were scheduled (so equal times replay
//! deterministically).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Something due at a virtual time.
#[derive(Debug)]
struct Due<T> {
    at_ms: f64,
    rank: u8,
    order: u64,
    what: T,
}

impl<T> PartialEq for Due<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Due<T> {}
impl<T> PartialOrd for Due<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Due<T> {
    /// Reversed, so `BinaryHeap` pops the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_ms
            .total_cmp(&self.at_ms)
            .then(other.rank.cmp(&self.rank))
            .then(other.order.cmp(&self.order))
    }
}

/// Items due at virtual times (see the module docs).
#[derive(Debug)]
pub struct EventQueue<T> {
    heap: BinaryHeap<Due<T>>,
    pushed: u64,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            pushed: 0,
        }
    }
}

impl<T> EventQueue<T> {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `what` at `at_ms` (rank 0).
    pub fn push(&mut self, at_ms: f64, what: T) {
        self.push_ranked(at_ms, 0, what);
    }

    /// Schedules `what` at `at_ms`, after everything of a lower rank due then.
    pub fn push_ranked(&mut self, at_ms: f64, rank: u8, what: T) {
        self.pushed += 1;
        self.heap.push(Due {
            at_ms,
            rank,
            order: self.pushed,
            what,
        });
    }

    /// When the earliest item is due.
    pub fn next_ms(&self) -> Option<f64> {
        self.heap.peek().map(|d| d.at_ms)
    }

    /// The earliest item and when it is due, without taking it.
    pub fn peek(&self) -> Option<(f64, &T)> {
        self.heap.peek().map(|d| (d.at_ms, &d.what))
    }

    /// Takes the earliest item with its time.
    pub fn pop(&mut self) -> Option<(f64, T)> {
        self.heap.pop().map(|d| (d.at_ms, d.what))
    }

    /// Takes the earliest item if it is due by `now_ms`.
    pub fn pop_due(&mut self, now_ms: f64) -> Option<(f64, T)> {
        if self.next_ms()? <= now_ms {
            self.pop()
        } else {
            None
        }
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_push_order() {
        let mut q = EventQueue::new();
        q.push(5.0, "late");
        q.push(1.0, "first");
        q.push(1.0, "second");
        q.push(3.0, "middle");
        assert_eq!(q.next_ms(), Some(1.0));
        assert_eq!(q.pop_due(0.5), None);
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, w)| w)).collect();
        assert_eq!(order, ["first", "second", "middle", "late"]);
        assert!(q.is_empty());
        q.push_ranked(2.0, 1, "send");
        q.push_ranked(2.0, 0, "tick");
        assert_eq!(
            q.peek(),
            Some((2.0, &"tick")),
            "a lower rank first at equal times"
        );
    }
}
