//! Fault drills: a bounded streaming load of multi-turn conversations through the gateway
//! while a test breaks something, and what every request got.
//!
//! Each client holds a conversation: every turn sends the whole history again (the earlier
//! prompts and the assistant's answers), so from the second turn on most of the prompt is
//! cached on the decode worker that served the turn before. A turn is *routed with KV
//! affinity* when the control plane gave a verdict (not a fail-open or fallback) and sent it
//! to that same worker: the share of such turns per second is the routing quality a drill
//! watches fall and recover.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{json, Value};

use crate::probe::{assistant_text, streamed_chat};
use crate::{post_observed, UPSTREAM_HEADER, WORKER_HEADER};
use switchyard_protocol::route::ROUTE_HEADER;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The load's shape.
#[derive(Debug, Clone, Copy)]
pub struct DrillLoad {
    /// Clients, each one conversation at a time.
    pub clients: usize,
    /// Turns per conversation before a client starts a new one.
    pub turns: usize,
    /// Tokens asked for per turn.
    pub max_tokens: u32,
    /// Requests each client sends at most (the bound on the load's count).
    pub max_requests_per_client: usize,
}

impl Default for DrillLoad {
    fn default() -> Self {
        DrillLoad {
            clients: 3,
            turns: 6,
            max_tokens: 16,
            max_requests_per_client: 400,
        }
    }
}

/// What one request got.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// When it was sent, from the load's start.
    pub at: Duration,
    /// The turn's index in its conversation (0: the first).
    pub turn: usize,
    /// HTTP status (0: no response).
    pub status: u16,
    /// 200 and a complete stream.
    pub ok: bool,
    /// `x-switchyard-route`: `bypass`, `disagg`, `agg`, `fail-open;reason=…`, ….
    pub route: String,
    /// The id of the decode worker that served it (its `x-switchyard-worker` header), whether
    /// routed by a verdict or failed open.
    pub worker: Option<String>,
    /// The upstream Envoy served it on when that was not the filter's destination (its
    /// `x-switchyard-upstream` header): the destination refused, Envoy retried elsewhere.
    pub rerouted_to: Option<String>,
    /// For turns after the first: routed by a verdict to the previous turn's worker.
    pub affinity: Option<bool>,
    /// The worker that served the conversation's previous turn, if any.
    pub previous: Option<String>,
    /// What went wrong, when not ok.
    pub error: Option<String>,
}

impl Outcome {
    /// Whether the filter failed open for it (no verdict in time).
    pub fn failed_open(&self) -> bool {
        self.route.starts_with("fail-open")
    }
}

