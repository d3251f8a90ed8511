//! The iteration-time model (simulated): how long one engine iteration takes on a GB200 (or
//! H200) worker serving Qwen3-235B-A22B, and how long a KV transfer between workers takes.
//!
//! The constants are the least-squares fits of `docs/sim-model.md` (AIConfigurator
//! latency tables, median fit error 1-2 %). Nothing here measures hardware: it is a model.

use serde::{Deserialize, Serialize};

/// KV bytes per token for Qwen3-235B-A22B with an FP8 KV cache: 94 layers × (K and V) × 4 KV
/// heads × head dim 128 × 1 byte.
pub const KV_BYTES_PER_TOKEN_FP8: u64 = 96_256;

/// Experts per MoE layer and experts each token is routed to (Qwen3-235B-A22B): the decode
/// model's expert-coverage term `cov(B) = 1 − (1 − top_k/experts)^B`.
const EXPERTS: f64 = 128.0;
const EXPERTS_PER_TOKEN: f64 = 8.0;

/// Timing constants of one worker configuration (one row of each table in docs/sim-model.md, "Prefill" and "Decode").
///
/// Prefill: `a0 + a1·Σn + a2·Σ n(c + n/2)`; decode: `b0 + b1·cov(B) + b2·B + b3·Σctx`; an
/// iteration holding both costs their sum. With `dp_ranks > 1` (DEP: data-parallel attention)
/// each rank computes its own requests and the ranks meet at every MoE layer, so an
/// iteration costs what its busiest rank costs (the DEP rows were fitted per rank).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerfModel {
    /// Fixed cost of an iteration that holds prefill work (ms).
    pub a0: f64,
    /// Prefill cost per new token (ms): weights and MoE work.
    pub a1: f64,
    /// Prefill attention cost (ms) per new token per token of context it attends to.
    pub a2: f64,
    /// Fixed cost of a decode iteration (ms).
    pub b0: f64,
    /// Cost of loading the experts a batch touches (ms), scaled by `cov(B)`.
    pub b1: f64,
    /// Decode cost per running sequence (ms).
    pub b2: f64,
    /// Decode KV-read cost per token of context (ms): KV bytes per GPU ÷ (0.8 × HBM bandwidth).
    pub b3: f64,
    /// Data-parallel attention ranks in one worker (1 for TEP, 4 for DEP4).
    pub dp_ranks: u32,
}

/// The configurations fitted in docs/sim-model.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PerfPreset {
    /// GB200, FP8 weights and KV, tensor/expert parallel over 4 GPUs (the default).
    Gb200Fp8Tep4,
    /// GB200, FP8, data-parallel attention + expert parallel over 4 GPUs.
    Gb200Fp8Dep4,
    /// GB200, NVFP4 weights (FP8 KV), DEP4: the configuration of TensorRT-LLM's published
    /// max-throughput numbers, used for the sanity anchors.
    Gb200Nvfp4Dep4,
    /// H200, FP8, tensor/expert parallel over 8 GPUs.
    H200Fp8Tep8,
}

impl PerfPreset {
    /// Every preset, in table order.
    pub const ALL: [PerfPreset; 4] = [
        PerfPreset::Gb200Fp8Tep4,
        PerfPreset::Gb200Fp8Dep4,
        PerfPreset::Gb200Nvfp4Dep4,
        PerfPreset::H200Fp8Tep8,
    ];

