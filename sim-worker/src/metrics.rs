//! The worker's `/metrics`: vLLM's Prometheus names (so anything that scrapes vLLM scrapes a
//! simulated worker) plus Switchyard's own counters.
//!
//! The text format is rendered by hand: a dozen counters do not justify another dependency,
//! and vLLM's names contain a `:` that metric libraries treat as reserved for recording rules.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use switchyard_engine::LoadSnapshot;

/// Why a KV pull failed (a `reason` label of `switchyard_kv_pull_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFailure {
    /// The prefill worker did not answer (gone, refused, timed out).
    Unreachable,
    /// It answered that it holds no such KV (lease expired, already pulled, evicted).
    NotHeld,
    /// The held KV is for a different prompt than the decode request's.
    Mismatch,
    /// `kv_transfer_params` lacked the fields needed to pull.
    InvalidParams,
    /// The prefill worker answered something unexpected.
    BadResponse,
}

impl PullFailure {
    /// Every reason, in label order.
    pub const ALL: [PullFailure; 5] = [
        PullFailure::Unreachable,
        PullFailure::NotHeld,
        PullFailure::Mismatch,
        PullFailure::InvalidParams,
        PullFailure::BadResponse,
    ];

    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PullFailure::Unreachable => "unreachable",
            PullFailure::NotHeld => "not_held",
            PullFailure::Mismatch => "mismatch",
            PullFailure::InvalidParams => "invalid_params",
            PullFailure::BadResponse => "bad_response",
        }
    }
}

/// Counters one worker keeps. All start at zero ([`Default`]) so tests can read them.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Requests accepted, chat API.
    pub requests_chat: AtomicU64,
    /// Requests accepted, completions API.
    pub requests_completions: AtomicU64,
    /// Requests answered with a 4xx.
    pub bad_requests: AtomicU64,
    /// Requests that finished (all tokens generated).
    pub requests_finished: AtomicU64,
    /// Requests aborted because the client went away mid-request.
    pub requests_aborted: AtomicU64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: AtomicU64,
    /// Generated tokens.
    pub generation_tokens: AtomicU64,
    /// Prompt tokens this worker computed itself (neither cached nor pulled).
    pub local_prefill_tokens: AtomicU64,
    /// Prompt tokens of finished requests found in the local prefix cache.
    pub cached_prompt_tokens: AtomicU64,
    /// Prompt tokens of finished requests whose KV was pulled from a prefill worker.
    pub remote_prompt_tokens: AtomicU64,
    /// Prefill legs answered with `kv_transfer_params` (KV held here).
    pub kv_holds: AtomicU64,
    /// Hold releases requested by decode workers that found the KV.
    pub kv_holds_pulled: AtomicU64,
    /// Holds the gateway released unpulled (`POST /switchyard/kv/release`).
    pub kv_holds_released: AtomicU64,
    /// Successful pulls (decode side).
    pub kv_pulls: AtomicU64,
    /// Tokens of KV pulled (the transfer's size under the transfer mode).
    pub kv_transfer_tokens: AtomicU64,
    /// Modelled transfer time waited, microseconds.
    pub kv_transfer_us: AtomicU64,
    /// Failed pulls by [`PullFailure::ALL`] index.
    pub kv_pull_failures: [AtomicU64; 5],
    /// KV event batches handed to NATS.
    pub kv_event_batches: AtomicU64,
    /// KV event batches dropped (NATS publisher backed up); the control plane sees a gap and
    /// asks for a resync.
    pub kv_event_batches_dropped: AtomicU64,
    /// Resync dumps sent.
    pub kv_resyncs: AtomicU64,
    /// NATS publishes that failed.
    pub nats_publish_errors: AtomicU64,
    /// Replay requests answered on the vLLM wire's ROUTER socket.
    pub kv_replay_requests: AtomicU64,
}

