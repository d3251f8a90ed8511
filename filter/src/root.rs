//! Root context: parses the configuration once, defines the stats, makes request contexts, and
//! sends the queued lifecycle reports from its timer.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use log::{debug, error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MetricType};
use switchyard_protocol::handoff::{release_body, RELEASE_PATH};
use switchyard_protocol::lifecycle::{LifecycleEvent, LIFECYCLE_PATH};
use switchyard_protocol::route::{DESTINATION_HEADER, MODEL_HEADER};
use switchyard_protocol::route_input::TOKENIZER_PATH;

use crate::config::{Config, TokenizeMode};
use crate::headers::{CallHeaders, StreamHeaders};
use crate::http::SwitchyardRequest;
use crate::lifecycle::{self, Answer, LifecycleQueue};
use crate::metrics::{self, StatIds};
use crate::outcome::{FallbackReason, Rejection};
use crate::request::headers_to_strip;
use crate::shared::{increment, Release, Shared};
use crate::tokenize::{BodyFallback, LoadError, LoadedTokenizer, ModelKey, Tokenizers};
use crate::verdict::FailOpenReason;

/// Budget of one release call.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Budget of one tokenizer bundle fetch (about 12 MB for Qwen3, from the local control
/// plane).
const TOKENIZER_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The plugin's root context.
pub(crate) struct SwitchyardRoot {
    context_id: u32,
    /// `None` until `on_configure` succeeds; no request context is made before that.
    shared: Option<Rc<Shared>>,
    /// Events queued by this context's requests. Envoy gives a new filter configuration (an
    /// LDS update) a root context of its own; this one's queue is sent before it goes
    /// (`on_done`).
    reports: Rc<RefCell<LifecycleQueue>>,
    /// The lifecycle POST in flight (token, its events, to requeue if it fails). One at a
    /// time: a slow control plane then backs the queue up to its bound instead of piling calls
    /// onto Envoy.
    in_flight: Option<(u32, Vec<LifecycleEvent>)>,
    /// Release calls in flight.
    releases: Rc<RefCell<VecDeque<Release>>>,
    releases_in_flight: Vec<u32>,
    /// The models' tokenizers (`tokenize: filter`). This context's own: a new filter
    /// configuration gets a new root context, which fetches them again.
    tokenizers: Rc<RefCell<Tokenizers>>,
    /// Tokenizer bundle fetches in flight: call token, model.
    tokenizer_fetches: Vec<(u32, ModelKey)>,
    /// Envoy asked this context to finish (`on_done`): the listener or filter config that made
    /// it was replaced or removed, and its last request has ended. It sends what is queued,
    /// each batch once, then tells Envoy it is done.
    finishing: bool,
}

impl SwitchyardRoot {
    pub(crate) fn new(context_id: u32) -> Self {
        SwitchyardRoot {
            context_id,
            shared: None,
            reports: Rc::new(RefCell::new(LifecycleQueue::new(
                crate::config::DEFAULT_LIFECYCLE_QUEUE_MAX,
            ))),
            in_flight: None,
            releases: Rc::new(RefCell::new(VecDeque::new())),
            releases_in_flight: Vec::new(),
            tokenizers: Rc::new(RefCell::new(Tokenizers::default())),
            tokenizer_fetches: Vec::new(),
            finishing: false,
        }
    }

    /// Whether a lifecycle report or a hold release is still queued or on its way.
    fn sending(&self) -> bool {
        self.in_flight.is_some()
            || !self.releases_in_flight.is_empty()
            || self.reports.try_borrow().map_or(true, |q| !q.is_empty())
            || self.releases.try_borrow().map_or(true, |q| !q.is_empty())
    }

    /// Sends the queued hold releases and the next lifecycle batch. A batch whose dispatch
    /// Envoy refuses is dropped (counted), so this tries the next until one is on its way or
    /// none is left: each try takes a batch off the queue, which bounds the loop.
    fn send_remaining(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        self.send_releases(&shared);
        let queued = self.reports.try_borrow().map_or(0, |q| q.len());
        for _ in 0..queued {
            if self.in_flight.is_some() {
                break;
            }
            self.flush_reports(&shared);
        }
    }

