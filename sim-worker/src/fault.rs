//! Simulated faults, for failure tests only (not part of the modelled engine): a worker that
//! answers some completion requests 503 before doing any work, as an overloaded or
//! restarting engine does. Tests use it to drive the gateway's retry paths deterministically.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

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
    fn every_nth_request_is_refused_starting_with_the_first() {
        let faults = Faults::new(NonZeroU64::new(2));
        let refused: Vec<bool> = (0..5).map(|_| faults.refuse_next()).collect();
        assert_eq!(refused, [true, false, true, false, true]);
        let none = Faults::new(None);
        assert!((0..5).all(|_| !none.refuse_next()));
    }
}
