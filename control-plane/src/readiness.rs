//! `/readyz`: whether this control plane should be given route calls yet. Distinct from
//! `/healthz` (the process serves HTTP): a replica that starts beside others, or restarts, has
//! an empty index, and its verdicts would send every prompt to a worker without its cache. So
//! it answers 503 until it has heard the workers and their caches, and Envoy's active health
//! check on `/readyz` keeps route calls on the ready replicas until then.
//!
//! Ready once, in order:
//! 1. the declared workers' first health polls are done (their ZMQ replay is applied then);
//! 2. when workers register over NATS: NATS has been connected for `--ready-after-ms`, long
//!    enough to hear every live worker's heartbeat (one interval, 1 s by default);
//! 3. no new worker's first KV dump is still awaited (each is waited for at most
//!    [`DUMP_WAIT_MS`](switchyard_router::core::DUMP_WAIT_MS)).
//!
//! Envoy's endpoint discovery waits for it too: until ready, EDS answers 503, so Envoy keeps
//! the endpoints it has rather than getting the few workers heard so far (none, just after
//! a restart) under live traffic.
//!
//! Readiness is latched: once ready, a replica stays ready (a NATS outage later makes every
//! replica's view equally stale; taking them all out of Envoy's rotation would help no one),
//! until it is told to stop: then it answers not ready (`stopping`) while it still serves for
//! `--shutdown-delay-ms`, so Envoy's health check moves route calls to the other replicas
//! before this one stops accepting them (they failed open in between).

use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::time::Instant;

/// What readiness is decided from, gathered by the `/readyz` handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Whether workers can register over NATS here (or replicas share state over it).
    pub needs_nats: bool,
    /// How long NATS has been connected (`None`: not connected).
    pub nats_connected_for_ms: Option<u64>,
    /// `--ready-after-ms`.
    pub warmup_ms: u64,
    /// New workers whose first KV dump is still awaited.
    pub dumps_pending: usize,
    /// Whether the declared workers' first health polls are done.
    pub first_polls_done: bool,
}

/// What a replica is still waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "waiting_for", rename_all = "snake_case")]
pub enum NotReady {
    /// The declared workers' first health polls.
    FirstPolls,
    /// A connection to NATS.
    Nats,
    /// The rest of the first heartbeat window.
    Heartbeats {
        /// Milliseconds left.
        remaining_ms: u64,
    },
    /// New workers' first KV dumps.
    KvDumps {
        /// How many.
        pending: usize,
    },
    /// Nothing: the replica is shutting down and will stop accepting route calls.
    Stopping,
}

impl NotReady {
    /// What is awaited, in words.
    pub fn what(self) -> String {
        match self {
            NotReady::FirstPolls => "the declared workers' first health polls".into(),
            NotReady::Nats => "a NATS connection".into(),
            NotReady::Heartbeats { remaining_ms } => {
                format!("the workers' heartbeats ({remaining_ms} ms more)")
            }
            NotReady::KvDumps { pending } => format!("{pending} new workers' KV dumps"),
            NotReady::Stopping => "nothing: shutting down".into(),
        }
    }
}

/// The decision, pure.
///
/// # Errors
/// What is still awaited, first unmet condition first.
pub fn decide(facts: &Facts) -> Result<(), NotReady> {
    if !facts.first_polls_done {
        return Err(NotReady::FirstPolls);
    }
    if facts.needs_nats {
        let connected_for = facts.nats_connected_for_ms.ok_or(NotReady::Nats)?;
        if connected_for < facts.warmup_ms {
            return Err(NotReady::Heartbeats {
                remaining_ms: facts.warmup_ms - connected_for,
            });
        }
    }
    if facts.dumps_pending > 0 {
        return Err(NotReady::KvDumps {
            pending: facts.dumps_pending,
        });
    }
    Ok(())
}

#[derive(Debug, Default)]
struct State {
    ready: bool,
    /// Told to stop (see the module docs): not ready again, ever.
    stopping: bool,
    nats_connected_at: Option<Instant>,
    /// Connected, but the server echoes nothing back (`switchyard_bus::echo`).
    nats_silent: bool,
}

/// Readiness as the service tracks it: when NATS connected, and the latch.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
}

impl Readiness {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records whether the connection, though up, is silent (the server echoes nothing).
    pub fn nats_silent(&self, silent: bool) {
        self.state().nats_silent = silent;
    }

