//! Whether the declared workers the control plane started with have each had their first
//! health poll.
//!
//! A control plane that has just (re)started knows no declared worker as healthy until its
//! first poll answers, a few milliseconds in. An EDS answer in that window would list none of
//! them, and Envoy would empty its clusters: requests then get `503 no healthy upstream`
//! although every worker is fine. So EDS answers 503 until every first poll is done (or
//! failed), and Envoy keeps the endpoints it had. The wait is bounded: a poll that hangs
//! opens the gate at the deadline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The start-up gate, shared by the pool watcher (which hands out tokens) and the EDS handler.
#[derive(Debug, Clone)]
pub struct FirstPolls {
    pending: Arc<AtomicUsize>,
    /// `None`: open from the start.
    deadline: Option<Instant>,
}

impl FirstPolls {
    /// A gate open from the start (no pool file).
    pub fn open() -> Self {
        FirstPolls {
            pending: Arc::new(AtomicUsize::new(0)),
            deadline: None,
        }
    }

    /// A gate that waits at most `bound` from `now` for the tokens it hands out.
    pub fn until(now: Instant, bound: Duration) -> Self {
        FirstPolls {
            pending: Arc::new(AtomicUsize::new(0)),
            deadline: Some(now + bound),
        }
    }

    /// One more first poll to wait for; dropping the token marks it done (also when the
    /// worker's task ends before polling).
    pub fn token(&self) -> FirstPollToken {
        self.pending.fetch_add(1, Ordering::SeqCst);
        FirstPollToken(Arc::clone(&self.pending))
    }

    /// Whether EDS may answer at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        self.pending.load(Ordering::SeqCst) == 0 || self.deadline.is_none_or(|at| now >= at)
    }
}

/// One declared worker's first health poll, pending until dropped.
#[derive(Debug)]
pub struct FirstPollToken(Arc<AtomicUsize>);

impl Drop for FirstPollToken {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_when_every_first_poll_is_done_or_at_the_deadline() {
        let start = Instant::now();
        let gate = FirstPolls::until(start, Duration::from_secs(5));
        assert!(gate.is_open(start), "nothing to wait for");
        let (a, b) = (gate.token(), gate.token());
        assert!(!gate.is_open(start));
        drop(a);
        assert!(!gate.is_open(start));
        assert!(gate.is_open(start + Duration::from_secs(5)), "bounded");
        drop(b);
        assert!(gate.is_open(start));
        assert!(FirstPolls::open().is_open(start));
    }
}
