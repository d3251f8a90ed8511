//! The workload flags every workload-driven binary takes (`switchyard-loadgen`,
//! `switchyard-replay`, `switchyard-compare`), defined once and flattened into each CLI
//! (`#[command(flatten)]`), so the three accept the same spellings with the same meanings.

use std::path::{Path, PathBuf};

use clap::Args;

use super::agentic::AgenticConfig;
use super::trace::MOONCAKE_BLOCK_TOKENS;
use super::trace_file::TraceForm;

/// Which workload: a Mooncake trace or synthetic agentic sessions, and the knobs of each.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Trace file: Mooncake rows {timestamp, input_length, output_length, hash_ids}, or
    /// session rows {session_id, timestamp | delay, parent_session_id?, ...} (closed loop).
    #[arg(long, conflicts_with = "agentic")]
    pub trace: Option<PathBuf>,
    /// Read the trace as this form instead of detecting it (a `session_id` in any row makes
    /// it a session trace).
    #[arg(long, value_enum, conflicts_with = "agentic")]
    pub trace_form: Option<TraceForm>,
    /// Tokens per trace hash id.
    #[arg(long, default_value_t = MOONCAKE_BLOCK_TOKENS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub block_tokens: u32,
    /// Synthesize agentic sessions instead of reading a trace.
    #[arg(long)]
    pub agentic: bool,
    /// File of agentic knobs as JSON (any subset of the fields in docs/loadgen.md); flags
    /// override.
    #[arg(long, requires = "agentic", conflicts_with = "trace")]
    pub agentic_config: Option<PathBuf>,
    /// Agentic sessions.
    #[arg(long, requires = "agentic", conflicts_with = "trace")]
    pub sessions: Option<u32>,
    /// Agentic main-agent turns per session.
    #[arg(long, requires = "agentic", conflicts_with = "trace")]
    pub turns: Option<u32>,
    /// Agentic session starts per second (modelled time).
    #[arg(long, requires = "agentic", conflicts_with = "trace")]
    pub session_rate: Option<f64>,
    /// Agentic think time between turns, `MIN,MAX` ms.
    #[arg(long, requires = "agentic", conflicts_with = "trace", value_parser = parse_range)]
    pub think_ms: Option<(u64, u64)>,
    /// Agentic: largest prompt, tokens.
    #[arg(long, requires = "agentic", conflicts_with = "trace")]
    pub max_isl: Option<u32>,
    /// Workload seed (prompt contents, agentic structure; a virtual router's tie-breaking).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl WorkloadArgs {
    /// The trace to read: `--trace`, else `default` (`None` with `--agentic`).
    pub fn trace_or(&self, default: impl FnOnce() -> PathBuf) -> Option<PathBuf> {
        (!self.agentic).then(|| self.trace.clone().unwrap_or_else(default))
    }

    /// The agentic config: the defaults, then `--agentic-config`'s fields, then the flags;
    /// validated.
    ///
    /// # Errors
    /// A message for an unreadable or non-JSON file, an unknown field, or an invalid value.
    pub fn agentic_config(&self) -> Result<AgenticConfig, String> {
        let mut config = match &self.agentic_config {
            Some(path) => config_file(path)?,
            None => AgenticConfig::default(),
        };
        config.sessions = self.sessions.unwrap_or(config.sessions);
        config.turns = self.turns.unwrap_or(config.turns);
        config.session_rate_per_s = self.session_rate.unwrap_or(config.session_rate_per_s);
        config.think_ms = self.think_ms.unwrap_or(config.think_ms);
        config.max_isl = self.max_isl.unwrap_or(config.max_isl);
        config
            .validate()
            .map_err(|e| format!("agentic workload: {e}"))?;
        Ok(config)
    }
}

