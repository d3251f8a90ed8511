//! Simulated faults, for failure tests only (not part of the modelled engine): a worker that
//! answers some completion requests 503 before doing any work, as an overloaded or
//! restarting engine does; and KV events lost on the way to the control plane for a while
//! ([`KvOutage`]). Tests use them to drive the gateway's retry paths and the control plane's
//! gap detection deterministically.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A window in which a worker's KV event batches are dropped instead of published (counted as
/// dropped), as a congested or partitioned link would lose them: the control plane sees the
/// gap in sequence numbers at the next batch and asks for a resync.
#[derive(Debug, Default)]
pub struct KvOutage {
    until: Mutex<Option<Instant>>,
}

impl KvOutage {
    /// Drops KV events from `now` for `length`.
    pub fn start(&self, now: Instant, length: Duration) {
        *self
            .until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(now + length);
    }

    /// Whether KV events are dropped at `now`.
    pub fn active(&self, now: Instant) -> bool {
        self.until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|until| now < until)
    }
}

/// Which completion requests a worker refuses with a 503.
#[derive(Debug, Default)]
pub struct Faults {
    unavailable_every: Option<NonZeroU64>,
    seen: AtomicU64,
}

impl Faults {
    /// Refuse the 1st, (1+N)th, (1+2N)th, … completion request (`None`: refuse none).
    pub fn new(unavailable_every: Option<NonZeroU64>) -> Self {
        Faults {
            unavailable_every,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether the completion request arriving now is refused.
    pub fn refuse_next(&self) -> bool {
        match self.unavailable_every {
            Some(every) => self
                .seen
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every.get()),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kv_outage_lasts_its_length() {
        let outage = KvOutage::default();
        let t0 = Instant::now();
        assert!(!outage.active(t0));
        outage.start(t0, Duration::from_secs(2));
        assert!(outage.active(t0 + Duration::from_millis(1_999)));
        assert!(!outage.active(t0 + Duration::from_secs(2)));
    }

    #[test]
    fn every_nth_request_is_refused_starting_with_the_first() {
        let faults = Faults::new(NonZeroU64::new(2));
        let refused: Vec<bool> = (0..5).map(|_| faults.refuse_next()).collect();
        assert_eq!(refused, [true, false, true, false, true]);
        let none = Faults::new(None);
        assert!((0..5).all(|_| !none.refuse_next()));
    }
}
