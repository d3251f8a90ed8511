//! Engine configuration and its validation.

use switchyard_protocol::hash::{BlockSize, HashSeed};
use switchyard_protocol::worker::WorkerRole;

use super::perf::{PerfModel, PerfPreset, TransferModel};
use super::EngineError;

/// Name of the simulated model (Qwen3-235B-A22B), served when none is given.
pub const DEFAULT_MODEL_NAME: &str = "Qwen/Qwen3-235B-A22B";
/// Context length of the simulated model (Qwen3-235B-A22B's 262,144 tokens).
pub const DEFAULT_MAX_MODEL_LEN: u32 = 262_144;
/// Default interval between a worker's load reports (ms).
pub const DEFAULT_LOAD_INTERVAL_MS: u64 = 500;

/// vLLM's default for how long a prefill worker keeps KV for a decode worker that never
/// pulls it (older vLLMs' `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s; vLLM 0.32's 30 s
/// `kv_lease_duration` is renewed while the decode worker waits, which is not modelled).
pub const DEFAULT_PREFILL_HOLD_LEASE_MS: f64 = 480_000.0;

/// How one simulated engine behaves. [`EngineConfig::new`] gives the GB200 FP8 TEP4 worker of
/// docs/sim-model.md; [`EngineConfig::with_preset`] the other table rows.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Prefill, decode or aggregated.
    pub role: WorkerRole,
    /// KV block size in tokens (64, as Dynamo's mocker; every hash uses it).
    pub block_size: u32,
    /// KV capacity in blocks (GB200 TEP4: ~4.2 M tokens / 64 = 65,625).
    pub kv_capacity_blocks: u64,
    /// Token budget of one iteration (decode tokens + prefill chunk tokens); vLLM default 8192.
    pub max_num_batched_tokens: u32,
    /// Most requests running at once.
    pub max_num_seqs: u32,
    /// Iteration-time constants.
    pub perf: PerfModel,
    /// Seed of the block hashes (a LoRA adapter or cache salt would change it).
    pub hash_seed: HashSeed,
    /// KV transfer model (used by callers through [`super::Engine::transfer_time_ms`]).
    pub transfer: TransferModel,
    /// How long a prefill leg's KV stays pinned when nobody pulls it (ms).
    pub prefill_hold_lease_ms: f64,
    /// Whether every output token after the first is reported ([`super::EngineOutput::Token`]).
    /// Trace replays that only need TTFT and E2E turn it off to save work.
    pub emit_token_outputs: bool,
}

impl EngineConfig {
    /// The default GB200 FP8 TEP4 worker in `role`.
    pub fn new(role: WorkerRole) -> Self {
        EngineConfig::with_preset(role, PerfPreset::Gb200Fp8Tep4)
    }

    /// A worker of the given preset. DEP presets run 4 attention ranks, each with vLLM's
    /// per-engine defaults, so their token budget and sequence limit are 4× (one DP engine
    /// per rank, stepped in lockstep).
    pub fn with_preset(role: WorkerRole, preset: PerfPreset) -> Self {
        let block_size = 64;
        let perf = preset.perf();
        let transfer = match preset {
            PerfPreset::H200Fp8Tep8 => TransferModel::h200_infiniband(),
            _ => TransferModel::gb200_nvlink(),
        };
        EngineConfig {
            role,
            block_size,
            kv_capacity_blocks: preset.kv_capacity_tokens() / u64::from(block_size),
            max_num_batched_tokens: 8_192 * perf.dp_ranks,
            max_num_seqs: 256 * perf.dp_ranks,
            perf,
            hash_seed: HashSeed::default(),
            transfer,
            prefill_hold_lease_ms: DEFAULT_PREFILL_HOLD_LEASE_MS,
            emit_token_outputs: true,
        }
    }

    /// The block size as the protocol's validated type.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] for a zero or oversized block size.
    pub fn block_size(&self) -> Result<BlockSize, EngineError> {
        BlockSize::try_new(self.block_size)
            .map_err(|e| EngineError::InvalidConfig(format!("block_size: {e}")))
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`] naming the first bad field.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |what: &str| Err(EngineError::InvalidConfig(what.to_string()));
        self.block_size()?;
        if self.kv_capacity_blocks == 0 || self.kv_capacity_blocks > u64::from(u32::MAX - 1) {
            return bad("kv_capacity_blocks must be between 1 and 2^32 - 2");
        }
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1");
        }
        if self.perf.dp_ranks == 0 {
            return bad("perf.dp_ranks must be at least 1");
        }
        let p = &self.perf;
        let constants = [p.a0, p.a1, p.a2, p.b0, p.b1, p.b2, p.b3];
        if constants.iter().any(|c| !c.is_finite() || *c < 0.0) {
            return bad("perf constants must be finite and non-negative");
        }
        if !(self.prefill_hold_lease_ms.is_finite() && self.prefill_hold_lease_ms >= 0.0) {
            return bad("prefill_hold_lease_ms must be finite and non-negative");
        }
        let t = &self.transfer;
        if !(t.link_gb_per_s > 0.0 && t.efficiency > 0.0 && t.senders > 0) {
            return bad("transfer: link_gb_per_s, efficiency and senders must be positive");
        }
        if !(t.setup_ms.is_finite() && t.setup_ms >= 0.0) {
            return bad("transfer: setup_ms must be finite and non-negative");
        }
        // A share of the link: more than all of it would model a faster link than exists.
        if t.efficiency > 1.0 {
            return bad("transfer: efficiency is a share of the link, at most 1");
        }
        Ok(())
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::new(WorkerRole::Agg)
    }
}