    /// Kebab-case name (CLI flags, logs): `gb200-fp8-tep4`, ...
    pub fn name(self) -> &'static str {
        match self {
            PerfPreset::Gb200Fp8Tep4 => "gb200-fp8-tep4",
            PerfPreset::Gb200Fp8Dep4 => "gb200-fp8-dep4",
            PerfPreset::Gb200Nvfp4Dep4 => "gb200-nvfp4-dep4",
            PerfPreset::H200Fp8Tep8 => "h200-fp8-tep8",
        }
    }

    /// The fitted constants.
    pub fn perf(self) -> PerfModel {
        let (a0, a1, a2, b0, b1, b2, b3, dp_ranks) = match self {
            PerfPreset::Gb200Fp8Tep4 => (19.5, 0.01489, 5.42e-7, 8.96, 7.32, 0.0163, 3.71e-6, 1),
            PerfPreset::Gb200Fp8Dep4 => (21.7, 0.04435, 1.911e-6, 12.17, 6.73, 0.0459, 1.41e-5, 4),
            PerfPreset::Gb200Nvfp4Dep4 => {
                (19.4, 0.03755, 1.905e-6, 10.84, 2.61, 0.0604, 1.42e-5, 4)
            }
            PerfPreset::H200Fp8Tep8 => (17.9, 0.02808, 5.94e-7, 7.53, 6.03, 0.0424, 5.81e-6, 1),
        };
        PerfModel {
            a0,
            a1,
            a2,
            b0,
            b1,
            b2,
            b3,
            dp_ranks,
        }
    }

    /// GPUs in one worker of this configuration.
    pub fn gpus_per_worker(self) -> u32 {
        match self {
            PerfPreset::H200Fp8Tep8 => 8,
            _ => 4,
        }
    }

    /// Estimated KV capacity of one worker in tokens (FP8 KV). GB200 FP8: docs/sim-model.md's
    /// ~4.2 M. The others are our estimates by the same arithmetic (usable HBM − weights −
    /// activations, ÷ 96,256 B): NVFP4 weights free ~110 GB → ~5.3 M; H200 ×8 (1,128 GB) → ~7.5 M.
    pub fn kv_capacity_tokens(self) -> u64 {
        match self {
            PerfPreset::Gb200Fp8Tep4 | PerfPreset::Gb200Fp8Dep4 => 4_200_000,
            PerfPreset::Gb200Nvfp4Dep4 => 5_300_000,
            PerfPreset::H200Fp8Tep8 => 7_500_000,
        }
    }
}

impl std::str::FromStr for PerfPreset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PerfPreset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PerfPreset::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown perf preset {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

impl Default for PerfModel {
    fn default() -> Self {
        PerfPreset::Gb200Fp8Tep4.perf()
    }
}

impl PerfModel {
    /// Prefill time (ms) of one rank's chunks given `Σn` and `Σ n(c + n/2)`; 0 without work.
    pub fn prefill_ms(&self, sum_new: f64, sum_attn: f64) -> f64 {
        if sum_new <= 0.0 {
            return 0.0;
        }
        self.a0 + self.a1 * sum_new + self.a2 * sum_attn
    }

    /// Prefill time (ms) of a single chunk of `new` tokens after `cached` tokens already in KV.
    pub fn prefill_chunk_ms(&self, new: u64, cached: u64) -> f64 {
        let n = new as f64;
        self.prefill_ms(n, n * (cached as f64 + n / 2.0))
    }

    /// Decode time (ms) of one rank's batch of `batch` sequences holding `sum_ctx` tokens of
    /// context; 0 for an empty batch.
    pub fn decode_ms(&self, batch: u32, sum_ctx: f64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let coverage = 1.0 - (1.0 - EXPERTS_PER_TOKEN / EXPERTS).powi(batch as i32);
        self.b0 + self.b1 * coverage + self.b2 * batch as f64 + self.b3 * sum_ctx
    }
}

/// Which tokens a disaggregated request moves from the prefill to the decode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferMode {
    /// The whole prompt's KV.
    WholePrompt,
    /// Only the blocks the decode worker does not already cache: what vLLM's NixlConnector
    /// does (the decode side reads the remote blocks of the tokens it has not computed; a
    /// partial prefix hit reads only those), and the default.
    MissingSuffix,
}

/// The KV transfer model: `t = setup + tokens × bytes_per_token ÷ (senders × link × η)`.
/// Simulated: a transfer is a wait of this length, no bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TransferModel {
    /// Fixed setup cost per transfer (ms); docs/sim-model.md, "KV transfer": 0.01-0.05.
    pub setup_ms: f64,
    /// KV bytes per token ([`KV_BYTES_PER_TOKEN_FP8`]).
    pub bytes_per_token: u64,
    /// GPUs sending in parallel.
    pub senders: u32,
    /// One-way link bandwidth per sender, GB/s (10⁹ bytes).
    pub link_gb_per_s: f64,
    /// Achieved share of the link bandwidth (η ≈ 0.7).
    pub efficiency: f64,
    /// Whole prompt or missing suffix.
    pub mode: TransferMode,
}

impl Default for TransferModel {
    fn default() -> Self {
        TransferModel::gb200_nvlink()
    }
}

