//! The benchmark report: metrics from per-request records, defined as the field defines them.
//!
//! - **TTFT**: send to the first chunk with generated text. **E2E**: send to end of stream.
//! - **ITL** per request: `(E2E − TTFT) / (output_tokens − 1)`; requests with one output
//!   token have none.
//! - **Interactivity** at percentile `p`: `1000 / ITL_p` tokens/s/user, so p99 interactivity
//!   is the slow tail (the user with the 99th-percentile ITL).
//! - **Throughput per GPU**: tokens/s over the run window ÷ every prefill and decode GPU,
//!   input+output and output-only. The window runs from the first send to the last
//!   successful completion or the last send, whichever is later; tokens are the server's
//!   `usage` counts of successful requests.
//! - **Goodput**: successful requests/s that meet every SLO given.
//!
//! Percentiles interpolate linearly between ranks ([`super::stats::percentile`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::RequestRecord;
use super::stats::Summary;
use super::{ArrivalScale, LoadLevel};
use switchyard_engine::SpeedUp;

/// Latency objectives; `None` means no objective on that metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Maximum TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// Maximum ITL, ms (requests with a single output token have no ITL and meet it).
    pub itl_ms: Option<f64>,
}

impl Slo {
    /// The objectives in words, each exactly as given (`TTFT ≤ 2000 ms, ITL ≤ 14.5 ms`; `–`
    /// for none): a rounded objective would name another SLO than the one scored.
    pub fn describe(&self) -> String {
        let ms = |objective: Option<f64>| match objective {
            Some(v) if v.is_finite() => format!("{v} ms"),
            _ => "–".to_string(),
        };
        format!("TTFT ≤ {}, ITL ≤ {}", ms(self.ttft_ms), ms(self.itl_ms))
    }

    /// Whether a successful record meets every objective.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let ttft_ok = match (self.ttft_ms, r.ttft_ms) {
            (None, _) => true,
            (Some(max), Some(t)) => t <= max,
            (Some(_), None) => false,
        };
        let itl_ok = match (self.itl_ms, r.itl_ms()) {
            (Some(max), Some(t)) => t <= max,
            _ => true,
        };
        r.ok() && ttft_ok && itl_ok
    }
}

/// What the run was: the labels and inputs the numbers depend on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Free-form label of the run (`--label`).
    pub label: String,
    /// Serving mode the run measured (`agg`, `disagg`, `conditional`), for comparisons.
    pub mode: Option<String>,
    /// Workload name.
    pub workload: String,
    /// Endpoint the requests went to.
    pub endpoint: String,
    /// Prefill + decode GPUs serving the endpoint.
    pub gpus: u32,
    /// Multiplier on the planned arrival times, modelled time (0.5 = twice the planned rate).
    /// Reports written before the rename call it `time_scale`.
    #[serde(alias = "time_scale")]
    pub arrival_scale: ArrivalScale,
    /// Offered-load multiplier of the comparison run this was (`None` outside comparisons).
    #[serde(default)]
    pub load_level: Option<LoadLevel>,
    /// Workload seed.
    pub seed: u64,
    /// Requests in the workload after caps.
    pub planned_requests: usize,
    /// Trace lines skipped as malformed (0 for synthetic workloads).
    #[serde(default)]
    pub malformed_trace_lines: usize,
    /// Offered load: planned requests ÷ scaled planned arrival span, requests/s (`None` when
    /// all arrive at once, or in closed loop: see `Workload::offered_rps`).
    pub offered_rps: Option<f64>,
    /// Speed-up of the simulated workers over the modelled hardware (their `--speed-up`);
    /// every measured time is multiplied by it so the report is in modelled time. 1: the
    /// measured times are the reported ones (real hardware, virtual time).
    #[serde(alias = "sim_speedup", default, deserialize_with = "speed_up_or_real")]
    pub speed_up: SpeedUp,
    /// Set when the run was stopped before its end (Ctrl-C): the report measures only the
    /// requests that finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
}

/// A run stopped before its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Interrupted {
    /// When, from the run's start, s of real (wall-clock) time; the report's own times are
    /// modelled ones, `speed_up` times longer.
    pub after_s: f64,
    /// Requests in flight then: sent, but cut and not measured.
    pub cut: usize,
}

impl Interrupted {
    /// When, in the report's own (modelled) seconds for workers `speed_up` times faster than
    /// the model.
    pub fn after_modelled_s(&self, speed_up: SpeedUp) -> f64 {
        speed_up.model_ms(self.after_s * 1e3) / 1e3
    }
}

/// A report's speed-up; reports written before the newtype stored 0 for "no speed-up".
fn speed_up_or_real<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SpeedUp, D::Error> {
    let factor = f64::deserialize(d)?;
    if factor == 0.0 {
        return Ok(SpeedUp::REAL);
    }
    SpeedUp::new(factor).map_err(serde::de::Error::custom)
}