/// A load that is running.
pub struct DrillRun {
    started: Instant,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `load` against the gateway at `gateway` (its base URL).
pub fn start(http: &reqwest::Client, gateway: &str, load: DrillLoad) -> DrillRun {
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let url = format!("{gateway}/v1/chat/completions");
    let clients = (0..load.clients)
        .map(|client| {
            let (http, url, stop, outcomes) =
                (http.clone(), url.clone(), stop.clone(), outcomes.clone());
            tokio::spawn(async move {
                run_client(client, &http, &url, load, started, &stop, &outcomes).await;
            })
        })
        .collect();
    DrillRun {
        started,
        stop,
        outcomes,
        clients,
    }
}

/// The first message of a conversation: ~600 tokens of text unique to it.
fn opening(client: usize, conversation: usize) -> String {
    let mut text = format!("Client {client}, conversation {conversation}: plan the work.\n");
    for i in 0..40 {
        text.push_str(&format!(
            "Step {i} of plan {client}/{conversation} depends on step {} and unlocks {}.\n",
            i.max(1) - 1,
            i + 1
        ));
    }
    text
}

async fn run_client(
    client: usize,
    http: &reqwest::Client,
    url: &str,
    load: DrillLoad,
    started: Instant,
    stop: &AtomicBool,
    outcomes: &Mutex<Vec<Outcome>>,
) {
    let mut sent = 0;
    let mut conversation = 0;
    while sent < load.max_requests_per_client && !stop.load(Ordering::Relaxed) {
        let mut messages = vec![json!({"role": "user", "content": opening(client, conversation)})];
        let mut previous: Option<String> = None;
        for turn in 0..load.turns {
            if sent >= load.max_requests_per_client || stop.load(Ordering::Relaxed) {
                return;
            }
            sent += 1;
            let at = started.elapsed();
            let body = streamed_chat(Value::Array(messages.clone()), load.max_tokens);
            let outcome = match post_observed(http, url, &body, &[], REQUEST_TIMEOUT).await {
                Ok(r) => {
                    let complete = r.sse_data().last().map(String::as_str) == Some("[DONE]");
                    let route = r.header(ROUTE_HEADER).to_string();
                    let worker =
                        Some(r.header(WORKER_HEADER).to_string()).filter(|w| !w.is_empty());
                    let rerouted_to =
                        Some(r.header(UPSTREAM_HEADER).to_string()).filter(|u| !u.is_empty());
                    let routed = matches!(route.as_str(), "bypass" | "disagg" | "agg");
                    let affinity = previous
                        .as_ref()
                        .map(|p| routed && worker.as_ref() == Some(p));
                    let ok = r.status == 200 && complete;
                    let previous_worker = previous.clone();
                    if ok {
                        messages.push(json!({"role": "assistant", "content": assistant_text(&r)}));
                        messages.push(
                            json!({"role": "user", "content": format!("Go on with step {turn}.")}),
                        );
                        previous.clone_from(&worker);
                    }
                    Outcome {
                        at,
                        turn,
                        status: r.status,
                        ok,
                        route,
                        worker,
                        rerouted_to,
                        affinity,
                        previous: previous_worker,
                        error: (!ok).then(|| format!("{}: {}", r.status, r.body())),
                    }
                }
                Err(e) => Outcome {
                    at,
                    turn,
                    status: 0,
                    ok: false,
                    route: String::new(),
                    worker: None,
                    rerouted_to: None,
                    affinity: None,
                    previous: previous.clone(),
                    error: Some(e),
                },
            };
            let failed = !outcome.ok;
            outcomes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(outcome);
            if failed {
                // The conversation cannot go on without the answer; start a new one.
                break;
            }
        }
        conversation += 1;
    }
}

impl DrillRun {
    /// Time since the load started: mark a fault's start and end with it.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops the clients after their current request and returns what every request got.
    pub async fn finish(self) -> DrillReport {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            let _ = client.await;
        }
        let mut outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        outcomes.sort_by_key(|o| o.at);
        DrillReport { outcomes }
    }
}

/// Every request of a drill's load.
#[derive(Debug, Clone)]
pub struct DrillReport {
    /// In the order they were sent.
    pub outcomes: Vec<Outcome>,
}

impl DrillReport {
    /// Requests sent.
    pub fn sent(&self) -> usize {
        self.outcomes.len()
    }

    /// Requests that did not succeed.
    pub fn failed(&self) -> Vec<&Outcome> {
        self.outcomes.iter().filter(|o| !o.ok).collect()
    }

    /// Panics (naming `drill`) unless every request succeeded and at least `min_sent` were
    /// sent (the load ran throughout).
    pub fn assert_none_failed(&self, drill: &str, min_sent: usize) {
        let failed = self.failed();
        assert!(
            failed.is_empty(),
            "{drill}: {} of {} failed: {:?}\n{}",
            failed.len(),
            self.sent(),
            &failed[..failed.len().min(3)],
            self.timeline()
        );
        assert!(
            self.sent() >= min_sent,
            "{drill}: the load ran throughout: {}",
            self.sent()
        );
    }

    /// Requests the filter failed open for.
    pub fn failed_open(&self) -> usize {
        self.outcomes.iter().filter(|o| o.failed_open()).count()
    }

