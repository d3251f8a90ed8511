//! Feeding `slo_cost`'s online-learned timing model (`switchyard_policy::learn`): at routing
//! time, what the configured coefficients predict for the path the verdict takes; at
//! `first_token` and `done`, what it took. The same lifecycle reports that free predicted load
//! (the filter's, or the replay's at the virtual instant) are the observations.

use std::collections::HashMap;

use crate::index::WorkerSlot;
use crate::policy::config::ConditionalDisaggConfig;
use crate::policy::learn::TimingScales;
use crate::policy::slo_cost::{prefill_ms, queue_ms, step_ms};

/// More requests awaiting their reports than this, and those older than the load's request
/// timeout are dropped (reports that never came).
const MAX_OBSERVING: usize = 100_000;

/// What the configured model predicted for one routed request, until its reports arrive.
#[derive(Debug, Clone, Copy)]
struct Observation {
    routed_ms: u64,
    /// TTFT part the prefill coefficients scale (ms).
    scaled_ms: f64,
    /// TTFT part they do not (transfer, decode steps) (ms).
    fixed_ms: f64,
    decode: WorkerSlot,
    /// Set at `first_token`: when, and the streams decoding on the worker then.
    first: Option<(u64, u32)>,
}

/// What one verdict's path costs by the configured model, from the router's predicted load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathLoad {
    /// Prompt tokens.
    pub isl: u64,
    /// Tokens the serving worker prefills itself (bypass, agg) or the prefill worker computes
    /// (disagg).
    pub new_tokens: u64,
    /// Queued prefill tokens ahead of it on the worker that prefills.
    pub queued_tokens: u64,
    /// Streams decoding on the worker that decodes, before this request.
    pub streams: u32,
    /// Whether the KV is computed on a prefill worker and transferred.
    pub disagg: bool,
    /// Prompt tokens the decode worker does not cache: what a handoff transfers.
    pub transferred_tokens: u64,
}

/// The learned factors and the requests awaiting their reports.
#[derive(Debug, Default)]
pub(crate) struct Learning {
    scales: TimingScales,
    observing: HashMap<String, Observation>,
}

impl Learning {
    /// The learned factors.
    pub fn scales(&self) -> TimingScales {
        self.scales
    }

    /// Forgets everything learned (the configured coefficients changed).
    pub fn reset(&mut self) {
        *self = Learning::default();
    }

    /// Records the prediction for a routed request.
    pub fn on_route(
        &mut self,
        request_id: &str,
        path: PathLoad,
        decode: WorkerSlot,
        cfg: &ConditionalDisaggConfig,
        now_ms: u64,
        timeout_ms: u64,
    ) {
        if self.observing.len() >= MAX_OBSERVING {
            self.observing
                .retain(|_, o| o.routed_ms.saturating_add(timeout_ms) > now_ms);
        }
        let cached = path.isl.saturating_sub(path.new_tokens);
        let scaled_ms =
            queue_ms(path.queued_tokens, cfg) + prefill_ms(path.new_tokens, cached, cfg);
        let fixed_ms = if path.disagg {
            cfg.kv_transfer_ms_per_token * path.transferred_tokens as f64
                + step_ms(path.streams.saturating_add(1), cfg)
        } else {
            let chunk = u64::from(cfg.prefill_chunk_tokens.max(1));
            let iterations =
                path.queued_tokens.div_ceil(chunk) + path.new_tokens.div_ceil(chunk).max(1);
            iterations as f64 * step_ms(path.streams, cfg)
        };
        self.observing.insert(
            request_id.to_string(),
            Observation {
                routed_ms: now_ms,
                scaled_ms,
                fixed_ms,
                decode,
                first: None,
            },
        );
    }

    /// The decode worker of a request awaiting its first token.
    pub fn awaiting_first_token(&self, request_id: &str) -> Option<WorkerSlot> {
        self.observing
            .get(request_id)
            .filter(|o| o.first.is_none())
            .map(|o| o.decode)
    }

    /// `first_token` at `now_ms`, with `streams` decoding on its worker (itself included).
    pub fn on_first_token(&mut self, request_id: &str, streams: u32, now_ms: u64) {
        let Some(o) = self.observing.get_mut(request_id) else {
            return;
        };
        if o.first.is_some() {
            return;
        }
        let observed = now_ms.saturating_sub(o.routed_ms) as f64;
        self.scales.observe_ttft(o.scaled_ms, o.fixed_ms, observed);
        o.first = Some((now_ms, streams));
    }

    /// `done` at `now_ms`, with the tokens generated when the report says.
    pub fn on_done(
        &mut self,
        request_id: &str,
        completion_tokens: Option<u32>,
        ok: bool,
        cfg: &ConditionalDisaggConfig,
        now_ms: u64,
    ) {
        let Some(o) = self.observing.remove(request_id) else {
            return;
        };
        let (Some((first_ms, streams)), Some(tokens), true) = (o.first, completion_tokens, ok)
        else {
            return;
        };
        if tokens < 2 {
            return;
        }
        let itl = now_ms.saturating_sub(first_ms) as f64 / f64::from(tokens - 1);
        self.scales
            .observe_itl(step_ms(streams.max(1), cfg), itl, cfg.slo_itl_ms);
    }
}
