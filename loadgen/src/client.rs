//! The streaming HTTP client that replays a workload.
//!
//! Each planned request gets a task that waits for its arrival time (scaled), its
//! dependencies and think time, then for a concurrency slot (taken in planned order by
//! requests whose arrival times tie), and sends the request with
//! `stream: true`. TTFT, E2E and token counts come from the SSE stream; route and worker from
//! the response headers. Every request sent yields a [`RequestRecord`], failures included;
//! requests that cannot be sent before the duration cap are counted as not sent.
//! [`replay_until`] also stops at a signal of the caller's (Ctrl-C): what finished is kept,
//! the rest is counted as not sent or cut.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::{watch, Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::prompts::{BodyBuilder, PromptFraming};
use super::record::RequestRecord;
use super::sse::{clip, interpret, SseParser};
use super::{ArrivalScale, PlannedRequest, Workload};

/// Response header naming the worker that served the request.
pub const WORKER_HEADER: &str = "x-switchyard-worker";

/// How to replay.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080` (the API path is appended).
    pub endpoint: String,
    /// Multiplies arrival and think times on the wall clock the client sleeps on: 0.5
    /// replays twice as fast, 0 sends at once. In front of sped-up simulated workers this is
    /// the modelled arrival scale on their wall clock ([`ArrivalScale::on_wall_clock`]).
    pub arrival_scale: ArrivalScale,
    /// Requests in flight at most (`None`: unlimited).
    pub max_concurrency: Option<usize>,
    /// No request is sent after this long; requests in flight get `drain` more to finish.
    pub max_duration: Option<Duration>,
    /// Grace period for in-flight requests after `max_duration`.
    pub drain: Duration,
    /// Per-request limit, send to end of stream (`None`: none).
    pub request_timeout: Option<Duration>,
    /// Bearer token, if the endpoint wants one.
    pub api_key: Option<String>,
    /// Prefix of the `x-request-id` of every request (`<tag>-<id>`).
    pub run_tag: String,
    /// Fixed tokens around the content, to record the expected prompt tokens.
    pub framing: PromptFraming,
    /// Draw a progress bar on stderr (only shown on a terminal).
    pub progress: bool,
}

/// Errors that stop a replay before it starts.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint is not an `http://` URL.
    #[error("endpoint must be an http:// URL, got {0:?}{hint}", hint = endpoint_hint(.0))]
    InvalidEndpoint(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// What a replay produced.
#[derive(Debug, Clone, Default)]
pub struct ReplayOutcome {
    /// One record per request sent, in id order.
    pub records: Vec<RequestRecord>,
    /// Planned requests never sent.
    pub not_sent: usize,
    /// Requests in flight when the replay was stopped ([`replay_until`]): sent, but not
    /// measured (an answer cut by the client is no measurement of the server).
    pub cut: usize,
    /// When the replay was stopped, from its start (`None`: it ran to its end).
    pub stopped_after: Option<Duration>,
}

/// Shared state of one replay.
struct Shared {
    http: reqwest::Client,
    url: String,
    config: ClientConfig,
    builder: BodyBuilder,
    workload: Workload,
    start: Instant,
    deadline: Option<Instant>,
    slots: Option<Slots>,
    /// When the caller stopped the replay (`None` until it does).
    stop: watch::Receiver<Option<Instant>>,
}

/// The concurrency cap. Requests of the open-loop schedule (no dependencies) queue for a slot
/// in planned order, arrival then id: each joins the semaphore's queue (first come, first
/// served) only once the one before it has, so requests whose arrival times tie (all of them
/// at `--arrival-scale 0`) are not sent in whatever order the runtime polls their tasks, which
/// would send later turns of a trace before earlier ones. A request that waits for others
/// joins when it is ready.
struct Slots {
    semaphore: Semaphore,
    /// Each open-loop request's place in the planned order (`None`: it has dependencies).
    place: Vec<Option<usize>>,
    /// How many open-loop requests have joined the semaphore's queue.
    joined: watch::Sender<usize>,
}

impl Slots {
    fn new(slots: usize, requests: &[PlannedRequest]) -> Self {
        let mut open_loop: Vec<(u64, usize)> = (requests.iter().enumerate())
            .filter(|(_, r)| r.after.is_empty())
            .map(|(id, r)| (r.arrival_ms, id))
            .collect();
        open_loop.sort_unstable();
        let mut place = vec![None; requests.len()];
        for (at, &(_, id)) in open_loop.iter().enumerate() {
            place[id] = Some(at);
        }
        Slots {
            semaphore: Semaphore::new(slots),
            place,
            joined: watch::channel(0).0,
        }
    }

    /// A slot for request `id`, once it is its turn to queue; `None` if the semaphore closed.
    async fn acquire(&self, id: usize) -> Option<SemaphorePermit<'_>> {
        let Some(place) = self.place[id] else {
            return self.semaphore.acquire().await.ok();
        };
        self.joined
            .subscribe()
            .wait_for(|&joined| joined >= place)
            .await
            .ok()?;
        let acquire = self.semaphore.acquire();
        tokio::pin!(acquire);
        // Polled once, an acquire holds its place in the semaphore's queue.
        let first = futures::poll!(&mut acquire);
        self.joined.send_modify(|joined| *joined += 1);
        match first {
            std::task::Poll::Ready(permit) => permit.ok(),
            std::task::Poll::Pending => acquire.await.ok(),
        }
    }
}