    /// Share of turns after the first routed with KV affinity among those sent in
    /// `[from, to)`; `None` without such turns.
    pub fn affinity_share(&self, from: Duration, to: Duration) -> Option<f64> {
        let (kept, turns) = self.affinity_counts(from, to);
        (turns > 0).then(|| kept as f64 / turns as f64)
    }

    /// Turns after the first sent in `[from, to)`: how many were routed with KV affinity,
    /// and how many there were.
    fn affinity_counts(&self, from: Duration, to: Duration) -> (usize, usize) {
        let turns: Vec<bool> = self
            .outcomes
            .iter()
            .filter(|o| o.at >= from && o.at < to)
            .filter_map(|o| o.affinity)
            .collect();
        (turns.iter().filter(|a| **a).count(), turns.len())
    }

    /// How long after `from` the routing quality was back: the end of the first one-second
    /// window from `from` on whose affinity share is at least `goal`, and from whose start to
    /// the end of the load the share stays at `goal` or above, within two binomial standard
    /// errors of it. A router at its steady quality moves a few turns per hundred to another
    /// worker on purpose (a short cached prefix loses to load), so over a few dozen turns the
    /// share lands a few points either side of the goal by chance; a relapse falls further.
    /// `None` if it never came back.
    pub fn recovered_after(&self, from: Duration, goal: f64) -> Option<Duration> {
        let end = self.outcomes.last()?.at + Duration::from_secs(1);
        let windows: Vec<(Duration, Option<f64>)> = (0..)
            .map(|s| from + Duration::from_secs(s))
            .take_while(|start| *start < end)
            .map(|start| {
                (
                    start,
                    self.affinity_share(start, start + Duration::from_secs(1)),
                )
            })
            .collect();
        let first_good = windows
            .iter()
            .position(|(_, share)| share.is_some_and(|s| s >= goal))?;
        let (kept, turns) = self.affinity_counts(windows[first_good].0, end);
        let n = turns as f64;
        let margin = 2.0 * (goal * (1.0 - goal).max(0.0) / n).sqrt();
        let stays = turns > 0 && kept as f64 / n >= goal - margin;
        stays.then(|| windows[first_good].0 + Duration::from_secs(1) - from)
    }

