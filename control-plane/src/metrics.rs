//! Prometheus metrics of the control plane.
//!
//! [`Metrics::register`] runs once at start and returns handles that are cheap to clone
//! (every metric is reference-counted inside); components get the handles, never the
//! registry. [`Metrics::default`] builds the same handles unregistered, so unit tests can
//! drive a component and assert on its counters without a registry.
//!
//! Every metric name starts with `switchyard_`. Labels are small closed sets (modes, verdict
//! reasons, error codes, roles, message kinds), never request or worker ids, so cardinality
//! stays bounded however much traffic arrives.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use switchyard_protocol::lifecycle::LifecycleEvent;
use switchyard_protocol::route::{Reason, RouteMode};
use switchyard_router::core::ResyncReason;

/// Label values of the counters that count by a closed set of causes, created at 0 when the
/// metrics are registered: a dashboard shows 0 rather than "No data" before the first event,
/// and `rate`/`increase` count that first event (a series that appears already at 1 has no
/// earlier sample to rise from). Each list is what `docs/control-plane.md` documents.
mod closed_labels {
    /// `route_bad_requests_total{code}`: the codes of `ApiError`s the API answers.
    pub const BAD_REQUEST_CODES: &[&str] = &[
        "admin_listener",
        "bad_query",
        "bad_request",
        "bad_route_input",
        "body_read",
        "body_read_timeout",
        "body_too_large",
        "config_store_unavailable",
        "config_version_mismatch",
        "invalid_config",
        "invalid_json",
        "invalid_request",
        "invalid_request_id",
        "method_not_allowed",
        "no_workers",
        "not_found",
        "not_the_gateway",
        "prompt_too_long",
        "starting",
        "tokenizer",
        "unavailable",
        "unknown_api",
        "unknown_model",
        "unsupported_type",
        "unsupported_version",
        "whatif_unavailable",
    ];
    /// `workers_rejected_total{reason}`.
    pub const WORKER_REJECTIONS: &[&str] = &[
        "unsigned",
        "bad_signature",
        "stale",
        "invalid",
        "declared",
        "address_in_use",
        "id_in_use",
        "engine_mismatch",
    ];
    /// `kv_batches_rejected_total{reason}`: `KvEventError`'s variants.
    pub const KV_REJECTIONS: &[&str] = &[
        "unknown_worker",
        "block_size_mismatch",
        "other_instance",
        "stale",
    ];
    /// `bad_messages_total{kind}`: the NATS message families.
    pub const BAD_MESSAGE_KINDS: &[&str] = &[
        "heartbeat",
        "load",
        "kv_events",
        "shared_config",
        "replica_sync",
    ];
    /// `replica_updates_total{reason}`.
    pub const REPLICA_UPDATES: &[&str] =
        &["sent", "applied", "rejected", "dropped", "duplicate_id"];
    /// `pool_reloads_total{reason}`.
    pub const POOL_RELOADS: &[&str] = &["ok", "error"];
    /// `declared_worker_events_total{reason}`.
    pub const DECLARED_EVENTS: &[&str] = &[
        "health_up",
        "health_down",
        "never_healthy",
        "scrape_failed",
        "model_mismatch",
        "block_size_mismatch",
        "kv_unreachable",
        "kv_reconnected",
        "kv_poll_failed",
        "kv_malformed",
        "kv_gap_replayed",
        "kv_gap_unrecoverable",
        "kv_partial_rejoin",
        "kv_restart",
        "kv_refused_event",
        "kv_replay_failed",
        "kv_over_capacity_rejoin",
        "kv_other_window",
    ];
}

/// `cached_fraction`'s bucket bounds.
const CACHED_FRACTION_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Labels of a routing decision.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]

pub struct DecisionLabels {
    /// `bypass`, `disagg` or `agg`.
    pub mode: &'static str,
    /// The verdict's reason, e.g. `bypass:isl_bounding`.
    pub reason: &'static str,
}

impl DecisionLabels {
    /// The labels of one verdict.
    pub fn of(mode: RouteMode, reason: Reason) -> Self {
        DecisionLabels {
            mode: mode.as_str(),
            reason: reason.as_str(),
        }
    }
}

/// A single `reason` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: String,
}

/// A single `event` label (a lifecycle report's kind).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `first_token`, `done`, or `failed_open` (a `done` the filter sent when it failed the
    /// request open).
    pub event: String,
}

/// A single `code` label (the `ApiError::code` of a rejected request).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The error code.
    pub code: String,
}