impl WorkerMetrics {
    /// Counts a failed pull.
    pub fn pull_failed(&self, reason: PullFailure) {
        let i = PullFailure::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.kv_pull_failures[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed pulls for one reason.
    pub fn pull_failures(&self, reason: PullFailure) -> u64 {
        let i = PullFailure::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.kv_pull_failures[i].load(Ordering::Relaxed)
    }

    /// Prometheus text exposition, with the engine's `load` for the gauges and its block size
    /// for `vllm:cache_config_info`.
    pub fn render(
        &self,
        model: &str,
        worker_id: &str,
        load: &LoadSnapshot,
        block_size: u32,
    ) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let labels = format!(
            "model_name=\"{}\",worker=\"{}\"",
            escape(model),
            escape(worker_id)
        );
        let mut out = String::with_capacity(4096);
        let mut put = |name: &str, kind: &str, help: &str, extra: &str, value: String| {
            let sep = if extra.is_empty() { "" } else { "," };
            // HELP/TYPE once per family: callers pass the family's first sample with help.
            if !help.is_empty() {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
            }
            let _ = writeln!(out, "{name}{{{labels}{sep}{extra}}} {value}");
        };
        put(
            "vllm:num_requests_running",
            "gauge",
            "Requests in the running batch.",
            "",
            load.running.to_string(),
        );
        put(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting to be scheduled.",
            "",
            load.waiting.to_string(),
        );
        put(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV cache usage (1 = 100%).",
            "",
            format!("{}", load.kv_usage()),
        );
        put(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            "",
            load.prefix_cache_queries.to_string(),
        );
        put(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            "",
            load.prefix_cache_hits.to_string(),
        );
        // vLLM's info gauge: the cache's shape in labels, value 1. A scraper learns each
        // worker's block size and capacity from it, as from a real vLLM.
        put(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig.",
            &format!(
                "block_size=\"{block_size}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\"",
                load.kv_total_blocks
            ),
            "1".to_owned(),
        );
        put(
            "vllm:num_preemptions_total",
            "counter",
            "Requests preempted to free KV.",
            "",
            load.preemptions.to_string(),
        );
        put(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            "",
            get(&self.prompt_tokens).to_string(),
        );
        put(
            "vllm:prompt_tokens_cached_total",
            "counter",
            "Prompt tokens of finished requests found in the prefix cache.",
            "",
            get(&self.cached_prompt_tokens).to_string(),
        );
        // What vLLM's `prompt_tokens_by_source_total` splits: computed here, found in the
        // local cache, or received from a prefill worker (NIXL in vLLM, simulated here).
        for (i, (source, counter)) in [
            ("local_compute", &self.local_prefill_tokens),
            ("local_cache_hit", &self.cached_prompt_tokens),
            ("external_kv_transfer", &self.remote_prompt_tokens),
        ]
        .into_iter()
        .enumerate()
        {
            put(
                "vllm:prompt_tokens_by_source_total",
                "counter",
                if i == 0 {
                    "Prompt tokens of finished requests, by where their KV came from."
                } else {
                    ""
                },
                &format!("source=\"{source}\""),
                get(counter).to_string(),
            );
        }
        put(
            "vllm:generation_tokens_total",
            "counter",
            "Generated tokens.",
            "",
            get(&self.generation_tokens).to_string(),
        );
        put(
            "vllm:request_success_total",
            "counter",
            "Requests finished.",
            "finished_reason=\"length\"",
            get(&self.requests_finished).to_string(),
        );
        put(
            "switchyard_requests_total",
            "counter",
            "Requests accepted, by API.",
            "api=\"chat\"",
            get(&self.requests_chat).to_string(),
        );
        put(
            "switchyard_requests_total",
            "counter",
            "",
            "api=\"completions\"",
            get(&self.requests_completions).to_string(),
        );
        put(
            "switchyard_bad_requests_total",
            "counter",
            "Requests rejected with a 4xx.",
            "",
            get(&self.bad_requests).to_string(),
        );
        put(
            "switchyard_requests_aborted_total",
            "counter",
            "Requests aborted because the client disconnected.",
            "",
            get(&self.requests_aborted).to_string(),
        );
        put(
            "switchyard_local_prefill_tokens_total",
            "counter",
            "Prompt tokens computed here (not cached, not pulled).",
            "",
            get(&self.local_prefill_tokens).to_string(),
        );
        put(
            "switchyard_kv_held_requests",
            "gauge",
            "Prefill legs whose KV is held for a decode worker.",
            "",
            load.held.to_string(),
        );
        put(
            "switchyard_kv_used_blocks",
            "gauge",
            "KV blocks referenced by running or held requests.",
            "",
            load.kv_used_blocks.to_string(),
        );
        put(
            "switchyard_kv_cached_blocks",
            "gauge",
            "Unreferenced KV blocks still holding reusable prefixes.",
            "",
            load.kv_cached_blocks.to_string(),
        );
        put(
            "switchyard_kv_total_blocks",
            "gauge",
            "KV capacity in blocks.",
            "",
            load.kv_total_blocks.to_string(),
        );
        put(
            "switchyard_queued_prefill_tokens",
            "gauge",
            "Prompt tokens still to prefill.",
            "",
            load.queued_prefill_tokens.to_string(),
        );
        put(
            "switchyard_kv_holds_total",
            "counter",
            "Prefill legs that held KV for a decode worker.",
            "",
            get(&self.kv_holds).to_string(),
        );
        put(
            "switchyard_kv_holds_pulled_total",
            "counter",
            "Held KV released to a decode worker's pull.",
            "",
            get(&self.kv_holds_pulled).to_string(),
        );
        put(
            "switchyard_kv_holds_released_total",
            "counter",
            "Held KV released unpulled because its decode leg will not come.",
            "",
            get(&self.kv_holds_released).to_string(),
        );
        put(
            "switchyard_kv_pulls_total",
            "counter",
            "KV pulled from prefill workers (decode side).",
            "",
            get(&self.kv_pulls).to_string(),
        );
        put(
            "switchyard_kv_transfer_tokens_total",
            "counter",
            "Tokens of KV transferred in (simulated).",
            "",
            get(&self.kv_transfer_tokens).to_string(),
        );
        put(
            "switchyard_kv_transfer_seconds_total",
            "counter",
            "Modelled KV transfer time waited (simulated).",
            "",
            format!("{}", get(&self.kv_transfer_us) as f64 / 1e6),
        );
        for (i, reason) in PullFailure::ALL.iter().enumerate() {
            let help = if i == 0 {
                "KV pulls that failed and fell back to local prefill."
            } else {
                ""
            };
            put(
                "switchyard_kv_pull_failures_total",
                "counter",
                help,
                &format!("reason=\"{}\"", reason.as_str()),
                get(&self.kv_pull_failures[i]).to_string(),
            );
        }
        put(
            "switchyard_kv_event_batches_total",
            "counter",
            "KV event batches published.",
            "",
            get(&self.kv_event_batches).to_string(),
        );
        put(
            "switchyard_kv_event_batches_dropped_total",
            "counter",
            "KV event batches dropped before NATS.",
            "",
            get(&self.kv_event_batches_dropped).to_string(),
        );
        put(
            "switchyard_kv_resyncs_total",
            "counter",
            "Resync dumps sent.",
            "",
            get(&self.kv_resyncs).to_string(),
        );
        put(
            "switchyard_kv_replay_requests_total",
            "counter",
            "Replay requests answered on the vLLM wire's replay socket.",
            "",
            get(&self.kv_replay_requests).to_string(),
        );
        put(
            "switchyard_nats_publish_errors_total",
            "counter",
            "NATS publishes that failed.",
            "",
            get(&self.nats_publish_errors).to_string(),
        );
        out
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
