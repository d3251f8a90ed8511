//! Whether the NATS server answers, judged by round trips through it.
//!
//! async-nats calls a connection up until its TCP connection fails or two of its pings, a
//! minute apart by default, go unanswered. A server that keeps the connection but answers
//! nothing (stopped, wedged, a partition the kernel has not noticed) therefore looks connected
//! for minutes, while no heartbeat can arrive: the control plane expired every worker after a
//! few seconds of such silence and Envoy had no host left to send requests to. So the
//! connection watch also sends itself a message through the server every [`ECHO_INTERVAL`], and
//! a server that has not echoed one within [`ECHO_TIMEOUT`] counts as unreachable until one
//! comes back. The timeout is well inside the shortest worker expiry (3 × 1 s heartbeats), so
//! the silence is known before any worker would expire for it.
//!
//! Silence counts only once an echo has come back on the connection: a server whose
//! permissions deny the client its inbox subject never echoes, and would otherwise seem silent
//! for ever (workers would never expire); the caller says so instead ([`EchoProbe::proven`]).
//!
//! [`EchoProbe`] is the rule alone, driven by the caller's clock and its echoes.

use std::time::Duration;

use tokio::time::Instant;

/// How often an echo goes out while none is in flight.
pub const ECHO_INTERVAL: Duration = Duration::from_millis(250);
/// How long an echo may take before the server counts as not answering.
pub const ECHO_TIMEOUT: Duration = Duration::from_millis(750);
/// A gap between two ticks longer than this is the caller's own stall, not the server's.
const STALL: Duration = Duration::from_millis(500);

/// The echo rule: what to send when, and whether the server counts as answering.
#[derive(Debug, Default)]
pub struct EchoProbe {
    /// The echo awaited: its number and when it went out.
    in_flight: Option<(u64, Instant)>,
    /// When the last echo went out.
    last_sent: Option<Instant>,
    /// Numbers the next echo.
    next: u64,
    /// Whether the connection was up at the last tick.
    connected: bool,
    /// Whether an echo overran [`ECHO_TIMEOUT`] with none back since.
    overdue: bool,
    /// Whether an echo came back on this connection.
    proven: bool,
    /// When the caller last ticked.
    last_tick: Option<Instant>,
}

impl EchoProbe {
    /// At `now`, with the client `connected` or not: the number of an echo to send now, if
    /// one is due, and whether the server counts as reachable.
    pub fn tick(&mut self, now: Instant, connected: bool) -> (Option<u64>, bool) {
        if !connected {
            // Echoes sent before the connection dropped may never come back; the handshake
            // of the next connection is itself an answer from the server.
            *self = EchoProbe {
                next: self.next,
                ..EchoProbe::default()
            };
            return (None, false);
        }
        self.connected = true;
        // A gap between ticks is this process not running (stopped, starved): the echo may be
        // waiting unread in its socket, so its time starts again now rather than counting
        // the caller's stall against the server.
        let stalled = self
            .last_tick
            .is_some_and(|last| now.saturating_duration_since(last) > STALL);
        self.last_tick = Some(now);
        if let Some((n, _)) = self.in_flight {
            if stalled && !self.overdue {
                self.in_flight = Some((n, now));
                return (None, true);
            }
        }
        if let Some((_, sent)) = self.in_flight {
            if now.saturating_duration_since(sent) > ECHO_TIMEOUT {
                self.overdue = true;
            }
        }
        // A new echo when none is awaited, or when the awaited one is overdue (it may have been
        // lost): the first to come back ends the silence.
        let due = self
            .last_sent
            .is_none_or(|last| now.saturating_duration_since(last) >= ECHO_INTERVAL);
        let send = (due && (self.in_flight.is_none() || self.overdue)).then(|| {
            let n = self.next;
            self.next += 1;
            self.in_flight = Some((n, now));
            self.last_sent = Some(now);
            n
        });
        (send, !(self.overdue && self.proven))
    }

    /// Whether an echo has come back on this connection: until one has, silence proves
    /// nothing (see the module doc).
    pub fn proven(&self) -> bool {
        self.proven
    }