/// The defaults overridden by the JSON object in `path`.
fn config_file(path: &Path) -> Result<AgenticConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if path.to_string_lossy().trim_start().starts_with('{') {
            // `--conditional-disagg-config` beside it takes inline JSON; this one a file.
            "--agentic-config takes a file path: write the JSON to a file".to_string()
        } else {
            format!("cannot read {}: {e}", path.display())
        }
    })?;
    let mut base = serde_json::to_value(AgenticConfig::default()).map_err(|e| e.to_string())?;
    // A byte-order mark (editors on Windows write one) is not JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let overrides: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let Some(fields) = overrides.as_object() else {
        return Err(format!("{} must hold a JSON object", path.display()));
    };
    for (k, v) in fields {
        if base.get(k).is_none() {
            return Err(format!("{}: unknown agentic field {k:?}", path.display()));
        }
        base[k] = v.clone();
    }
    serde_json::from_value(base).map_err(|e| format!("in {}: {e}", path.display()))
}

/// `MIN,MAX` → `(MIN, MAX)`.
///
/// # Errors
/// A message naming the part that is not a number.
fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once(',').ok_or("expected MIN,MAX")?;
    let parse = |x: &str| x.trim().parse::<u64>().map_err(|e| format!("{x:?}: {e}"));
    Ok((parse(a)?, parse(b)?))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        workload: WorkloadArgs,
    }

    fn parse(args: &[&str]) -> Result<WorkloadArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.workload)
    }

    #[test]
    fn flags_defaults_and_conflicts() {
        let w = parse(&[]).unwrap();
        assert_eq!(
            (w.block_tokens, w.seed, w.agentic),
            (MOONCAKE_BLOCK_TOKENS, 0, false)
        );
        assert_eq!(
            w.trace_or(|| "default.jsonl".into()),
            Some("default.jsonl".into())
        );
        let a = parse(&["--agentic", "--sessions", "3", "--think-ms", "10,20"]).unwrap();
        assert_eq!(a.trace_or(|| "default.jsonl".into()), None);
        let config = a.agentic_config().unwrap();
        assert_eq!((config.sessions, config.think_ms), (3, (10, 20)));
        assert!(
            parse(&["--sessions", "3"]).is_err(),
            "agentic knobs need --agentic"
        );
        assert!(parse(&["--agentic", "--trace", "t.jsonl"]).is_err());
        // A trace has no agentic knobs: given beside one they are refused, not ignored.
        for knob in [
            &["--sessions", "3"][..],
            &["--turns", "3"],
            &["--session-rate", "2"],
            &["--think-ms", "1,2"],
            &["--max-isl", "5"],
            &["--agentic-config", "a.json"],
        ] {
            let args: Vec<&str> = ["--trace", "t.jsonl"].iter().chain(knob).copied().collect();
            assert!(parse(&args).is_err(), "{knob:?} beside --trace");
        }
        assert!(parse(&["--agentic", "--think-ms", "10"]).is_err());
        let zero = parse(&["--agentic", "--session-rate", "0"]).unwrap();
        assert!(zero.agentic_config().is_err(), "validated");
        // Inline JSON, as `--conditional-disagg-config` takes, is told to be a file.
        let inline = parse(&["--agentic", "--agentic-config", r#"{"sessions": 2}"#]).unwrap();
        let error = inline.agentic_config().unwrap_err();
        assert!(error.contains("takes a file path"), "{error}");
    }

    #[test]
    fn an_agentic_config_file_is_overridden_by_flags() {
        let dir = std::env::temp_dir().join(format!("wl-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("agentic.json");
        std::fs::write(&file, r#"{"sessions": 5, "turns": 7}"#).unwrap();
        let path = file.to_str().unwrap();
        let a = parse(&["--agentic", "--agentic-config", path, "--turns", "2"]).unwrap();
        let config = a.agentic_config().unwrap();
        assert_eq!((config.sessions, config.turns), (5, 2));
        std::fs::write(&file, r#"{"no_such_field": 1}"#).unwrap();
        let err = a.agentic_config().unwrap_err();
        assert!(err.contains("unknown agentic field"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
