//! What a virtual run is given (the deployment and router settings) and what it returns.

use serde::Serialize;
use switchyard_protocol::worker::WorkerRole;
use switchyard_router::config::{RouterConfig, ServingMode};

use super::gateway::GatewayModel;
use super::tracker::RouteNote;
use super::ReplayError;
use switchyard_engine::PerfPreset;
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::ArrivalScale;

/// One virtual deployment: how many workers of which kind, and how the router is set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StackSpec {
    /// Agg, disagg or conditional (overrides `router.serving_mode`).
    pub mode: ServingMode,
    /// Workers in all (each one a 4-GPU GB200 node with the default preset).
    pub workers: u32,
    /// Of those, prefill workers in disagg and conditional mode (ignored for agg).
    pub prefill_workers: u32,
    /// Performance preset of every worker.
    pub preset: PerfPreset,
    /// Router configuration (thresholds, selection weights, load timeouts).
    pub router: RouterConfig,
    /// Router RNG seed (tie-breaking).
    pub seed: u64,
    /// Multiplies arrival and think times (0.5 = twice the planned rate), as the load
    /// generator's `--arrival-scale`.
    pub arrival_scale: ArrivalScale,
    /// Interval between load reports, virtual ms (the simulated worker's default: 500).
    pub load_interval_ms: u64,
    /// CPU time between a client's send and the request reaching its first engine (the
    /// real stack's tokenizations); [`GatewayModel::FREE`] by default.
    pub gateway: GatewayModel,
    /// The model's context length, as the real control plane and workers enforce it: a
    /// prompt that leaves no room for a generated token is refused (400), and a request's
    /// output is cut to what the context leaves (default: the simulated model's, as the
    /// local stack's).
    pub max_model_len: u32,
    /// Send times measured on a real run, virtual ms by request id, replacing the planned
    /// arrival (× `arrival_scale`) of every request without dependencies; a missing or
    /// non-finite entry keeps the planned one. The cross-check sets it so both sides see the
    /// same arrival process, down to the order the real client sent a burst's requests
    /// within one millisecond. `None` (the default): planned arrivals.
    #[serde(skip)]
    pub sent_ms: Option<Vec<f64>>,
}

impl StackSpec {
    /// `workers` workers in `mode`, `prefill_workers` of them prefill (non-agg modes), the
    /// default preset and router config, load reports every 500 ms, planned arrival rate.
    pub fn new(mode: ServingMode, workers: u32, prefill_workers: u32) -> Self {
        StackSpec {
            mode,
            workers,
            prefill_workers,
            preset: PerfPreset::Gb200Fp8Tep4,
            router: RouterConfig::default(),
            seed: 0,
            arrival_scale: ArrivalScale::PLANNED,
            load_interval_ms: switchyard_engine::DEFAULT_LOAD_INTERVAL_MS,
            gateway: GatewayModel::FREE,
            max_model_len: switchyard_engine::DEFAULT_MAX_MODEL_LEN,
            sent_ms: None,
        }
    }

    /// The role of each worker, prefill workers first.
    ///
    /// # Errors
    /// [`ReplayError::InvalidSetup`] without workers, or without both prefill and decode
    /// workers in disagg and conditional mode.
    pub fn roles(&self) -> Result<Vec<WorkerRole>, ReplayError> {
        let bad = |m: String| Err(ReplayError::InvalidSetup(m));
        if self.workers == 0 {
            return bad("at least one worker is needed".into());
        }
        if self.mode == ServingMode::Agg {
            return Ok(vec![WorkerRole::Agg; self.workers as usize]);
        }
        if self.prefill_workers == 0 || self.prefill_workers >= self.workers {
            return bad(format!(
                "{} mode needs 1 to {} prefill workers out of {}, got {}",
                self.mode.as_str(),
                self.workers.saturating_sub(1),
                self.workers,
                self.prefill_workers
            ));
        }
        let p = self.prefill_workers as usize;
        let d = (self.workers - self.prefill_workers) as usize;
        Ok([vec![WorkerRole::Prefill; p], vec![WorkerRole::Decode; d]].concat())
    }

    /// GPUs in the deployment (for throughput per GPU).
    pub fn gpus(&self) -> u32 {
        self.workers * self.preset.gpus_per_worker()
    }
}