impl TransferModel {
    /// GB200 NVL72 NVLink: 900 GB/s per GPU one way, 4 senders (100k tokens ≈ 3.8 ms).
    pub fn gb200_nvlink() -> Self {
        TransferModel {
            setup_ms: 0.03,
            bytes_per_token: KV_BYTES_PER_TOKEN_FP8,
            senders: 4,
            link_gb_per_s: 900.0,
            efficiency: 0.7,
            mode: TransferMode::MissingSuffix,
        }
    }

    /// GB200 across racks: 800 Gb/s NIC = 100 GB/s per GPU, 4 senders (100k tokens ≈ 34 ms).
    pub fn gb200_cross_rack() -> Self {
        TransferModel {
            link_gb_per_s: 100.0,
            ..TransferModel::gb200_nvlink()
        }
    }

    /// H200 over 400 Gb/s InfiniBand = 50 GB/s per GPU, 8 senders (100k tokens ≈ 34 ms).
    pub fn h200_infiniband() -> Self {
        TransferModel {
            senders: 8,
            link_gb_per_s: 50.0,
            ..TransferModel::gb200_nvlink()
        }
    }

    /// Modelled time (ms) to move the KV of `tokens` tokens; 0 when nothing moves.
    pub fn time_ms(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let bytes_per_ms = self.senders as f64 * self.link_gb_per_s * 1e9 * self.efficiency / 1e3;
        if bytes_per_ms <= 0.0 {
            return f64::INFINITY;
        }
        self.setup_ms + (tokens * self.bytes_per_token) as f64 / bytes_per_ms
    }

    /// Tokens that move for a prompt of `prompt_tokens` when the decode worker already caches
    /// `decode_cached_tokens` of its prefix, per [`TransferModel::mode`].
    pub fn tokens_to_move(&self, prompt_tokens: u64, decode_cached_tokens: u64) -> u64 {
        match self.mode {
            TransferMode::WholePrompt => prompt_tokens,
            TransferMode::MissingSuffix => prompt_tokens.saturating_sub(decode_cached_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tep4_spot_checks_match_perf_model() {
        let m = PerfPreset::Gb200Fp8Tep4.perf();
        let close = |got: f64, want: f64| (got - want).abs() / want < 0.05;
        assert!(close(m.prefill_chunk_ms(8_192, 0), 158.0));
        assert!(close(m.prefill_chunk_ms(1_024, 131_072), 110.0));
        assert!(close(m.prefill_chunk_ms(32_768, 0), 788.0));
        assert!(close(m.prefill_chunk_ms(131_072, 0), 6_600.0));
    }

    #[test]
    fn transfer_presets_match_perf_model() {
        let close = |got: f64, want: f64| (got - want).abs() / want < 0.05;
        assert!(close(TransferModel::gb200_nvlink().time_ms(100_000), 3.8));
        assert!(close(
            TransferModel::gb200_cross_rack().time_ms(100_000),
            34.0
        ));
        assert!(close(
            TransferModel::h200_infiniband().time_ms(100_000),
            34.0
        ));
        assert_eq!(TransferModel::default().time_ms(0), 0.0);
    }

    #[test]
    fn missing_suffix_moves_only_what_decode_lacks() {
        // The default is what vLLM's NixlConnector reads: only what the decode worker lacks.
        let mut t = TransferModel::default();
        assert_eq!(t.mode, TransferMode::MissingSuffix);
        assert_eq!(t.tokens_to_move(1_000, 640), 360);
        assert_eq!(t.tokens_to_move(1_000, 5_000), 0);
        t.mode = TransferMode::WholePrompt;
        assert_eq!(t.tokens_to_move(1_000, 640), 1_000);
    }

    #[test]
    fn presets_parse_by_name() {
        for p in PerfPreset::ALL {
            assert_eq!(p.name().parse::<PerfPreset>(), Ok(p));
        }
        assert!("gb300".parse::<PerfPreset>().is_err());
    }

    #[test]
    fn decode_grows_with_context_and_batch() {
        let m = PerfModel::default();
        assert_eq!(m.decode_ms(0, 0.0), 0.0);
        assert!(m.decode_ms(8, 80_000.0) > m.decode_ms(8, 8_000.0));
        assert!(m.decode_ms(64, 8_000.0) > m.decode_ms(8, 8_000.0));
    }
}
