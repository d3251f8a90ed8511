//! Permits for tokenizing route prompts, in two lanes by body size.
//!
//! Tokenization runs on blocking threads, at most `--route-tokenize-threads` at once per lane,
//! so that prompts run in parallel without starving the async runtime. With one lane, a burst
//! of long cold prompts (a 120k-token first turn takes a few hundred milliseconds on a loaded
//! 2-core machine) held every permit while short prompts queued behind them past the filter's
//! route timeout and failed open: 8 of 200 requests in the demo's busiest run. A short body
//! cannot cost much, so short bodies get a lane of their own: long prompts never hold them up,
//! and at worst the two lanes together use twice the permits.

use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// Bodies at least this large take the long lane: about 16k tokens of text, whose cold
/// tokenization is tens of milliseconds.
pub const LONG_BODY_BYTES: usize = 64 << 10;

/// The two lanes' permits.
#[derive(Debug, Clone)]
pub struct TokenizeLanes {
    long: Arc<Semaphore>,
    short: Arc<Semaphore>,
}

impl TokenizeLanes {
    /// Lanes of `permits` each (at least one).
    pub fn new(permits: usize) -> Self {
        TokenizeLanes {
            long: Arc::new(Semaphore::new(permits.max(1))),
            short: Arc::new(Semaphore::new(permits.max(1))),
        }
    }

    /// A permit to tokenize a body of `body_bytes`, from its lane.
    ///
    /// # Errors
    /// [`AcquireError`] once the lanes are closed (shutting down).
    pub async fn acquire(&self, body_bytes: usize) -> Result<OwnedSemaphorePermit, AcquireError> {
        let lane = if body_bytes >= LONG_BODY_BYTES {
            &self.long
        } else {
            &self.short
        };
        Arc::clone(lane).acquire_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn long_prompts_never_hold_up_short_ones() {
        let lanes = TokenizeLanes::new(2);
        let _long_a = lanes.acquire(LONG_BODY_BYTES).await.unwrap();
        let _long_b = lanes.acquire(1 << 20).await.unwrap();
        // The long lane is full: another long prompt waits...
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), lanes.acquire(LONG_BODY_BYTES));
        assert!(waiting.await.is_err(), "a third long prompt must wait");
        // ...but short ones still get permits at once, up to their own lane's size.
        let _short_a = lanes.acquire(LONG_BODY_BYTES - 1).await.unwrap();
        let _short_b = lanes.acquire(10).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(50), lanes.acquire(10));
        assert!(waiting.await.is_err(), "the short lane is bounded too");
    }
}