/// Request outcome counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Requests sent.
    pub sent: usize,
    /// Sent and succeeded.
    pub ok: usize,
    /// Sent and failed (see `errors`).
    pub failed: usize,
    /// Planned but never sent (duration cap, or a dependency that never finished).
    pub not_sent: usize,
}

/// Token throughput over the run window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Successful requests/s.
    pub requests_per_s: f64,
    /// Prompt tokens/s (cached ones included, as the field counts them).
    pub input_tokens_per_s: f64,
    /// Generated tokens/s.
    pub output_tokens_per_s: f64,
    /// Input + output tokens/s per GPU.
    pub total_tokens_per_s_per_gpu: f64,
    /// Output tokens/s per GPU.
    pub output_tokens_per_s_per_gpu: f64,
}

/// Interactivity, tokens/s/user, at ITL percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Interactivity {
    /// `1000 / ITL_p50`.
    pub p50: Option<f64>,
    /// `1000 / ITL_p90`.
    pub p90: Option<f64>,
    /// `1000 / ITL_p99`.
    pub p99: Option<f64>,
}

/// Requests meeting the SLOs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    /// The objectives applied.
    pub slo: Slo,
    /// Requests that succeeded and met every objective.
    pub requests: usize,
    /// Those per second of run window.
    pub requests_per_s: f64,
    /// Their share of the requests sent.
    pub share: f64,
}

/// Routing as the gateway reported it in `x-switchyard-route`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Routes {
    /// Requests per mode (`bypass`, `disagg`, `agg`, `fail-open`, `none` without a header).
    pub modes: BTreeMap<String, usize>,
    /// Requests per `mode:reason` for headers that carry `;reason=…`.
    pub reasons: BTreeMap<String, usize>,
    /// `bypass` ÷ requests with a route header (`None` without any).
    pub bypass_share: Option<f64>,
}

/// Token accounting: planned versus what the server reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenAccounting {
    /// Planned prompt content tokens of requests sent.
    pub planned_input: u64,
    /// Expected server prompt tokens (content + template) of requests sent.
    pub expected_prompt: u64,
    /// Server-reported prompt tokens (successful requests with usage).
    pub reported_prompt: u64,
    /// Server-reported cached prompt tokens.
    pub reported_cached: u64,
    /// `reported_cached / reported_prompt`.
    pub cached_share: Option<f64>,
    /// Successful requests whose reported prompt tokens differ from the expected count.
    pub prompt_count_mismatches: usize,
    /// Successful requests whose reported output tokens differ from the planned count.
    pub output_count_mismatches: usize,
}

/// Everything measured in one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// What was run.
    pub meta: RunMeta,
    /// Outcomes.
    pub requests: RequestCounts,
    /// First send to the last successful completion or the last send if later, s.
    pub window_s: f64,
    /// TTFT, ms (successful requests).
    pub ttft_ms: Summary,
    /// ITL, ms (successful requests with ≥ 2 output tokens).
    pub itl_ms: Summary,
    /// E2E latency, ms (successful requests).
    pub e2e_ms: Summary,
    /// Tokens/s/user.
    pub interactivity: Interactivity,
    /// Throughput.
    pub throughput: Throughput,
    /// Goodput.
    pub goodput: Goodput,
    /// Route modes and reasons.
    pub routes: Routes,
    /// Requests per serving worker (`x-switchyard-worker`).
    pub workers: BTreeMap<String, usize>,
    /// Planned versus reported tokens.
    pub tokens: TokenAccounting,
    /// Failed requests per kind (`http 503`, `connect`, `stream`, `timeout`, …).
    pub errors: BTreeMap<String, usize>,
}