    /// Per second of the load: `second: affinity share (turns), fail-opens, failures`, for
    /// failure messages.
    pub fn timeline(&self) -> String {
        let Some(last) = self.outcomes.last() else {
            return "no requests".into();
        };
        (0..=last.at.as_secs())
            .map(|s| {
                let (from, to) = (Duration::from_secs(s), Duration::from_secs(s + 1));
                let in_second: Vec<&Outcome> = self
                    .outcomes
                    .iter()
                    .filter(|o| o.at >= from && o.at < to)
                    .collect();
                // The turns routed away from their previous turn's worker, to tell a
                // worker change the router chose from a fail-open.
                let moved: Vec<String> = in_second
                    .iter()
                    .filter(|o| o.affinity == Some(false) && !o.failed_open())
                    .map(|o| {
                        format!(
                            "turn {} {} {} after {}",
                            o.turn,
                            o.route,
                            o.worker.as_deref().unwrap_or("?"),
                            o.previous.as_deref().unwrap_or("?")
                        )
                    })
                    .collect();
                format!(
                    "{s}s: {} ({} turns) {} fail-open {} failed{}",
                    self.affinity_share(from, to)
                        .map_or("-".into(), |a| format!("{:.0}%", a * 100.0)),
                    in_second.iter().filter(|o| o.affinity.is_some()).count(),
                    in_second.iter().filter(|o| o.failed_open()).count(),
                    in_second.iter().filter(|o| !o.ok).count(),
                    if moved.is_empty() {
                        String::new()
                    } else {
                        format!("; moved: {}", moved.join(", "))
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// One row of `docs/reliability.md`'s table.
    pub fn row(&self, drill: &str, recovery: &str) -> String {
        format!(
            "| {drill} | {} | {} | {} | {} | {recovery} |",
            self.sent(),
            self.sent() - self.failed().len(),
            self.failed().len(),
            self.failed_open(),
        )
    }
}

/// The upper bound of the Prometheus histogram bucket `name` (`…_bucket{le=…}` lines of a
/// scrape) that holds quantile `q`: an upper estimate of that quantile. `None` without
/// observations.
pub fn histogram_quantile(scrape: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = scrape
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.iter().map(|(_, c)| *c).fold(0.0, f64::max);
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, cumulative)| *cumulative >= q * total)
        .map(|(le, _)| *le)
}

/// Prints a drill's row where the test output shows it (and where `docs/reliability.md`'s
/// table is copied from).
pub fn report(row: &str) {
    eprintln!("DRILL {row}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(at_ms: u64, affinity: Option<bool>) -> Outcome {
        Outcome {
            at: Duration::from_millis(at_ms),
            turn: usize::from(affinity.is_some()),
            status: 200,
            ok: true,
            route: "bypass".into(),
            worker: Some("w".into()),
            rerouted_to: None,
            affinity,
            previous: None,
            error: None,
        }
    }

    #[test]
    fn a_quantile_is_the_bound_of_the_bucket_that_holds_it() {
        let scrape = "x_bucket{le=\"0.001\"} 50\nx_bucket{le=\"0.002\"} 98\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
        assert_eq!(histogram_quantile(scrape, "x", 0.5), Some(0.001));
        assert_eq!(histogram_quantile(scrape, "x", 0.9), Some(0.002));
        assert_eq!(histogram_quantile(scrape, "x", 0.99), Some(f64::INFINITY));
        assert_eq!(histogram_quantile("", "x", 0.5), None);
    }

    #[test]
    fn recovery_is_the_first_good_second_that_stays_good() {
        let report = DrillReport {
            outcomes: vec![
                outcome(100, Some(true)),
                outcome(1_100, Some(false)),
                outcome(1_200, Some(false)),
                outcome(2_100, Some(true)),
                outcome(2_200, Some(false)),
                outcome(3_100, Some(true)),
                outcome(3_200, None),
                outcome(4_500, Some(true)),
            ],
        };
        assert_eq!(
            report.affinity_share(Duration::ZERO, Duration::from_secs(9)),
            Some(4.0 / 7.0)
        );
        // From 1 s: [1,2) 0.0, [2,3) 0.5, [3,4) 1.0, [4,5) 1.0.
        assert_eq!(
            report.recovered_after(Duration::from_secs(1), 0.9),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            report.recovered_after(Duration::from_secs(1), 0.5),
            Some(Duration::from_secs(2))
        );
        // Good in [1, 2), then half the turns move: a relapse, far outside the noise of 20
        // turns at 90 % (2 standard errors: 13 points).
        let mut relapse = vec![outcome(100, Some(false)), outcome(1_100, Some(true))];
        relapse.extend((0..20).map(|i| outcome(2_000 + 40 * i, Some(i % 2 == 0))));
        let never = DrillReport { outcomes: relapse };
        assert_eq!(
            never.recovered_after(Duration::ZERO, 0.9),
            None,
            "it did not stay good"
        );
        // 4 moves in 21 turns (81 %) is within the noise of 90 % (2 standard errors: 13
        // points): back after 2 s.
        let mut noisy = vec![outcome(100, Some(false)), outcome(1_100, Some(true))];
        noisy.extend((0..20).map(|i| outcome(2_000 + 40 * i, Some(i % 5 != 3))));
        let noisy = DrillReport { outcomes: noisy };
        assert_eq!(
            noisy.recovered_after(Duration::ZERO, 0.9),
            Some(Duration::from_secs(2))
        );
    }
}