/// How one planned request ended.
enum Outcome {
    /// Sent and measured.
    Measured(RequestRecord),
    /// Never sent.
    NotSent,
    /// Sent, then cut by the caller's stop.
    Cut,
}

/// What to write instead of a refused `endpoint`.
fn endpoint_hint(endpoint: &str) -> String {
    if endpoint.contains(['?', '#']) {
        " (no query or fragment: requests go to <endpoint>/v1/chat/completions)".into()
    } else if names_an_api_path(endpoint) {
        " (give the server's root or its /v1 base URL: the request path is appended to it)".into()
    } else if endpoint.contains('@') {
        " (no credentials in the URL: pass a key with --api-key or OPENAI_API_KEY)".into()
    } else if endpoint.to_ascii_lowercase().starts_with("https://") {
        " (TLS is not built in: point it at the gateway's plain-HTTP listener)".into()
    } else if !endpoint.contains("://") {
        format!(" (did you mean http://{endpoint}?)")
    } else {
        String::new()
    }
}

/// Whether `endpoint` is a URL the client can send to.
///
/// # Errors
/// [`ClientError::InvalidEndpoint`] unless it is an `http://` URL without a query, fragment
/// or credentials (which the report would print) whose path is not already an API path (the
/// request path is appended to it).
pub fn check_endpoint(endpoint: &str) -> Result<(), ClientError> {
    match reqwest::Url::parse(endpoint) {
        Ok(url)
            if url.scheme() == "http"
                && url.query().is_none()
                && url.fragment().is_none()
                && url.username().is_empty()
                && url.password().is_none()
                && !names_an_api_path(url.path()) =>
        {
            Ok(())
        }
        _ => Err(ClientError::InvalidEndpoint(endpoint.to_string())),
    }
}

/// Whether `endpoint` ends in a request path (`.../chat/completions`), which
/// [`request_url`] would append a second time.
fn names_an_api_path(endpoint: &str) -> bool {
    endpoint.trim_end_matches('/').ends_with("/completions")
}

/// Where requests go: `endpoint` (the server's root, or an OpenAI base URL ending in `/v1`,
/// as OpenAI's SDKs take it) followed by `path` (`/v1/chat/completions`).
pub fn request_url(endpoint: &str, path: &str) -> String {
    let root = endpoint.trim_end_matches('/');
    let root = root.strip_suffix("/v1").unwrap_or(root);
    format!("{root}{path}")
}

/// Replays `workload` with `builder`'s request bodies.
///
/// # Errors
/// [`ClientError`] for a bad endpoint or HTTP client setup; request failures are
/// recorded, not returned.
pub async fn replay(
    workload: Workload,
    builder: BodyBuilder,
    config: ClientConfig,
) -> Result<ReplayOutcome, ClientError> {
    replay_until(workload, builder, config, std::future::pending()).await
}

/// [`replay`], stopped when `stop` completes: nothing more is sent, the requests in flight
/// are cut, and the outcome holds the records of those that finished.
///
/// # Errors
/// As [`replay`].
pub async fn replay_until(
    workload: Workload,
    builder: BodyBuilder,
    config: ClientConfig,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<ReplayOutcome, ClientError> {
    check_endpoint(&config.endpoint)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| ClientError::Build(e.to_string()))?;
    let url = request_url(&config.endpoint, builder.path());
    let start = Instant::now();
    let n = workload.requests.len();
    let progress = progress_bar(n as u64, config.progress);
    // When the caller stopped the replay, if it did: the channel itself carries it, so the
    // outcome cannot miss a stop its requests saw.
    let (stop_tx, stop_rx) = watch::channel(None::<Instant>);
    let stopper = tokio::spawn(async move {
        stop.await;
        let _ = stop_tx.send(Some(Instant::now()));
    });
    let shared = Arc::new(Shared {
        http,
        url,
        deadline: config.max_duration.map(|d| start + d),
        slots: config
            .max_concurrency
            .map(|c| Slots::new(c.max(1), &workload.requests)),
        config,
        builder,
        workload,
        start,
        stop: stop_rx.clone(),
    });
    let (done_tx, done_rx): (Vec<_>, Vec<_>) = (0..n).map(|_| watch::channel(false)).unzip();
    let mut tasks = Vec::with_capacity(n);
    for (id, done) in done_tx.into_iter().enumerate() {
        let deps: Vec<_> = shared.workload.requests[id]
            .after
            .iter()
            .map(|&d| done_rx[d].clone())
            .collect();
        let shared = Arc::clone(&shared);
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = run_one(&shared, id, deps).await;
            // Dependents wait for `true`; a dropped sender tells them this never ran.
            if matches!(outcome, Outcome::Measured(_)) {
                let _ = done.send(true);
            }
            progress.inc(1);
            outcome
        }));
    }
    let mut outcome = ReplayOutcome::default();
    for task in tasks {
        match task.await {
            Ok(Outcome::Measured(record)) => outcome.records.push(record),
            Ok(Outcome::NotSent) => outcome.not_sent += 1,
            Ok(Outcome::Cut) => outcome.cut += 1,
            Err(e) => {
                tracing::error!("request task failed: {e}");
                outcome.not_sent += 1;
            }
        }
    }
    progress.finish_and_clear();
    stopper.abort();
    outcome.stopped_after = stop_rx
        .borrow()
        .map(|at| at.saturating_duration_since(start));
    Ok(outcome)
}

