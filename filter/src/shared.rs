//! What the root context and every request context of one VM share: the configuration, the
//! stat ids and the queues the root's timer drains (lifecycle reports, hold releases). The
//! root builds it; request contexts only push to it, so neither depends on the other.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use log::debug;
use proxy_wasm::hostcalls;
use switchyard_protocol::lifecycle::LifecycleEvent;

use crate::config::Config;
use crate::lifecycle::LifecycleQueue;
use crate::metrics::StatIds;
use crate::tokenize::Tokenizers;

/// What every request context of this VM shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The validated configuration.
    pub(crate) config: Config,
    /// Envoy metric ids.
    pub(crate) stats: StatIds,
    /// Lifecycle events waiting for the root's timer (one queue per VM, i.e. per Envoy worker
    /// thread; the VM is single-threaded, so a `RefCell` is all the sharing needs).
    pub(crate) reports: Rc<RefCell<LifecycleQueue>>,
    /// Holds to release, waiting for the root's timer (a request context may be gone by the
    /// time the call answers; the root is not).
    pub(crate) releases: Rc<RefCell<VecDeque<Release>>>,
    /// The models' tokenizers (`tokenize: filter`); request contexts ask, the root's timer
    /// fetches.
    pub(crate) tokenizers: Rc<RefCell<Tokenizers>>,
}

/// KV a prefill worker holds for a decode leg that failed or never came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Release {
    /// The prefill worker (`host:port`).
    pub(crate) prefill: String,
    /// The hold's id (the handoff's `remote_request_id`).
    pub(crate) hold: String,
}

/// Most releases queued per VM; beyond it they are counted as failed (the worker's own lease
/// frees the KV later).
const MAX_QUEUED_RELEASES: usize = 1_024;

impl Shared {
    /// Queues a release for the root's timer (or counts it failed when the queue is full).
    pub(crate) fn release(&self, release: Release) {
        let queued = match self.releases.try_borrow_mut() {
            Ok(mut queue) if queue.len() < MAX_QUEUED_RELEASES => {
                queue.push_back(release);
                true
            }
            _ => false,
        };
        if !queued {
            increment(self.stats.prefill_release_failures_total, 1);
        }
    }

    /// Queues a lifecycle event, or counts it dropped when the queue is full or the queue is
    /// busy (never blocks, never fails the request).
    pub(crate) fn report(&self, event: LifecycleEvent) {
        if !self.config.lifecycle_reports {
            return;
        }
        let queued = match self.reports.try_borrow_mut() {
            Ok(mut queue) => queue.push(event),
            Err(_) => false,
        };
        if !queued {
            increment(self.stats.reports_dropped_total, 1);
        }
    }
}

/// Increments a counter; a stat that cannot be incremented is not worth failing over.
pub(crate) fn increment(id: u32, by: i64) {
    if id == 0 {
        return;
    }
    if let Err(status) = hostcalls::increment_metric(id, by) {
        debug!("increment_metric({id}) failed: {status:?}");
    }
}
