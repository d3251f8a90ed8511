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
//! [`EchoProbe`] is the rule alone, driven by the caller's clock and its echoes.

use std::time::Duration;

use tokio::time::Instant;

/// How often an echo goes out while none is in flight.
pub const ECHO_INTERVAL: Duration = Duration::from_millis(250);
/// How long an echo may take before the server counts as not answering.
pub const ECHO_TIMEOUT: Duration = Duration::from_millis(750);

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
        (send, !self.overdue)
    }

    /// Echo number `n` came back: the server answers. An echo older than the one awaited
    /// still proves it does.
    pub fn echoed(&mut self, n: u64) {
        if self.connected && self.in_flight.is_some_and(|(awaited, _)| n <= awaited) {
            self.in_flight = None;
            self.overdue = false;
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
        // Nothing comes back.
        assert!(probe.tick(ms(start, 700), true).1, "within the timeout");
        let (resent, reachable) = probe.tick(ms(start, 800), true);
        assert!(!reachable, "overdue");
        assert_eq!(resent, Some(1), "a fresh echo in case the first was lost");
        // Silence goes on: one echo per interval, still unreachable.
        assert_eq!(probe.tick(ms(start, 900), true), (None, false));
        assert_eq!(probe.tick(ms(start, 1_050), true), (Some(2), false));
        // The server resumes and delivers what it held: the oldest echo ends the silence.
        probe.echoed(0);
        assert!(probe.tick(ms(start, 1_100), true).1);
    }

    #[test]
    fn a_dropped_connection_is_unreachable_and_a_new_one_starts_afresh() {
        let start = Instant::now();
        let mut probe = EchoProbe::default();
        let (n, _) = probe.tick(start, true);
        assert!(!probe.tick(ms(start, 900), true).1, "overdue");
        assert_eq!(probe.tick(ms(start, 1_000), false), (None, false));
        // An echo of the old connection counts for nothing now.
        probe.echoed(n.unwrap());
        let (send, reachable) = probe.tick(ms(start, 1_100), true);
        assert!(reachable, "the handshake was the server's answer");
        assert!(send.is_some_and(|m| m > n.unwrap()), "{send:?}");
    }
}