/// Builds the report for one run.
pub fn build_report(
    meta: RunMeta,
    records: &[RequestRecord],
    not_sent: usize,
    slo: Slo,
) -> RunReport {
    let factor = meta.speed_up.factor();
    let scaled: Vec<RequestRecord>;
    let records = if factor == 1.0 {
        records
    } else {
        scaled = records.iter().map(|r| in_model_time(r, factor)).collect();
        &scaled
    };
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
    let start = records
        .iter()
        .map(|r| r.sent_ms)
        .fold(f64::INFINITY, f64::min);
    // The window ends with the last success, or the last send if later. The tokens counted
    // are successes' only, and a request the client gave up on (`--request-timeout-s`, the
    // drain) would otherwise stretch it to the client's own deadline and lower every rate; a
    // late request that failed fast still took its place in the offered load, which a window
    // ending before it would exceed.
    let end = ok
        .iter()
        .filter_map(|r| r.done_ms())
        .chain(records.iter().map(|r| r.sent_ms))
        .fold(f64::NEG_INFINITY, f64::max);
    let window_s = if end > start {
        (end - start) / 1000.0
    } else {
        0.0
    };
    let per_s = |x: f64| if window_s > 0.0 { x / window_s } else { 0.0 };

    let itl = Summary::of(ok.iter().filter_map(|r| r.itl_ms()));
    let input: u64 = ok
        .iter()
        .map(|r| r.prompt_tokens.map_or(r.expected_prompt_tokens, u64::from))
        .sum();
    let output: u64 = ok.iter().map(|r| u64::from(r.output_tokens())).sum();
    let gpus = f64::from(meta.gpus.max(1));
    let good = records.iter().filter(|r| slo.met_by(r)).count();

    RunReport {
        requests: RequestCounts {
            sent: records.len(),
            ok: ok.len(),
            failed: records.len() - ok.len(),
            not_sent,
        },
        window_s,
        ttft_ms: Summary::of(ok.iter().filter_map(|r| r.ttft_ms)),
        e2e_ms: Summary::of(ok.iter().filter_map(|r| r.e2e_ms)),
        interactivity: Interactivity {
            p50: itl.p50.map(per_token_rate),
            p90: itl.p90.map(per_token_rate),
            p99: itl.p99.map(per_token_rate),
        },
        itl_ms: itl,
        throughput: Throughput {
            requests_per_s: per_s(ok.len() as f64),
            input_tokens_per_s: per_s(input as f64),
            output_tokens_per_s: per_s(output as f64),
            total_tokens_per_s_per_gpu: per_s((input + output) as f64) / gpus,
            output_tokens_per_s_per_gpu: per_s(output as f64) / gpus,
        },
        goodput: Goodput {
            slo,
            requests: good,
            requests_per_s: per_s(good as f64),
            share: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
        },
        routes: routes(records),
        workers: count_by(records.iter().filter_map(|r| r.worker.clone())),
        tokens: token_accounting(records),
        errors: count_by(records.iter().filter(|r| !r.ok()).map(error_kind)),
        meta,
    }
}

/// `r` with every time multiplied by `factor` (wall time of sped-up simulated workers back
/// to the modelled hardware's time).
fn in_model_time(r: &RequestRecord, factor: f64) -> RequestRecord {
    RequestRecord {
        ready_ms: r.ready_ms * factor,
        sent_ms: r.sent_ms * factor,
        ttft_ms: r.ttft_ms.map(|t| t * factor),
        e2e_ms: r.e2e_ms.map(|t| t * factor),
        ..r.clone()
    }
}

/// Tokens/s for one user at an ITL in ms.
fn per_token_rate(itl_ms: f64) -> f64 {
    if itl_ms > 0.0 {
        1000.0 / itl_ms
    } else {
        f64::INFINITY
    }
}

fn count_by(keys: impl Iterator<Item = String>) -> BTreeMap<String, usize> {
    let mut map = BTreeMap::new();
    for k in keys {
        *map.entry(k).or_insert(0) += 1;
    }
    map
}

/// Splits a route header into its mode and optional `reason=` parameter.
pub fn parse_route(header: &str) -> (String, Option<String>) {
    let mut parts = header.split(';').map(str::trim);
    let mode = parts.next().unwrap_or_default().to_string();
    let reason = parts
        .find_map(|p| p.strip_prefix("reason="))
        .map(str::to_string);
    (mode, reason)
}

fn routes(records: &[RequestRecord]) -> Routes {
    let mut out = Routes::default();
    let mut with_header = 0usize;
    for r in records {
        let Some(header) = &r.route else {
            *out.modes.entry("none".into()).or_insert(0) += 1;
            continue;
        };
        with_header += 1;
        let (mode, reason) = parse_route(header);
        if let Some(reason) = reason {
            *out.reasons.entry(format!("{mode}:{reason}")).or_insert(0) += 1;
        }
        *out.modes.entry(mode).or_insert(0) += 1;
    }
    let bypass = out.modes.get("bypass").copied().unwrap_or(0);
    out.bypass_share = (with_header > 0).then(|| bypass as f64 / with_header as f64);
    out
}

fn token_accounting(records: &[RequestRecord]) -> TokenAccounting {
    let mut t = TokenAccounting::default();
    for r in records {
        t.planned_input += r.planned_isl;
        t.expected_prompt += r.expected_prompt_tokens;
        if !r.ok() {
            continue;
        }
        if let Some(p) = r.prompt_tokens {
            t.reported_prompt += u64::from(p);
            if u64::from(p) != r.expected_prompt_tokens {
                t.prompt_count_mismatches += 1;
            }
        }
        t.reported_cached += u64::from(r.cached_tokens.unwrap_or(0));
        if r.output_tokens() != r.planned_osl {
            t.output_count_mismatches += 1;
        }
    }
    t.cached_share =
        (t.reported_prompt > 0).then(|| t.reported_cached as f64 / t.reported_prompt as f64);
    t
}

/// A failed record's error kind: `http <status>` for non-2xx responses, else the error
/// text's prefix before `:` (the client writes `connect: …`, `stream: …`, `timeout: …`).
pub fn error_kind(r: &RequestRecord) -> String {
    match r.status {
        Some(s) if !(200..300).contains(&s) => format!("http {s}"),
        _ => r
            .error
            .as_deref()
            .and_then(|e| e.split(':').next())
            .unwrap_or("unknown")
            .to_string(),
    }
}
