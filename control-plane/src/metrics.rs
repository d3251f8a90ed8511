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
use prometheus_client::metrics::histogram::{exponential_buckets, linear_buckets, Histogram};
use prometheus_client::registry::Registry;
use switchyard_protocol::route::{Reason, RouteMode};

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

/// A single `model` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ModelLabels {
    /// As in [`ModelRoleLabels::model`].
    pub model: String,
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
    /// (worker, block) pairs held in the KV index.
    pub index_blocks: Gauge,
    /// (worker, block) pairs held in the KV index, by the workers' model.
    pub model_index_blocks: Family<ModelLabels, Gauge>,
    /// Distinct sequence hashes in the KV index.
    pub index_hashes: Gauge,
    /// Approximate heap bytes of the KV index.
    pub index_bytes: Gauge,
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
    /// `health_down`, `scrape_failed`, `kv_malformed`, `kv_gap_replayed`,
    /// `kv_gap_unrecoverable`, `kv_partial_rejoin` (the replay no longer reached back to the
    /// engine's start), `kv_restart`, `kv_refused_event`, `kv_replay_failed`, `block_size_mismatch` (the engine's block
    /// size is not the pool file's).
    pub declared_events: Family<ReasonLabels, Counter>,
    /// Admin API requests refused by the token check, by reason (`missing_token`,
    /// `wrong_token`, `admin_token_not_configured`).
    pub admin_refusals: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            decisions: Family::default(),
            model_decisions: Family::default(),
            // 16 .. 256k tokens.
            eff_isl_tokens: Histogram::new(exponential_buckets(16.0, 2.0, 15)),
            cached_fraction: Histogram::new(linear_buckets(0.1, 0.1, 10)),
            // 50 µs .. ~0.8 s.
            route_latency_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
            bad_requests: Family::default(),
            live_workers: Family::default(),
            model_live_workers: Family::default(),
            workers_expired: Counter::default(),
            workers_rejected: Family::default(),
            stalls: Counter::default(),
            index_blocks: Gauge::default(),
            model_index_blocks: Family::default(),
            index_hashes: Gauge::default(),
            index_bytes: Gauge::default(),
            kv_batches_applied: Counter::default(),
            kv_batches_rejected: Family::default(),
            kv_blocks_stored: Counter::default(),
            kv_blocks_removed: Counter::default(),
            kv_unknown_removals: Counter::default(),
            kv_clears: Counter::default(),
            resync_requests: Family::default(),
            resync_suppressed: Counter::default(),
            bad_messages: Family::default(),
            tokenizer_cache_hits: Counter::default(),
            tokenizer_cache_misses: Counter::default(),
            nats_connected: Gauge::default(),
            pool_reloads: Family::default(),
            declared_events: Family::default(),
            admin_refusals: Family::default(),
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
        for refusal in crate::api::auth::Refusal::ALL {
            let _ = m.admin_refusals.get_or_create(&ReasonLabels {
                reason: refusal.code().to_string(),
            });
        }
        let r = registry.sub_registry_with_prefix("switchyard");
        r.register(
            "route_decisions",
            "Verdicts given, by mode and reason",
            m.decisions.clone(),
        );
        r.register(
            "route_model_decisions",
            "Verdicts given for declared models, by model, mode and reason",
            m.model_decisions.clone(),
        );
        r.register(
            "route_eff_isl_tokens",
            "Prompt tokens the chosen decode worker does not hold (eff_isl)",
            m.eff_isl_tokens.clone(),
        );
        r.register(
            "route_cached_fraction",
            "Fraction of the prompt cached on the chosen decode worker",
            m.cached_fraction.clone(),
        );
        r.register(
            "route_latency_seconds",
            "Route call latency in the control plane (body read to verdict)",
            m.route_latency_seconds.clone(),
        );
        r.register(
            "route_bad_requests",
            "Route requests answered with an error, by code",
            m.bad_requests.clone(),
        );
        r.register(
            "live_workers",
            "Live workers, by role",
            m.live_workers.clone(),
        );
        r.register(
            "model_live_workers",
            "Live workers, by model and role",
            m.model_live_workers.clone(),
        );
        r.register(
            "workers_expired",
            "Workers expired after missing heartbeats",
            m.workers_expired.clone(),
        );
        r.register(
            "workers_rejected",
            "Heartbeats refused, by reason (invalid, unsigned, bad_signature, stale)",
            m.workers_rejected.clone(),
        );
        r.register(
            "stalls",
            "Times the control plane had not run for over a second and granted workers a fresh heartbeat window",
            m.stalls.clone(),
        );
        r.register(
            "index_blocks",
            "(worker, block) pairs held in the KV index",
            m.index_blocks.clone(),
        );
        r.register(
            "model_index_blocks",
            "(worker, block) pairs held in the KV index, by the workers' model",
            m.model_index_blocks.clone(),
        );
        r.register(
            "index_hashes",
            "Distinct sequence hashes in the KV index",
            m.index_hashes.clone(),
        );
        r.register(
            "index_bytes",
            "Approximate heap bytes of the KV index",
            m.index_bytes.clone(),
        );
        r.register(
            "kv_batches_applied",
            "KV event batches applied",
            m.kv_batches_applied.clone(),
        );
        r.register(
            "kv_batches_rejected",
            "KV event batches rejected, by reason",
            m.kv_batches_rejected.clone(),
        );
        r.register(
            "kv_blocks_stored",
            "KV blocks recorded in the index",
            m.kv_blocks_stored.clone(),
        );
        r.register(
            "kv_blocks_removed",
            "KV blocks dropped from the index",
            m.kv_blocks_removed.clone(),
        );
        r.register(
            "kv_unknown_removals",
            "KV removals naming blocks the index did not know",
            m.kv_unknown_removals.clone(),
        );
        r.register(
            "kv_clears",
            "KV cleared events applied (resets and resync dumps)",
            m.kv_clears.clone(),
        );
        r.register(
            "resync_requests",
            "KV resync requests sent to workers, by reason",
            m.resync_requests.clone(),
        );
        r.register(
            "resync_suppressed",
            "KV resync requests suppressed by the per-worker rate limit",
            m.resync_suppressed.clone(),
        );
        r.register(
            "bad_messages",
            "NATS messages that could not be decoded, by kind",
            m.bad_messages.clone(),
        );
        r.register(
            "pool_reloads",
            "Pool-file loads, by result (ok, error: the last good pools stay)",
            m.pool_reloads.clone(),
        );
        r.register(
            "declared_worker_events",
            "Health changes, scrape failures and KV-feed events of declared (pool-file) workers",
            m.declared_events.clone(),
        );
        r.register(
            "admin_refusals",
            "Admin API requests refused by the token check, by reason",
            m.admin_refusals.clone(),
        );
        r.register(
            "tokenizer_cache_hits",
            "Tokenizer segment-cache hits",
            m.tokenizer_cache_hits.clone(),
        );
        r.register(
            "tokenizer_cache_misses",
            "Tokenizer segment-cache misses",
            m.tokenizer_cache_misses.clone(),
        );
        r.register(
            "nats_connected",
            "1 while the control plane is connected to NATS",
            m.nats_connected.clone(),
        );
        m
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