    /// While finishing, sends what is left and, once nothing is on its way, tells Envoy this
    /// context may go.
    fn finish_when_sent(&mut self) {
        if !self.finishing {
            return;
        }
        self.send_remaining();
        if !self.sending() {
            info!("#{} lifecycle reports sent; finished", self.context_id);
            if let Err(status) = hostcalls::done() {
                warn!("#{} cannot finish: {status:?}", self.context_id);
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.get_current_time()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default()
    }

    /// Fetches the tokenizer bundles requests asked for (and retries failed ones that are
    /// due): `GET /v1/tokenizer` on the control plane, the model in `x-switchyard-model`.
    fn fetch_tokenizers(&mut self, shared: &Shared) {
        let now_ms = self.now_ms();
        let due = match self.tokenizers.try_borrow_mut() {
            Ok(mut tokenizers) => tokenizers.due(now_ms),
            Err(_) => return,
        };
        for model in due {
            let config = &shared.config;
            let mut headers = vec![
                (":method", "GET"),
                (":path", TOKENIZER_PATH),
                (":authority", config.control_plane_authority.as_str()),
            ];
            if let Some(name) = &model {
                headers.push((MODEL_HEADER, name.as_str()));
            }
            match self.dispatch_http_call(
                &config.control_plane_cluster,
                headers,
                None,
                vec![],
                TOKENIZER_FETCH_TIMEOUT,
            ) {
                Ok(token) => self.tokenizer_fetches.push((token, model)),
                Err(status) => {
                    let failed = Err(LoadError::Status(format!("dispatch refused: {status:?}")));
                    self.tokenizer_fetched(shared, &model, failed);
                }
            }
        }
    }

    /// A bundle fetch ended: keep the tokenizer or schedule the retry; count and log either.
    fn tokenizer_fetched(
        &mut self,
        shared: &Shared,
        model: &ModelKey,
        result: Result<LoadedTokenizer, LoadError>,
    ) {
        let name = model.as_deref().unwrap_or("(default)");
        match &result {
            Ok(_) => {
                info!("#{} tokenizer of {name} loaded", self.context_id);
                increment(shared.stats.tokenizer_loads_total, 1);
            }
            Err(e) => {
                warn!("#{} tokenizer of {name} not loaded: {e}", self.context_id);
                increment(shared.stats.tokenizer_load_failures_total, 1);
            }
        }
        let now_ms = self.now_ms();
        if let Ok(mut tokenizers) = self.tokenizers.try_borrow_mut() {
            tokenizers.finish(model, result, now_ms);
        }
    }

    /// Sends the queued releases: `POST /switchyard/kv/release` to each hold's prefill worker
    /// through the prefill cluster.
    fn send_releases(&mut self, shared: &Shared) {
        let queued: Vec<Release> = match self.releases.try_borrow_mut() {
            Ok(mut queue) => queue.drain(..).collect(),
            Err(_) => return,
        };
        for release in queued {
            let body = release_body(&release.hold);
            let config = &shared.config;
            let headers = vec![
                (":method", "POST"),
                (":path", RELEASE_PATH),
                (":authority", config.prefill_cluster.as_str()),
                ("content-type", "application/json"),
                (DESTINATION_HEADER, release.prefill.as_str()),
            ];
            match self.dispatch_http_call(
                &config.prefill_cluster,
                headers,
                Some(&body),
                vec![],
                RELEASE_TIMEOUT,
            ) {
                Ok(token) => self.releases_in_flight.push(token),
                Err(status) => {
                    debug!("#{} release dispatch refused: {status:?}", self.context_id);
                    increment(shared.stats.prefill_release_failures_total, 1);
                }
            }
        }
    }

    fn flush_reports(&mut self, shared: &Shared) {
        if self.in_flight.is_some() {
            return;
        }
        let Some(batch) = self
            .reports
            .try_borrow_mut()
            .ok()
            .and_then(|mut q| q.take_batch(shared.config.lifecycle_batch_max))
        else {
            return;
        };
        let count = batch.events.len();
        let body = match serde_json::to_vec(&batch) {
            Ok(body) => body,
            Err(e) => {
                warn!("#{} cannot serialise lifecycle batch: {e}", self.context_id);
                increment(shared.stats.reports_dropped_total, count as i64);
                return;
            }
        };
        let config = &shared.config;
        let headers = vec![
            (":method", "POST"),
            (":path", LIFECYCLE_PATH),
            (":authority", config.control_plane_authority.as_str()),
            ("content-type", "application/json"),
        ];
        match self.dispatch_http_call(
            &config.control_plane_cluster,
            headers,
            Some(&body),
            vec![],
            config.lifecycle_timeout(),
        ) {
            Ok(token) => self.in_flight = Some((token, batch.events)),
            Err(status) => {
                debug!(
                    "#{} lifecycle dispatch refused: {status:?}",
                    self.context_id
                );
                increment(shared.stats.reports_dropped_total, count as i64);
            }
        }
    }
}

/// Whether the call whose answer is being handled got a 2xx.
fn call_succeeded() -> bool {
    hostcalls::get_map_value(
        proxy_wasm::types::MapType::HttpCallResponseHeaders,
        ":status",
    )
    .ok()
    .flatten()
    .and_then(|s| s.parse::<u16>().ok())
    .is_some_and(|code| (200..300).contains(&code))
}

/// Defines a metric. `define_metric` is idempotent per name in Envoy, so a reconfigure gets
/// the same ids; a failure leaves id 0, whose increments are skipped.
fn define(kind: MetricType, name: &str) -> u32 {
    match hostcalls::define_metric(kind, name) {
        Ok(id) => id,
        Err(status) => {
            warn!("cannot define metric {name}: {status:?}");
            0
        }
    }
}

fn define_counter(name: &str) -> u32 {
    define(MetricType::Counter, name)
}

fn define_stats() -> StatIds {
    StatIds {
        fail_open_total: define_counter(metrics::FAIL_OPEN_TOTAL),
        fail_open: FailOpenReason::STAT_KEYS
            .iter()
            .map(|key| define_counter(&metrics::fail_open_stat_name(key)))
            .collect(),
        routed: metrics::MODES
            .iter()
            .map(|m| define_counter(&metrics::routed_stat_name(*m)))
            .collect(),
        fallback: FallbackReason::ALL
            .iter()
            .map(|r| define_counter(&metrics::fallback_stat_name(*r)))
            .collect(),
        route_calls_total: define_counter(metrics::ROUTE_CALLS_TOTAL),
        stripped_headers_total: define_counter(metrics::STRIPPED_HEADERS_TOTAL),
        rejected_total: define_counter(metrics::REJECTED_TOTAL),
        rejected: Rejection::STAT_KEYS
            .iter()
            .map(|key| define_counter(&metrics::rejected_stat_name(key)))
            .collect(),
        client_steering_stripped_total: define_counter(metrics::CLIENT_STEERING_STRIPPED_TOTAL),
        deferred_screens_total: define_counter(metrics::DEFERRED_SCREENS_TOTAL),
        prefill_releases_total: define_counter(metrics::PREFILL_RELEASES_TOTAL),
        prefill_abandoned_total: define_counter(metrics::PREFILL_ABANDONED_TOTAL),
        prefill_release_failures_total: define_counter(metrics::PREFILL_RELEASE_FAILURES_TOTAL),
        prefill_attempts_total: define_counter(metrics::PREFILL_ATTEMPTS_TOTAL),
        prefill_retries_total: define_counter(metrics::PREFILL_RETRIES_TOTAL),
        prefill_failures_total: define_counter(metrics::PREFILL_FAILURES_TOTAL),
        prefill_handoffs_total: define_counter(metrics::PREFILL_HANDOFFS_TOTAL),
        prefill_no_handoff_total: define_counter(metrics::PREFILL_NO_HANDOFF_TOTAL),
        prefill_lost_total: define_counter(metrics::PREFILL_LOST_TOTAL),
        rerouted_total: define_counter(metrics::REROUTED_TOTAL),
        prefill_latency_ms: define(MetricType::Histogram, metrics::PREFILL_LATENCY_MS),
        reports_sent_total: define_counter(metrics::REPORTS_SENT_TOTAL),
        reports_dropped_total: define_counter(metrics::REPORTS_DROPPED_TOTAL),
        reports_requeued_total: define_counter(metrics::REPORTS_REQUEUED_TOTAL),
        route_input_hashes_total: define_counter(metrics::ROUTE_INPUT_HASHES_TOTAL),
        route_input_body: BodyFallback::ALL
            .iter()
            .map(|r| define_counter(&metrics::route_input_body_stat_name(*r)))
            .collect(),
        route_call_bytes_total: define_counter(metrics::ROUTE_CALL_BYTES_TOTAL),
        tokenizer_loads_total: define_counter(metrics::TOKENIZER_LOADS_TOTAL),
        tokenizer_load_failures_total: define_counter(metrics::TOKENIZER_LOAD_FAILURES_TOTAL),
    }
}

impl Context for SwitchyardRoot {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        self.call_answered(token_id, body_size);
        self.finish_when_sent();
    }

    /// Envoy calls this when the listener or filter config that made this context is replaced
    /// (an LDS update, a listener removed) and its last request has ended, and deletes the
    /// context, queue and all, when it answers `true`. The requests that ended last queued
    /// their `done` reports here moments ago (streams that outlived Envoy's drain time, cut
    /// at its end, among them). Lost, each stayed counted in flight on its worker until the
    /// worker's load reports had shown it gone for 30 s (`load.stale_in_flight_ms`), the
    /// router steering turns away from that worker meanwhile, and its usage never reached the
    /// router. So it answers `false` while anything is queued or on its way, and finishes
    /// once the last answer came (`hostcalls::done`).
    fn on_done(&mut self) -> bool {
        if self.shared.is_none() {
            return true;
        }
        self.finishing = true;
        self.send_remaining();
        let sending = self.sending();
        if sending {
            info!(
                "#{} config replaced: sending the queued lifecycle reports before finishing",
                self.context_id
            );
        }
        !sending
    }
}

impl SwitchyardRoot {
    /// A call of this context's answered: a tokenizer bundle, a hold release or a lifecycle
    /// batch.
    fn call_answered(&mut self, token_id: u32, body_size: usize) {
        if let Some(i) = self
            .tokenizer_fetches
            .iter()
            .position(|(t, _)| *t == token_id)
        {
            let (_, model) = self.tokenizer_fetches.swap_remove(i);
            let Some(shared) = self.shared.clone() else {
                return;
            };
            let status = self.call_response_header(":status");
            let result = if status.as_deref() == Some("200") {
                // Parsing the bundle and building the tokenizer blocks this worker thread
                // once per VM and model (docs/filter-overhead.md has how long).
                let body = self
                    .get_http_call_response_body(0, body_size)
                    .unwrap_or_default();
                LoadedTokenizer::from_bundle_json(&body)
            } else {
                Err(LoadError::Status(
                    status.unwrap_or_else(|| "nothing".into()),
                ))
            };
            self.tokenizer_fetched(&shared, &model, result);
            return;
        }
        if let Some(i) = self.releases_in_flight.iter().position(|t| *t == token_id) {
            self.releases_in_flight.swap_remove(i);
            if let Some(shared) = self.shared.clone() {
                let released = call_succeeded();
                let id = if released {
                    shared.stats.prefill_releases_total
                } else {
                    shared.stats.prefill_release_failures_total
                };
                increment(id, 1);
            }
            return;
        }
        let Some((_, events)) = self.in_flight.take_if(|(token, _)| *token == token_id) else {
            return;
        };
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let count = events.len();
        let status = self.call_response_header(":status");
        match lifecycle::answer(status.as_deref()) {
            Answer::Taken => {
                increment(shared.stats.reports_sent_total, count as i64);
                // Drain a backlog promptly instead of one batch per tick.
                self.flush_reports(&shared);
            }
            Answer::NotTaken if self.finishing => {
                // This context is going: no timer will send it again. The rest of the queue
                // goes too: a control plane that is down or hung would fail each batch in
                // turn, one `lifecycle_timeout_ms` after another, and hold the old context
                // that long.
                let rest = self.reports.try_borrow_mut().map_or(0, |mut q| q.clear());
                debug!(
                    "#{} lifecycle batch of {count} not taken ({status:?}) while finishing: \
                     dropped with the {rest} queued behind it",
                    self.context_id
                );
                increment(shared.stats.reports_dropped_total, (count + rest) as i64);
            }
            Answer::NotTaken => {
                // The control plane was stopped, busy or gone: the timer sends it again.
                let dropped = self
                    .reports
                    .try_borrow_mut()
                    .map_or(count, |mut queue| queue.requeue(events));
                debug!(
                    "#{} lifecycle batch of {count} not taken ({status:?}): {} requeued",
                    self.context_id,
                    count - dropped
                );
                increment(
                    shared.stats.reports_requeued_total,
                    (count - dropped) as i64,
                );
                increment(shared.stats.reports_dropped_total, dropped as i64);
            }
            Answer::Refused => {
                debug!(
                    "#{} lifecycle batch of {count} dropped: refused ({status:?})",
                    self.context_id
                );
                increment(shared.stats.reports_dropped_total, count as i64);
            }
        }
    }
}

impl RootContext for SwitchyardRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let raw = self.get_plugin_configuration();
        match Config::parse(raw.as_deref()) {
            Ok(config) => {
                info!(
                    "#{} switchyard filter configured: cluster={} timeout={}ms prefill_cluster={} lifecycle_reports={} tokenize={}",
                    self.context_id,
                    config.control_plane_cluster,
                    config.route_timeout_ms,
                    config.prefill_cluster,
                    config.lifecycle_reports,
                    config.tokenize.as_str()
                );
                if let Ok(mut queue) = self.reports.try_borrow_mut() {
                    queue.set_max(config.lifecycle_queue_max);
                }
                // The timer sends lifecycle reports and hold releases.
                if let Err(status) = hostcalls::set_tick_period(config.lifecycle_flush()) {
                    warn!(
                        "#{} cannot set the tick period: {status:?}",
                        self.context_id
                    );
                }
                self.shared = Some(Rc::new(Shared {
                    config,
                    stats: define_stats(),
                    reports: self.reports.clone(),
                    releases: self.releases.clone(),
                    tokenizers: self.tokenizers.clone(),
                }));
                true
            }
            Err(e) => {
                error!("#{} {e}", self.context_id);
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(shared) = self.shared.clone() {
            self.flush_reports(&shared);
            self.send_releases(&shared);
            if shared.config.tokenize == TokenizeMode::Filter {
                self.fetch_tokenizers(&shared);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Returning `None` would make the SDK panic (abort the VM). Envoy refuses a plugin
        // whose `on_configure` failed, so this is a guard, not a path: pass requests through,
        // still without client routing headers.
        let Some(shared) = self.shared.clone() else {
            return Some(Box::new(Unconfigured));
        };
        Some(Box::new(SwitchyardRequest::new(context_id, shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Request context used only if no configuration was ever accepted: strips and passes.
struct Unconfigured;

impl Context for Unconfigured {}

impl HttpContext for Unconfigured {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let names = self.request_header_names();
        for name in headers_to_strip(names.iter().map(String::as_str)) {
            self.set_http_request_header(&name, None);
        }
        Action::Continue
    }
}