/// A single `kind` label (which NATS message family).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `heartbeat`, `load` or `kv_events`.
    pub kind: String,
}

/// Labels of a routing decision for one declared model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelDecisionLabels {
    /// The declared model (never a name a client made up: unknown models get no verdict).
    pub model: String,
    /// `bypass`, `disagg` or `agg`.
    pub mode: &'static str,
    /// The verdict's reason, e.g. `bypass:isl_bounding`.
    pub reason: &'static str,
}

/// Labels of a per-model worker gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ModelRoleLabels {
    /// The model a worker was declared or registered with (bounded by the live workers:
    /// declared ones come from the pool file, registered ones are signed).
    pub model: String,
    /// `prefill`, `decode` or `agg`.
    pub role: &'static str,
}

/// Labels of a per-worker gauge (bounded by the live workers: a worker that leaves loses its
/// series).
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WorkerLabels {
    /// The worker's id.
    pub worker: String,
    /// `prefill`, `decode` or `agg`.
    pub role: &'static str,
    /// Its model.
    pub model: String,
}

/// A single `model` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ModelLabels {
    /// As in [`ModelRoleLabels::model`].
    pub model: String,
}

/// Labels of [`Metrics::slo_cost_learned_scale`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartLabels {
    /// `prefill` or `decode`.
    pub part: &'static str,
}

/// A single `role` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// `prefill`, `decode` or `agg`.
    pub role: String,
}