/// Resolves once the caller has stopped the replay.
async fn stopped(shared: &Shared) {
    let mut stop = shared.stop.clone();
    if stop.wait_for(Option::is_some).await.is_err() {
        // The stopper is gone without stopping: never.
        std::future::pending::<()>().await;
    }
}

fn progress_bar(len: u64, enabled: bool) -> ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{wide_bar}] {pos}/{len} requests ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar
}

fn ms_since(start: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(start).as_secs_f64() * 1000.0
}

/// Waits until the request may go, sends it and measures it.
async fn run_one(shared: &Shared, id: usize, deps: Vec<watch::Receiver<bool>>) -> Outcome {
    let planned = &shared.workload.requests[id];
    let scale = shared.config.arrival_scale;
    let scaled = |ms: u64| Duration::from_secs_f64(scale.scale_ms(ms as f64) / 1000.0);
    let deadline_passed = || async {
        match shared.deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let wait = async {
        for mut dep in deps {
            // Err: the dependency was never sent, so neither is this request.
            dep.wait_for(|done| *done).await.ok()?;
        }
        if !planned.after.is_empty() {
            tokio::time::sleep(scaled(planned.think_ms)).await;
        }
        tokio::time::sleep_until(shared.start + scaled(planned.arrival_ms)).await;
        let ready = Instant::now();
        let permit = match &shared.slots {
            Some(slots) => Some(slots.acquire(id).await?),
            None => None,
        };
        Some((ready, permit))
    };
    let (ready, _permit) = tokio::select! {
        r = wait => match r {
            Some(r) => r,
            None => return Outcome::NotSent,
        },
        () = deadline_passed() => return Outcome::NotSent,
        () = stopped(shared) => return Outcome::NotSent,
    };
    let sent = Instant::now();
    let mut record = RequestRecord {
        id,
        session: planned.session,
        turn: planned.turn,
        agent: planned.agent,
        ready_ms: ms_since(shared.start, ready),
        sent_ms: ms_since(shared.start, sent),
        planned_isl: planned.isl(),
        expected_prompt_tokens: shared.config.framing.prompt_tokens(planned.isl()),
        planned_osl: planned.osl,
        ..RequestRecord::default()
    };
    let limit = request_limit(shared, sent);
    let exchange = exchange(shared, planned, sent, &mut record);
    let limited = async {
        match limit {
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .unwrap_or_else(|_| Err(format!("timeout: no end of stream after {limit:?}"))),
            None => exchange.await,
        }
    };
    let result = tokio::select! {
        result = limited => result,
        () = stopped(shared) => return Outcome::Cut,
    };
    if let Err(e) = result {
        record.error = Some(e);
        if record.e2e_ms.is_none() {
            record.e2e_ms = Some(ms_since(sent, Instant::now()));
        }
    }
    Outcome::Measured(record)
}

/// The tighter of the per-request timeout and the end of the drain period.
fn request_limit(shared: &Shared, sent: Instant) -> Option<Duration> {
    let drain_end = shared
        .deadline
        .map(|d| (d + shared.config.drain).saturating_duration_since(sent));
    match (shared.config.request_timeout, drain_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One HTTP exchange; fills `record` as it goes.
async fn exchange(
    shared: &Shared,
    planned: &PlannedRequest,
    sent: Instant,
    record: &mut RequestRecord,
) -> Result<(), String> {
    let mut request = shared
        .http
        .post(&shared.url)
        .header(
            "x-request-id",
            format!("{}-{}", shared.config.run_tag, planned.id),
        )
        .json(&shared.builder.body(planned));
    if let Some(key) = &shared.config.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(describe)?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    record.route = header(switchyard_protocol::route::ROUTE_HEADER);
    record.worker = header(WORKER_HEADER);
    let status = response.status();
    record.status = Some(status.as_u16());
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(format!("http {}: {}", status.as_u16(), clip(body.trim())));
    }
    // A server that ignores `stream: true` answers one JSON document: say so, rather than
    // "ended without [DONE]" over a body that holds a finish_reason.
    if let Some(kind) = header("content-type").filter(|kind| !is_event_stream(kind)) {
        let body = response.text().await.unwrap_or_default();
        record.e2e_ms = Some(ms_since(sent, Instant::now()));
        return Err(format!(
            "stream: the answer is not an event stream (content-type {kind}; does the server \
             honour `stream: true`?): {}",
            clip(body.trim())
        ));
    }
    let mut parser = SseParser::default();
    let mut stream = response.bytes_stream();
    let mut finished = false;
    let mut stream_error = None;
    'read: loop {
        let chunk = match stream.next().await {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => {
                stream_error = Some(mid_stream(describe(e)));
                break;
            }
            None => break,
        };
        let now = Instant::now();
        for data in parser.push(&chunk) {
            let event = interpret(&data);
            if event.content {
                record.content_chunks += 1;
                record.ttft_ms.get_or_insert(ms_since(sent, now));
            }
            if let Some(u) = event.usage {
                record.prompt_tokens = u.prompt_tokens.or(record.prompt_tokens);
                record.completion_tokens = u.completion_tokens.or(record.completion_tokens);
                record.cached_tokens = u.cached_tokens.or(record.cached_tokens);
            }
            finished |= event.finish_reason.is_some();
            if let Some(e) = event.error {
                stream_error = Some(format!("stream: {e}"));
                break 'read;
            }
            if event.done {
                finished = true;
                break 'read;
            }
        }
    }
    record.e2e_ms = Some(ms_since(sent, Instant::now()));
    if let Some(e) = stream_error {
        return Err(e);
    }
    if !finished {
        return Err("stream: ended without [DONE] or a finish_reason".into());
    }
    if record.ttft_ms.is_none() {
        return Err("stream: no generated text".into());
    }
    Ok(())
}

/// Whether a `content-type` names server-sent events (parameters and case aside).
fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// An error met while reading a body, labelled as a failure mid-stream (the report groups
/// errors by the label before the first colon); [`describe`] already says "stream" for a cut
/// body, which was then said twice.
fn mid_stream(described: String) -> String {
    if described.starts_with("stream:") {
        described
    } else {
        format!("stream: {described}")
    }
}

/// A reqwest error with its causes, prefixed by its kind.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connect"
    } else if e.is_timeout() {
        "timeout"
    } else if e.is_body() || e.is_decode() {
        "stream"
    } else {
        "request"
    };
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{check_endpoint, mid_stream, request_url};

    #[test]
    fn an_openai_base_url_and_a_server_root_reach_the_same_path() {
        let path = "/v1/chat/completions";
        for endpoint in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080/v1/",
        ] {
            assert_eq!(
                request_url(endpoint, path),
                "http://127.0.0.1:8080/v1/chat/completions",
                "{endpoint}"
            );
            assert!(check_endpoint(endpoint).is_ok(), "{endpoint}");
        }
        // A gateway under a prefix keeps it.
        assert_eq!(
            request_url("http://gw/llm", path),
            "http://gw/llm/v1/chat/completions"
        );
        let err = check_endpoint("http://gw:80/?x=1").unwrap_err();
        assert!(err.to_string().contains("no query"), "{err}");
        assert!(
            check_endpoint("HTTP://127.0.0.1:8080").is_ok(),
            "schemes are case-blind"
        );
    }

    #[test]
    fn an_endpoint_that_would_misroute_or_leak_is_refused_with_a_hint() {
        for (endpoint, hint) in [
            ("http://127.0.0.1:8080/v1/chat/completions", "base URL"),
            ("http://127.0.0.1:8080/v1/completions/", "base URL"),
            ("http://user:pw@127.0.0.1:8080", "--api-key"),
            ("https://127.0.0.1:8080", "TLS"),
            ("127.0.0.1:8080", "did you mean"),
        ] {
            let err = check_endpoint(endpoint).expect_err(endpoint).to_string();
            assert!(err.contains(hint), "{endpoint}: {err}");
        }
    }

    #[test]
    fn an_error_mid_stream_is_labelled_once() {
        assert_eq!(
            mid_stream("stream: error decoding response body".into()),
            "stream: error decoding response body"
        );
        assert_eq!(
            mid_stream("timeout: operation timed out".into()),
            "stream: timeout: operation timed out"
        );
    }
}
