//! A declared worker's health from its polls: pure, so the thresholds are tested without
//! sockets or clocks.
//!
//! A worker starts unhealthy (it is not in the pools until a poll succeeds), becomes healthy
//! at its first good poll, and unhealthy again after `unhealthy_after` failed polls in a row;
//! one good poll in between resets the count.

/// A change of a worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Healthy now: add it to the pools.
    Up,
    /// Unhealthy now: take it out of the pools and the index.
    Down,
}

/// One worker's health (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthTracker {
    unhealthy_after: u32,
    failures: u32,
    healthy: bool,
}

impl HealthTracker {
    /// A worker not yet polled; down after `unhealthy_after` (at least 1) failures.
    pub fn new(unhealthy_after: u32) -> Self {
        HealthTracker {
            unhealthy_after: unhealthy_after.max(1),
            failures: 0,
            healthy: false,
        }
    }

    /// Whether the worker is healthy.
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// One poll's result; the change it makes, if any.
    pub fn observe(&mut self, ok: bool) -> Option<HealthChange> {
        if ok {
            self.failures = 0;
            let was = std::mem::replace(&mut self.healthy, true);
            return (!was).then_some(HealthChange::Up);
        }
        self.failures = self.failures.saturating_add(1);
        if self.healthy && self.failures >= self.unhealthy_after {
            self.healthy = false;
            return Some(HealthChange::Down);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_at_the_first_good_poll_down_after_n_failures_in_a_row() {
        let mut h = HealthTracker::new(3);
        assert_eq!(h.observe(false), None, "never up: nothing to take down");
        assert_eq!(h.observe(true), Some(HealthChange::Up));
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(true), None, "a good poll resets the count");
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), Some(HealthChange::Down));
        assert!(!h.healthy());
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(true), Some(HealthChange::Up), "back when healthy");
    }
}