    /// Echo number `n` came back: the server answers. An echo older than the one awaited
    /// still proves it does.
    pub fn echoed(&mut self, n: u64) {
        if self.connected && self.in_flight.is_some_and(|(awaited, _)| n <= awaited) {
            self.in_flight = None;
            self.overdue = false;
            self.proven = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_server_that_echoes_stays_reachable() {
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        for step in 0..20u64 {
            let (send, reachable) = probe.tick(ms(start, step * 100), true);
            assert!(reachable, "step {step}");
            if let Some(n) = send {
                probe.echoed(n);
            }
        }
    }

    #[test]
    fn a_server_that_stops_answering_is_unreachable_within_the_timeout_until_an_echo_returns() {
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        let (first, reachable) = probe.tick(start, true);
        assert_eq!((first, reachable), (Some(0), true));
        probe.echoed(0);
        assert!(probe.proven());
        assert_eq!(probe.tick(ms(start, 100), true), (None, true));
        assert_eq!(probe.tick(ms(start, 200), true), (None, true));
        assert_eq!(probe.tick(ms(start, 300), true), (Some(1), true));
        // Nothing comes back: reachable through the timeout, then not.
        for at in (400..=1_000).step_by(100) {
            assert_eq!(probe.tick(ms(start, at), true), (None, true), "{at}");
        }
        let (resent, reachable) = probe.tick(ms(start, 1_100), true);
        assert!(!reachable, "overdue");
        assert_eq!(resent, Some(2), "a fresh echo in case the last was lost");
        // Silence goes on: one echo per interval, still unreachable.
        assert_eq!(probe.tick(ms(start, 1_200), true), (None, false));
        assert_eq!(probe.tick(ms(start, 1_300), true), (None, false));
        assert_eq!(probe.tick(ms(start, 1_400), true), (Some(3), false));
        // The server resumes and delivers what it held: the oldest echo ends the silence.
        probe.echoed(1);
        assert!(probe.tick(ms(start, 1_500), true).1);
    }

    /// The process itself stopped (SIGSTOP, a starved host) with an echo in flight: its
    /// answer waits unread in the socket, and the next tick must not take the stall for the
    /// server's silence (a control plane thawed after 3 s called NATS silent, then back, and
    /// asked every worker for a resync).
    #[test]
    fn the_callers_own_stall_is_not_the_servers_silence() {
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        let (zero, _) = probe.tick(start, true);
        probe.echoed(zero.unwrap());
        assert_eq!(probe.tick(ms(start, 300), true), (Some(1), true));
        // Stopped from 350 ms to 3.3 s.
        assert!(probe.tick(ms(start, 350), true).1);
        assert!(probe.tick(ms(start, 3_300), true).1, "the stall");
        assert!(probe.tick(ms(start, 3_400), true).1);
        probe.echoed(1);
        // A real silence after it is still seen.
        assert_eq!(probe.tick(ms(start, 3_500), true), (Some(2), true));
        for at in (3_600..=4_200).step_by(100) {
            assert!(probe.tick(ms(start, at), true).1, "{at}");
        }
        assert!(!probe.tick(ms(start, 4_300), true).1);
    }

    #[test]
    fn a_server_that_never_echoed_is_not_taken_for_a_silent_one() {
        // Its permissions may deny the inbox subject: no echo ever, on a live server.
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        for step in 0..30u64 {
            assert!(probe.tick(ms(start, step * 100), true).1, "step {step}");
        }
        assert!(!probe.proven());
    }

    #[test]
    fn a_dropped_connection_is_unreachable_and_a_new_one_starts_afresh() {
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        let (zero, _) = probe.tick(start, true);
        probe.echoed(zero.unwrap());
        probe.tick(ms(start, 100), true);
        probe.tick(ms(start, 200), true);
        let (n, _) = probe.tick(ms(start, 300), true);
        for at in (400..=1_000).step_by(100) {
            probe.tick(ms(start, at), true);
        }
        assert!(!probe.tick(ms(start, 1_100), true).1, "overdue");
        assert_eq!(probe.tick(ms(start, 1_200), false), (None, false));
        assert!(!probe.proven(), "a new connection proves itself anew");
        // An echo of the old connection counts for nothing now.
        probe.echoed(n.unwrap());
        let (send, reachable) = probe.tick(ms(start, 1_300), true);
        assert!(reachable, "the handshake was the server's answer");
        assert!(send.is_some_and(|m| m > n.unwrap()), "{send:?}");
    }
}
