//! The comparison's workload and request bodies: loaded once, replayed identically in every
//! run (same requests, same prompt tokens, same seed).

use std::path::{Path, PathBuf};

use switchyard_loadgen::agentic::generate_agentic;
use switchyard_loadgen::prompts::{BodyBuilder, PromptFraming};
use switchyard_loadgen::trace_file::load_trace;
use switchyard_loadgen::vocab::Vocabulary;
use switchyard_loadgen::Workload;
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::ModelTokenizer;
use switchyard_replay::PromptSource;

use super::{CompareError, WorkloadSpec};
use crate::paths::workspace_root;

/// The `model` field the requests carry (the simulated workers accept any name).
pub const MODEL_NAME: &str = "Qwen/Qwen3-235B-A22B";

/// The Mooncake conversation trace in the repository (`data/`, see `data/README.md`).
pub fn default_trace() -> PathBuf {
    workspace_root().join("data/mooncake_conversation_trace.jsonl")
}

/// A workload ready to replay: the requests, how to render them, and the exact token ids
/// the control plane will compute from them (for the virtual-time cross-check).
#[derive(Debug, Clone)]
pub struct PreparedWorkload {
    /// The requests, capped.
    pub workload: Workload,
    /// Trace lines skipped as malformed (counted in every report).
    pub malformed_trace_lines: usize,
    /// Renders request bodies (chat API, one user message).
    pub builder: BodyBuilder,
    /// Chat-template tokens around the content, measured with the real tokenizer.
    pub framing: PromptFraming,
}

impl PreparedWorkload {
    /// The token ids the server computes for each request: the same vocabulary and
    /// framing as the bodies, so a virtual replay routes on exactly the real prompts.
    pub fn prompt_source(&self) -> PromptSource {
        PromptSource {
            vocab: self.builder.vocab.clone(),
            framing: self.framing.clone(),
            content_seed: self.workload.content_seed,
        }
    }
}

/// Loads the workload `spec` describes, keeps its first `max_requests`, and builds the
/// request bodies with the tokenizer in `model_dir`.
///
/// # Errors
/// [`CompareError::Workload`] for an unreadable or empty trace or a bad agentic config,
/// [`CompareError::Tokenizer`] if the tokenizer cannot be loaded or the framing measured.
pub fn prepare(
    spec: &WorkloadSpec,
    seed: u64,
    max_requests: Option<usize>,
    model_dir: &Path,
) -> Result<PreparedWorkload, CompareError> {
    let (mut workload, malformed) = match spec {
        WorkloadSpec::Trace {
            path,
            block_tokens,
            form,
        } => {
            let loaded = load_trace(path, *form, *block_tokens, seed)
                .map_err(|e| CompareError::Workload(format!("{}: {e}", path.display())))?;
            for bad in loaded.malformed.iter().take(10) {
                tracing::warn!("{}:{}: {} (skipped)", path.display(), bad.line, bad.reason);
            }
            if loaded.workload.requests.is_empty() {
                return Err(CompareError::Workload(format!(
                    "{} has no usable rows",
                    path.display()
                )));
            }
            (loaded.workload, loaded.malformed.len())
        }
        WorkloadSpec::Agentic(config) => (
            generate_agentic(config, seed).map_err(|e| CompareError::Workload(e.to_string()))?,
            0,
        ),
    };
    if let Some(n) = max_requests {
        workload.truncate(n);
    }
    if let Some(warning) = workload.span_warning() {
        switchyard_support::errln!("{warning}");
    }
    let tokenizer = ModelTokenizer::from_dir(model_dir).map_err(|e| {
        CompareError::Tokenizer(format!(
            "cannot load the tokenizer from {} (run scripts/setup.sh): {e}",
            model_dir.display()
        ))
    })?;
    let builder = BodyBuilder {
        api: ApiKind::Chat,
        model: MODEL_NAME.to_string(),
        vocab: Vocabulary::from_tokenizer(&tokenizer)
            .map_err(|e| CompareError::Tokenizer(e.to_string()))?,
        content_seed: workload.content_seed,
    };
    let framing = PromptFraming::measure(&tokenizer, &builder)
        .map_err(|e| CompareError::Tokenizer(e.to_string()))?;
    Ok(PreparedWorkload {
        workload,
        malformed_trace_lines: malformed,
        builder,
        framing,
    })
}