/// Most workers one virtual-time run simulates: each holds its engine's KV block table (about
/// 5 MB at the default preset), and a plan runs one deployment per thread. A cap a user can
/// read beats a machine out of memory.
pub const MAX_VIRTUAL_WORKERS: u32 = 512;

/// Counts of what happened in a run, beyond the records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReplayCounters {
    /// KV event batches applied to the router.
    pub kv_batches: u64,
    /// Batches the router rejected or asked a resync for (should stay 0: nothing is lost).
    pub kv_batch_problems: u64,
    /// Load reports applied.
    pub load_reports: u64,
    /// Resync dumps the control core asked for (one per worker at registration).
    pub resyncs: u64,
    /// Workers the control core expired (should stay 0: virtual workers never miss a
    /// heartbeat).
    pub expired_workers: u64,
    /// Routing failures (no decode worker).
    pub route_errors: u64,
    /// Requests whose route call timed out in the gateway stage and were sent unrouted to a
    /// decode worker (route `fail-open;reason=timeout`).
    pub failed_open: u64,
    /// Engine refusals (at arrival or after a transfer).
    pub rejected: u64,
    /// Requests refused 400 for an output larger than the model's context or a prompt that
    /// leaves no room in it, as the control plane (or, for a request that failed open, the
    /// worker) refuses them.
    pub refused_for_context: u64,
    /// Recompute preemptions across engines.
    pub preemptions: u64,
    /// KV transfers started and tokens they moved.
    pub transfers: u64,
    /// Tokens moved by KV transfers.
    pub transfer_tokens: u64,
    /// Discrete event times processed.
    pub event_steps: u64,
    /// Virtual ms of idle stretches skipped rather than played (nothing running and the
    /// next send more than ten minutes away).
    pub idle_skipped_ms: f64,
    /// Whether the KV index ended up keeping every hash in its table, because a `Stored`
    /// event's parent could not be found by its engine id (should stay `false`: the
    /// simulated engines name every parent).
    pub index_every_hash: bool,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayRun {
    /// What ran.
    pub spec: StackSpec,
    /// One record per request sent, in id order, as the load generator records them.
    pub records: Vec<RequestRecord>,
    /// What the router decided per request, in id order.
    pub notes: Vec<RouteNote>,
    /// Requests never sent.
    pub not_sent: usize,
    /// Counters.
    pub counters: ReplayCounters,
    /// Virtual time when the last event happened, ms.
    pub end_ms: f64,
}

/// The router config a comparison's runs share, as JSON (for a control plane's flag) and parsed,
/// from `--conditional-disagg-config` (JSON text, or `None` for the defaults) and the
/// objectives the runs are scored against: `slo_cost`
/// decides against those same objectives unless the config names its own (`slo_itl_ms`,
/// `slo_ttft_ms`). `switchyard-replay` and `switchyard-compare` (its real runs and their
/// virtual cross-check) both take their config from here, so they decide alike.
///
/// # Errors
/// A message naming the flag for text that is not a JSON object, a `serving_mode` (each run's
/// mode comes from `--modes`; one here would win unseen), or a field the router refuses.
pub fn comparison_router(
    text: Option<&str>,
    slo: switchyard_loadgen::report::Slo,
) -> Result<(serde_json::Value, RouterConfig), String> {
    let flag = "--conditional-disagg-config";
    let mut json = match text {
        Some(text) => serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| format!("{flag} is not JSON: {e}"))?,
        None => serde_json::json!({}),
    };
    let Some(fields) = json.as_object_mut() else {
        return Err(format!("{flag} must be a JSON object, got {json}"));
    };
    if fields.contains_key("serving_mode") {
        return Err(format!(
            "{flag}: leave serving_mode out (each run's mode comes from --modes)"
        ));
    }
    for (field, objective) in [("slo_itl_ms", slo.itl_ms), ("slo_ttft_ms", slo.ttft_ms)] {
        if let Some(ms) = objective {
            fields.entry(field).or_insert(ms.into());
        }
    }
    let config = RouterConfig::from_json(&json).map_err(|e| format!("{flag}: {e}"))?;
    Ok((json, config))
}