    /// Whether the NATS connection is up and silent (see [`Readiness::nats_silent`]).
    pub fn is_nats_silent(&self) -> bool {
        self.state().nats_silent
    }

    /// Records NATS becoming reachable (at `now`) or not.
    pub fn nats_connected(&self, connected: bool, now: Instant) {
        let mut state = self.state();
        state.nats_connected_at = match (connected, state.nats_connected_at) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(now),
            (false, _) => None,
        };
    }

    /// How long NATS has been connected at `now`.
    pub fn nats_connected_for_ms(&self, now: Instant) -> Option<u64> {
        self.state()
            .nats_connected_at
            .map(|since| u64::try_from((now - since).as_millis()).unwrap_or(u64::MAX))
    }

    /// Whether readiness was reached before.
    pub fn latched(&self) -> bool {
        self.state().ready
    }

    /// The replica is shutting down: `/readyz` says not ready from now on (route calls
    /// and EDS are still served).
    pub fn stopping(&self) {
        self.state().stopping = true;
    }

    /// Whether [`Readiness::stopping`] was called.
    pub fn is_stopping(&self) -> bool {
        self.state().stopping
    }

    /// Decides on `facts`, latching a success.
    ///
    /// # Errors
    /// What is still awaited.
    pub fn check(&self, facts: &Facts) -> Result<(), NotReady> {
        let mut state = self.state();
        if state.ready {
            return Ok(());
        }
        decide(facts)?;
        state.ready = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_facts() -> Facts {
        Facts {
            needs_nats: true,
            nats_connected_for_ms: Some(2_000),
            warmup_ms: 1_500,
            dumps_pending: 0,
            first_polls_done: true,
        }
    }

    #[test]
    fn each_condition_holds_readiness_back_in_turn() {
        assert_eq!(decide(&ready_facts()), Ok(()));
        let f = Facts {
            first_polls_done: false,
            nats_connected_for_ms: None,
            ..ready_facts()
        };
        assert_eq!(decide(&f), Err(NotReady::FirstPolls));
        let f = Facts {
            nats_connected_for_ms: None,
            ..ready_facts()
        };
        assert_eq!(decide(&f), Err(NotReady::Nats));
        let f = Facts {
            nats_connected_for_ms: Some(1_000),
            dumps_pending: 2,
            ..ready_facts()
        };
        assert_eq!(decide(&f), Err(NotReady::Heartbeats { remaining_ms: 500 }));
        let f = Facts {
            dumps_pending: 2,
            ..ready_facts()
        };
        assert_eq!(decide(&f), Err(NotReady::KvDumps { pending: 2 }));
        // Without NATS workers, the connection does not matter.
        let f = Facts {
            needs_nats: false,
            nats_connected_for_ms: None,
            ..ready_facts()
        };
        assert_eq!(decide(&f), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_connection_time_restarts_on_reconnect_and_readiness_latches() {
        let readiness = Readiness::default();
        let t0 = Instant::now();
        assert_eq!(readiness.nats_connected_for_ms(t0), None);
        readiness.nats_connected(true, t0);
        tokio::time::advance(std::time::Duration::from_millis(700)).await;
        readiness.nats_connected(true, Instant::now());
        assert_eq!(readiness.nats_connected_for_ms(Instant::now()), Some(700));
        readiness.nats_connected(false, Instant::now());
        assert_eq!(readiness.nats_connected_for_ms(Instant::now()), None);
        let mut facts = Facts {
            nats_connected_for_ms: None,
            ..ready_facts()
        };
        assert_eq!(readiness.check(&facts), Err(NotReady::Nats));
        assert!(!readiness.latched());
        facts.nats_connected_for_ms = Some(1_500);
        assert_eq!(readiness.check(&facts), Ok(()));
        facts.nats_connected_for_ms = None;
        assert_eq!(readiness.check(&facts), Ok(()), "latched");
    }

    #[test]
    fn a_stopping_replica_says_so_once_told() {
        let readiness = Readiness::default();
        assert!(!readiness.is_stopping());
        readiness.stopping();
        assert!(readiness.is_stopping());
        let json = serde_json::to_value(NotReady::Stopping).unwrap();
        assert_eq!(json, serde_json::json!({"waiting_for": "stopping"}));
    }

    #[test]
    fn the_reason_serializes_for_the_503_body() {
        let json = serde_json::to_value(NotReady::KvDumps { pending: 3 }).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"waiting_for": "kv_dumps", "pending": 3})
        );
    }
}