/// All metric handles. Clone freely; clones share the underlying values.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Verdicts given, by mode and reason.
    pub decisions: Family<DecisionLabels, Counter>,
    /// Verdicts given for declared models, by model, mode and reason (bounded by the pool
    /// file's models: only a declared model gets a verdict).
    pub model_decisions: Family<ModelDecisionLabels, Counter>,
    /// Effective input length (tokens the decode worker would prefill) of each verdict.
    pub eff_isl_tokens: Histogram,
    /// Fraction of the prompt already cached on the chosen decode worker.
    pub cached_fraction: Histogram,
    /// Route call latency inside the service (body read to verdict), seconds.
    pub route_latency_seconds: Histogram,
    /// Dry-run route calls answered (`?dry_run=true`): verdicts shown, not decided.
    pub route_dry_runs: Counter,
    /// Route requests that got no verdict, by error code (`invalid_json`, `no_workers`, ...).
    pub bad_requests: Family<CodeLabels, Counter>,
    /// Live workers, by role.
    pub live_workers: Family<RoleLabels, Gauge>,
    /// Live workers, by model and role.
    pub model_live_workers: Family<ModelRoleLabels, Gauge>,
    /// Workers expired because their heartbeats stopped.
    pub workers_expired: Counter,
    /// Heartbeats refused, by reason: `invalid` (block size, too many workers), `unsigned`,
    /// `bad_signature`, `stale` (a signature too far from this host's clock).
    pub workers_rejected: Family<ReasonLabels, Counter>,
    /// Times the control plane found it had not run for a while (stopped, starved) and gave
    /// every worker a fresh heartbeat window.
    pub stalls: Counter,
    /// NATS messages the client dropped because a subscription's buffer was full
    /// (`switchyard_bus::slow_consumer_events`).
    pub nats_dropped_messages: Counter,
    /// (worker, block) pairs held in the KV index.
    pub index_blocks: Gauge,
    /// (worker, block) pairs held in the KV index, by the workers' model.
    pub model_index_blocks: Family<ModelLabels, Gauge>,
    /// Distinct sequence hashes in the KV index.
    pub index_hashes: Gauge,
    /// Approximate heap bytes of the KV index.
    pub index_bytes: Gauge,
    /// Entries of the KV index's hash table (the heads of stored chains, or every hash once
    /// an engine's event did not name its parent's engine id).
    pub index_table_hashes: Gauge,
    /// 1 once the KV index keeps every hash in its table (see `index_table_hashes`).
    pub index_every_hash: Gauge,
    /// `slo_cost`'s learned correction factors on its timing model (1 = the configured
    /// coefficients), by `part` (`prefill`, `decode`).
    pub slo_cost_learned_scale: Family<PartLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// KV event batches applied.
    pub kv_batches_applied: Counter,
    /// KV event batches rejected, by reason (`unknown_worker`, `stale`, ...).
    pub kv_batches_rejected: Family<ReasonLabels, Counter>,
    /// KV blocks recorded in the index (from `stored` events).
    pub kv_blocks_stored: Counter,
    /// KV blocks dropped from the index (`removed` events, evictions on re-store).
    pub kv_blocks_removed: Counter,
    /// `removed` events naming blocks the index did not know (a sign of missed events).
    pub kv_unknown_removals: Counter,
    /// `cleared` events applied (cache resets and resync dumps).
    pub kv_clears: Counter,
    /// Times a worker's blocks were dropped from the index for passing twice its capacity.
    pub kv_over_capacity_drops: Counter,
    /// Lifecycle events received, by kind.
    pub lifecycle_events: Family<EventLabels, Counter>,
    /// Route calls that came after the filter had failed their request open (they waited in
    /// this process's socket): answered, not counted as load.
    pub late_route_calls: Counter,
    /// Requests released from the in-flight counts because their workers' reports stopped
    /// showing them (their `done` was lost).
    pub stale_in_flight_released: Counter,
    /// Load reports ignored because another process than the registered one sent them under
    /// its worker id.
    pub load_reports_ignored: Counter,
    /// Resync requests published to workers, by reason (`new_worker`, `restarted`, `gap`).
    pub resync_requests: Family<ReasonLabels, Counter>,
    /// Resync requests suppressed by the per-worker rate limit.
    pub resync_suppressed: Counter,
    /// NATS messages that could not be decoded, by kind.
    pub bad_messages: Family<KindLabels, Counter>,
    /// Tokenizer segment-cache hits (earlier turns of a conversation tokenized before).
    pub tokenizer_cache_hits: Counter,
    /// Tokenizer segment-cache misses.
    pub tokenizer_cache_misses: Counter,
    /// 1 while connected to NATS, 0 otherwise (updated when scraped).
    pub nats_connected: Gauge,
    /// Pool-file loads, by result (`ok`, `error`: the last good pools stay).
    pub pool_reloads: Family<ReasonLabels, Counter>,
    /// What happened with declared (pool-file) workers, by event: `health_up`,
    /// `health_down`, `scrape_failed`, `kv_unreachable` (healthy, but nothing listens at its
    /// KV event endpoint), `kv_reconnected`, `kv_poll_failed`, `kv_malformed`, `kv_gap_replayed`,
    /// `kv_gap_unrecoverable`, `kv_partial_rejoin` (the replay no longer reached back to the
    /// engine's start), `kv_restart`, `kv_refused_event`, `kv_replay_failed`,
    /// `kv_over_capacity_rejoin` (the router dropped its blocks for passing its capacity, and
    /// the feed started over), `model_mismatch` (the engine's metrics name another served
    /// model than the pool file's), `never_healthy` (a declared worker that has failed
    /// `unhealthy_after` health polls without ever answering one), `kv_other_window`
    /// (TensorRT-LLM events of an attention window
    /// shorter than its largest, not indexed), `block_size_mismatch` (the engine's block size is not the pool
    /// file's).
    pub declared_events: Family<ReasonLabels, Counter>,
    /// Per live worker: requests the router believes in flight on it.
    pub worker_in_flight: Family<WorkerLabels, Gauge>,
    /// Per live worker: active KV blocks (its last load report, corrected by the router's
    /// own accounting since).
    pub worker_active_blocks: Family<WorkerLabels, Gauge>,
    /// Per live worker: prompt tokens queued or being prefilled.
    pub worker_prefill_tokens: Family<WorkerLabels, Gauge>,
    /// Per live worker: distinct KV blocks the index holds for it.
    pub worker_cached_blocks: Family<WorkerLabels, Gauge>,
    /// Admin API requests refused by the token check, by reason (`missing_token`,
    /// `wrong_token`, `admin_token_not_configured`).
    pub admin_refusals: Family<ReasonLabels, Counter>,
    /// Updates exchanged with other control-plane replicas, by result (`sent`, `applied`,
    /// `rejected`: naming a worker unknown here, `dropped`: not sent, the queue was full or
    /// NATS refused).
    pub replica_updates: Family<ReasonLabels, Counter>,
    /// How old another replica's update was when it was applied here (sender's clock to
    /// this one's): how stale this replica's view of the others' load is.
    pub replica_sync_lag_seconds: Histogram,
    /// The version of the router config in force: the shared config's NATS KV revision with
    /// `--replica-id`, else the count of this process's changes (the `ETag` of
    /// `/v1/config`).
    pub config_version: Gauge,
    /// 1 once this replica reports ready (`/readyz`).
    pub ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            decisions: Family::default(),
            model_decisions: Family::default(),
            // 16 .. 256k tokens.
            eff_isl_tokens: Histogram::new(exponential_buckets(16.0, 2.0, 15)),
            // Written out: summed in floating point, 0.3 and 0.7 became 0.30000000000000007
            // and 0.7000000000000001, and a query on `le="0.3"` matched nothing.
            cached_fraction: Histogram::new(CACHED_FRACTION_BUCKETS),
            // 50 µs .. ~0.8 s.
            route_latency_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
            route_dry_runs: Counter::default(),
            bad_requests: Family::default(),
            live_workers: Family::default(),
            model_live_workers: Family::default(),
            workers_expired: Counter::default(),
            workers_rejected: Family::default(),
            stalls: Counter::default(),
            nats_dropped_messages: Counter::default(),
            index_blocks: Gauge::default(),
            model_index_blocks: Family::default(),
            index_hashes: Gauge::default(),
            index_bytes: Gauge::default(),
            index_table_hashes: Gauge::default(),
            index_every_hash: Gauge::default(),
            slo_cost_learned_scale: Family::default(),
            kv_batches_applied: Counter::default(),
            kv_batches_rejected: Family::default(),
            kv_blocks_stored: Counter::default(),
            kv_blocks_removed: Counter::default(),
            kv_unknown_removals: Counter::default(),
            kv_over_capacity_drops: Counter::default(),
            kv_clears: Counter::default(),
            lifecycle_events: Family::default(),
            late_route_calls: Counter::default(),
            stale_in_flight_released: Counter::default(),
            load_reports_ignored: Counter::default(),
            resync_requests: Family::default(),
            resync_suppressed: Counter::default(),
            bad_messages: Family::default(),
            tokenizer_cache_hits: Counter::default(),
            tokenizer_cache_misses: Counter::default(),
            nats_connected: Gauge::default(),
            pool_reloads: Family::default(),
            declared_events: Family::default(),
            worker_in_flight: Family::default(),
            worker_active_blocks: Family::default(),
            worker_prefill_tokens: Family::default(),
            worker_cached_blocks: Family::default(),
            admin_refusals: Family::default(),
            replica_updates: Family::default(),
            // 100 µs .. ~3 s.
            // The lag is whole milliseconds (the update's send time is): the first bucket
            // holds the zeros, the next ones 1, 2, 4 ms and on to 4 s.
            replica_sync_lag_seconds: Histogram::new(exponential_buckets(0.000_5, 2.0, 14)),
            config_version: Gauge::default(),
            ready: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Creates the handles and registers them under the `switchyard_` prefix. Call once.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        // Every verdict reason appears from the start (at 0), so dashboards and alerts see
        // the full label set before traffic arrives.
        for reason in Reason::ALL {
            if let Some(mode) = reason.mode() {
                let _ = m.decisions.get_or_create(&DecisionLabels::of(mode, reason));
            }
        }
        for event in LifecycleEvent::KINDS {
            let _ = m.lifecycle_events.get_or_create(&EventLabels {
                event: event.to_string(),
            });
        }
        // Likewise every documented cause of the counters below.
        let reasons = |family: &Family<ReasonLabels, Counter>, values: &[&str]| {
            for value in values {
                let _ = family.get_or_create(&ReasonLabels {
                    reason: value.to_string(),
                });
            }
        };
        let refusals: Vec<&str> = crate::api::auth::Refusal::ALL
            .iter()
            .map(|r| r.code())
            .collect();
        reasons(&m.admin_refusals, &refusals);
        reasons(&m.workers_rejected, closed_labels::WORKER_REJECTIONS);
        reasons(&m.kv_batches_rejected, closed_labels::KV_REJECTIONS);
        reasons(&m.replica_updates, closed_labels::REPLICA_UPDATES);
        reasons(&m.pool_reloads, closed_labels::POOL_RELOADS);
        reasons(&m.declared_events, closed_labels::DECLARED_EVENTS);
        let resyncs: Vec<&str> = ResyncReason::ALL.iter().map(|r| r.as_str()).collect();
        reasons(&m.resync_requests, &resyncs);
        for code in closed_labels::BAD_REQUEST_CODES {
            let _ = m.bad_requests.get_or_create(&CodeLabels {
                code: code.to_string(),
            });
        }
        for kind in closed_labels::BAD_MESSAGE_KINDS {
            let _ = m.bad_messages.get_or_create(&KindLabels {
                kind: kind.to_string(),
            });
        }
        let mut r = Registrar {
            registry: registry.sub_registry_with_prefix("switchyard"),
            families: Vec::new(),
        };
        m.add_all(&mut r);
        m
    }

    fn add_all(&self, r: &mut Registrar<'_>) {
        r.add(
            "route_decisions",
            "Verdicts given, by mode and reason",
            self.decisions.clone(),
        );
        r.add(
            "route_model_decisions",
            "Verdicts given for declared models, by model, mode and reason",
            self.model_decisions.clone(),
        );
        r.add(
            "route_eff_isl_tokens",
            "Prompt tokens the chosen decode worker does not hold (eff_isl)",
            self.eff_isl_tokens.clone(),
        );
        r.add(
            "route_cached_fraction",
            "Fraction of the prompt cached on the chosen decode worker",
            self.cached_fraction.clone(),
        );
        r.add(
            "route_latency_seconds",
            "Route call latency in the control plane (body read to verdict)",
            self.route_latency_seconds.clone(),
        );
        r.add(
            "route_dry_runs",
            "Dry-run route calls answered: verdicts shown, nothing booked or counted as a decision",
            self.route_dry_runs.clone(),
        );
        r.add(
            "route_bad_requests",
            "Route requests answered with an error, by code",
            self.bad_requests.clone(),
        );
        r.add(
            "live_workers",
            "Live workers, by role",
            self.live_workers.clone(),
        );
        r.add(
            "model_live_workers",
            "Live workers, by model and role",
            self.model_live_workers.clone(),
        );
        r.add(
            "workers_expired",
            "Workers expired after missing heartbeats",
            self.workers_expired.clone(),
        );
        r.add(
            "workers_rejected",
            "Heartbeats refused, by reason (invalid, unsigned, bad_signature, stale, declared, address_in_use, id_in_use, engine_mismatch)",
            self.workers_rejected.clone(),
        );
        r.add(
            "stalls",
            "Times the control plane had not run for over a second and granted workers a fresh heartbeat window",
            self.stalls.clone(),
        );
        r.add(
            "index_blocks",
            "(worker, block) pairs held in the KV index",
            self.index_blocks.clone(),
        );
        r.add(
            "model_index_blocks",
            "(worker, block) pairs held in the KV index, by the workers' model",
            self.model_index_blocks.clone(),
        );
        r.add(
            "index_hashes",
            "Distinct sequence hashes in the KV index",
            self.index_hashes.clone(),
        );
        r.add(
            "index_bytes",
            "Approximate heap bytes of the KV index",
            self.index_bytes.clone(),
        );
        r.add(
            "index_table_hashes",
            "Entries of the KV index's hash table: stored chains' heads, or every hash",
            self.index_table_hashes.clone(),
        );
        r.add(
            "index_every_hash",
            "1 once the KV index keeps every hash (an event without its parent's engine id)",
            self.index_every_hash.clone(),
        );
        r.add(
            "slo_cost_learned_scale",
            "slo_cost's learned correction factor on its timing model (1: as configured)",
            self.slo_cost_learned_scale.clone(),
        );
        r.add(
            "kv_batches_applied",
            "KV event batches applied",
            self.kv_batches_applied.clone(),
        );
        r.add(
            "kv_batches_rejected",
            "KV event batches rejected, by reason",
            self.kv_batches_rejected.clone(),
        );
        r.add(
            "kv_blocks_stored",
            "KV blocks recorded in the index",
            self.kv_blocks_stored.clone(),
        );
        r.add(
            "kv_blocks_removed",
            "KV blocks dropped from the index",
            self.kv_blocks_removed.clone(),
        );
        r.add(
            "kv_unknown_removals",
            "KV removals naming blocks the index did not know",
            self.kv_unknown_removals.clone(),
        );
        r.add(
            "kv_over_capacity_drops",
            "Times a worker's KV blocks were all dropped from the index for passing twice its cache capacity (missed removals, or a publisher that is not its engine; a resync follows)",
            self.kv_over_capacity_drops.clone(),
        );
        r.add(
            "kv_clears",
            "KV cleared events applied (resets and resync dumps)",
            self.kv_clears.clone(),
        );
        r.add(
            "lifecycle_events",
            "Lifecycle events received from the filter, by kind",
            self.lifecycle_events.clone(),
        );
        r.add(
            "late_route_calls",
            "Route calls that came after the filter had failed their request open; not counted as load",
            self.late_route_calls.clone(),
        );
        r.add(
            "stale_in_flight_released",
            "Requests released from the in-flight counts because every report of their worker for load.stale_in_flight_ms showed fewer requests (their done report was lost)",
            self.stale_in_flight_released.clone(),
        );
        r.add(
            "load_reports_ignored",
            "Load reports ignored because another process than the registered one sent them under its worker id",
            self.load_reports_ignored.clone(),
        );
        r.add(
            "resync_requests",
            "KV resync requests sent to workers, by reason",
            self.resync_requests.clone(),
        );
        r.add(
            "resync_suppressed",
            "KV resync requests suppressed by the per-worker rate limit",
            self.resync_suppressed.clone(),
        );
        r.add(
            "bad_messages",
            "NATS messages that could not be decoded, by kind",
            self.bad_messages.clone(),
        );
        r.add(
            "pool_reloads",
            "Pool-file loads, by result (ok, error: the last good pools stay)",
            self.pool_reloads.clone(),
        );
        r.add(
            "declared_worker_events",
            "Health changes, scrape failures and KV-feed events of declared (pool-file) workers",
            self.declared_events.clone(),
        );
        r.add(
            "worker_in_flight",
            "Requests the router believes in flight, per live worker",
            self.worker_in_flight.clone(),
        );
        r.add(
            "worker_active_blocks",
            "Active KV blocks (last load report plus the router's accounting), per live worker",
            self.worker_active_blocks.clone(),
        );
        r.add(
            "worker_prefill_tokens",
            "Prompt tokens queued or being prefilled, per live worker",
            self.worker_prefill_tokens.clone(),
        );
        r.add(
            "worker_cached_blocks",
            "KV blocks the index holds, per live worker",
            self.worker_cached_blocks.clone(),
        );
        r.add(
            "admin_refusals",
            "Admin API requests refused by the token check, by reason",
            self.admin_refusals.clone(),
        );
        r.add(
            "replica_updates",
            "Updates exchanged with other control-plane replicas, by result",
            self.replica_updates.clone(),
        );
        r.add(
            "replica_sync_lag_seconds",
            "Age of another replica's update when applied here",
            self.replica_sync_lag_seconds.clone(),
        );
        r.add(
            "config_version",
            "Version of the router config in force (the ETag of /v1/config): the shared NATS KV revision, or this process's change count",
            self.config_version.clone(),
        );
        r.add(
            "ready",
            "1 once this replica reports ready (/readyz)",
            self.ready.clone(),
        );
        r.add(
            "tokenizer_cache_hits",
            "Tokenizer segment-cache hits",
            self.tokenizer_cache_hits.clone(),
        );
        r.add(
            "tokenizer_cache_misses",
            "Tokenizer segment-cache misses",
            self.tokenizer_cache_misses.clone(),
        );
        r.add(
            "nats_dropped_messages",
            "NATS messages the client dropped undelivered because a subscription's buffer was full (the consumer fell behind; KV gaps are resynced)",
            self.nats_dropped_messages.clone(),
        );
        r.add(
            "nats_connected",
            "1 while the control plane is connected to NATS",
            self.nats_connected.clone(),
        );
    }

    /// The name of every sample the control plane can export (`switchyard_…`, with `_total`
    /// for counters and `_bucket`/`_sum`/`_count` for histograms), whether or not a series
    /// exists yet: `/metrics` leaves out a family no label set has touched, so a dashboard is
    /// checked against this list (and a scrape) rather than a scrape alone.
    pub fn exported_names() -> Vec<String> {
        let mut registry = Registry::default();
        let mut r = Registrar {
            registry: registry.sub_registry_with_prefix("switchyard"),
            families: Vec::new(),
        };
        Metrics::default().add_all(&mut r);
        r.families
    }

    /// Counts lifecycle events received, by kind.
    pub fn lifecycle_events(&self, events: &[LifecycleEvent]) {
        for event in events {
            self.lifecycle_events
                .get_or_create(&EventLabels {
                    event: event.kind().to_string(),
                })
                .inc();
        }
    }

    /// Counts a rejected route request.
    pub fn bad_request(&self, code: &str) {
        self.bad_requests
            .get_or_create(&CodeLabels {
                code: code.to_string(),
            })
            .inc();
    }

    /// Counts an admin request the token check refused.
    pub fn admin_refused(&self, refusal: crate::api::auth::Refusal) {
        self.admin_refusals
            .get_or_create(&ReasonLabels {
                reason: refusal.code().to_string(),
            })
            .inc();
    }

    /// Counts a refused heartbeat.
    pub fn worker_rejected(&self, reason: &str) {
        self.workers_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts `n` events of declared workers (see [`Metrics::declared_events`]).
    pub fn declared_event(&self, event: &str, n: u64) {
        if n > 0 {
            self.declared_events
                .get_or_create(&ReasonLabels {
                    reason: event.to_string(),
                })
                .inc_by(n);
        }
    }

    /// Counts an undecodable NATS message.
    pub fn bad_message(&self, kind: &str) {
        self.bad_messages
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts replica updates by result (see [`Metrics::replica_updates`]).
    pub fn replica_update(&self, result: &str) {
        self.replica_updates
            .get_or_create(&ReasonLabels {
                reason: result.to_string(),
            })
            .inc();
    }

    /// Counts a resync request sent.
    pub fn resync_sent(&self, reason: &str) {
        self.resync_requests
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a rejected KV batch.
    pub fn kv_rejected(&self, reason: &str) {
        self.kv_batches_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Current value of a labelled counter, for tests and logs.
    pub fn count<L>(family: &Family<L, Counter>, labels: &L) -> u64
    where
        L: Clone + std::hash::Hash + Eq,
    {
        family.get(labels).map(|c| c.get()).unwrap_or(0)
    }
}

/// Sets `family` to exactly `values`: label sets `seen` before and absent now are removed (a
/// model whose workers all left has no series), so the family holds only what is live.
pub fn set_gauges<L>(family: &Family<L, Gauge>, seen: &mut BTreeSet<L>, values: BTreeMap<L, i64>)
where
    L: Clone + std::hash::Hash + Eq + Ord,
{
    for gone in seen.iter().filter(|labels| !values.contains_key(labels)) {
        family.remove(gone);
    }
    seen.clear();
    for (labels, value) in values {
        family.get_or_create(&labels).set(value);
        seen.insert(labels);
    }
}

/// Registers metric families and remembers the sample names each one exports.
struct Registrar<'a> {
    registry: &'a mut Registry,
    families: Vec<String>,
}

impl Registrar<'_> {
    fn add<M>(&mut self, name: &str, help: &str, metric: M)
    where
        M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric,
    {
        let base = format!("switchyard_{name}");
        let suffixes: &[&str] = match M::TYPE {
            prometheus_client::metrics::MetricType::Counter => &["_total"],
            prometheus_client::metrics::MetricType::Histogram => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        self.families
            .extend(suffixes.iter().map(|suffix| format!("{base}{suffix}")));
        self.registry.register(name, help, metric);
    }
}

/// One live worker's gauge values, in the order of [`Metrics::set_worker_gauges`]'s families.
pub type WorkerGaugeValues = [i64; 4];

impl Metrics {
    /// Sets the per-worker gauges to `values` and removes the series of workers no longer in
    /// it (`seen` remembers which were set last time).
    pub fn set_worker_gauges(
        &self,
        seen: &mut BTreeSet<WorkerLabels>,
        values: BTreeMap<WorkerLabels, WorkerGaugeValues>,
    ) {
        let families = [
            &self.worker_in_flight,
            &self.worker_active_blocks,
            &self.worker_prefill_tokens,
            &self.worker_cached_blocks,
        ];
        for gone in seen.iter().filter(|labels| !values.contains_key(labels)) {
            for family in families {
                family.remove(gone);
            }
        }
        for (labels, gauges) in &values {
            for (family, value) in families.iter().zip(gauges) {
                family.get_or_create(labels).set(*value);
            }
        }
        *seen = values.into_keys().collect();
    }
}

/// Metric label for an error value: its variant name in snake case (`UnknownWorker` ->
/// `unknown_worker`). Derived from `Debug` so new variants get a label without code here.
pub fn variant_label<E: std::fmt::Debug>(error: &E) -> String {
    let debug = format!("{error:?}");
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let mut label = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                label.push('_');
            }
            label.push(c.to_ascii_lowercase());
        } else {
            label.push(c);
        }
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_router::KvEventError;

    #[test]
    fn registered_metrics_appear_in_the_text_exposition() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.bad_message("heartbeat");
        m.bad_request("invalid_json");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("switchyard_bad_messages_total{kind=\"heartbeat\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_route_bad_requests_total{code=\"invalid_json\"} 1"),
            "{text}"
        );
    }

    /// The error-code tables of docs/control-plane.md (`| status | `code` | ...`) list
    /// codes the route counter pre-creates (or the admin token's refusals, counted apart).
    #[test]
    fn every_error_code_in_the_docs_tables_is_pre_created() {
        let docs = include_str!("../../docs/control-plane.md");
        let refusals = ["missing_token", "wrong_token", "admin_token_not_configured"];
        let mut seen = 0;
        for line in docs.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let (Some(status), Some(code)) = (cells.get(1), cells.get(2)) else {
                continue;
            };
            if !(status.len() == 3 && status.starts_with(['4', '5'])) {
                continue;
            }
            let Some(code) = code.strip_prefix('`').and_then(|c| c.split('`').next()) else {
                continue;
            };
            seen += 1;
            assert!(
                closed_labels::BAD_REQUEST_CODES.contains(&code) || refusals.contains(&code),
                "{code} is documented but not pre-created"
            );
        }
        assert!(seen > 20, "the tables were found: {seen} rows");
    }

    #[test]
    fn every_documented_cause_has_a_series_at_zero_before_the_first_event() {
        let mut registry = Registry::default();
        let _m = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let families: [(&str, &str, &[&str]); 7] = [
            (
                "route_bad_requests_total",
                "code",
                closed_labels::BAD_REQUEST_CODES,
            ),
            (
                "workers_rejected_total",
                "reason",
                closed_labels::WORKER_REJECTIONS,
            ),
            (
                "kv_batches_rejected_total",
                "reason",
                closed_labels::KV_REJECTIONS,
            ),
            (
                "bad_messages_total",
                "kind",
                closed_labels::BAD_MESSAGE_KINDS,
            ),
            (
                "replica_updates_total",
                "reason",
                closed_labels::REPLICA_UPDATES,
            ),
            ("pool_reloads_total", "reason", closed_labels::POOL_RELOADS),
            (
                "declared_worker_events_total",
                "reason",
                closed_labels::DECLARED_EVENTS,
            ),
        ];
        for (family, label, values) in families {
            for value in values {
                let line = format!("switchyard_{family}{{{label}=\"{value}\"}} 0");
                assert!(text.contains(&line), "no `{line}` in\n{text}");
            }
        }
        for reason in ResyncReason::ALL {
            let line = format!(
                "switchyard_resync_requests_total{{reason=\"{}\"}} 0",
                reason.as_str()
            );
            assert!(text.contains(&line), "no `{line}`");
        }
    }

    #[test]
    fn every_kv_rejection_is_among_the_pre_created_labels() {
        let worker = switchyard_protocol::worker::WorkerId("w".into());
        let errors = [
            KvEventError::UnknownWorker(worker.clone()),
            KvEventError::BlockSizeMismatch {
                worker: worker.clone(),
                got: 16,
                registered: 32,
            },
            KvEventError::OtherInstance {
                worker: worker.clone(),
                got: 2,
                registered: 1,
            },
            KvEventError::Stale {
                worker,
                seq: 1,
                applied: 2,
            },
        ];
        for error in &errors {
            // A new variant fails to compile here until it is listed.
            match error {
                KvEventError::UnknownWorker(_)
                | KvEventError::BlockSizeMismatch { .. }
                | KvEventError::OtherInstance { .. }
                | KvEventError::Stale { .. } => {}
            }
            assert!(closed_labels::KV_REJECTIONS.contains(&variant_label(error).as_str()));
        }
    }

    #[test]
    fn cached_fraction_buckets_are_labelled_as_written() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.cached_fraction.observe(0.3);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let les: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("switchyard_route_cached_fraction_bucket"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            les,
            ["0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0", "+Inf"]
        );
    }

    #[test]
    fn exported_names_are_the_sample_names_of_every_registered_family() {
        let names = Metrics::exported_names();
        let unique: BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "no name twice: {names:?}");
        for name in [
            "switchyard_route_decisions_total",
            "switchyard_route_latency_seconds_bucket",
            "switchyard_route_latency_seconds_count",
            "switchyard_index_blocks",
            "switchyard_worker_in_flight",
            "switchyard_pool_reloads_total",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        // What a full exposition shows is in the list (every family touched once).
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.bad_message("heartbeat");
        m.bad_request("invalid_json");
        m.declared_event("health_up", 1);
        m.worker_rejected("unsigned");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = &line[..line.find(['{', ' ']).unwrap_or(line.len())];
            assert!(names.iter().any(|n| n == name), "{name} not listed");
        }
    }

    #[test]
    fn variant_labels_are_snake_case_variant_names() {
        #[derive(Debug)]
        #[allow(dead_code)]
        enum E {
            UnknownWorker(String),
            BlockSizeMismatch { got: u32 },
            Stale,
        }
        assert_eq!(
            variant_label(&E::UnknownWorker("x".into())),
            "unknown_worker"
        );
        assert_eq!(
            variant_label(&E::BlockSizeMismatch { got: 1 }),
            "block_size_mismatch"
        );
        assert_eq!(variant_label(&E::Stale), "stale");
    }
}
