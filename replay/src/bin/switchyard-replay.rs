//! `switchyard-replay`: replays a workload in virtual time through simulated engines with
//! the control plane's own router in the loop, in agg, disagg and conditional mode on equal
//! GPUs, and optionally sweeps the conditional-disaggregation thresholds.
//! **Simulated**: see `docs/virtual-time.md`.
//!
//! Bad input (flags, trace, config JSON) exits with 64 and a message naming the problem.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use switchyard_engine::PerfPreset;
use switchyard_engine::DEFAULT_MODEL_NAME;
use switchyard_loadgen::compare::output::{clear_earlier_comparison, write_comparison};
use switchyard_loadgen::compare::table::comparison_tables;
use switchyard_loadgen::compare::{run_comparison, worker_split, ComparisonPlan, PrefillWorkers};
use switchyard_loadgen::prompts::{BodyBuilder, PromptFraming};
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::vocab::Vocabulary;
use switchyard_loadgen::{ArrivalScale, LoadLevel, Workload, WorkloadArgs};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_replay::workload::load_workload;
use switchyard_replay::{
    block_on, recommend_from_sweep, recommendation_markdown, sweep_markdown, sweep_thresholds,
    tuning_markdown, EffIslDistribution, GatewayModel, PromptSource, StackSpec, ThresholdGrid,
    VirtualBackend,
};
use switchyard_router::config::{RouterConfig, ServingMode};
use switchyard_support::cli::{parse_args, EXIT_USAGE};

#[derive(Parser)]
#[command(
    name = "switchyard-replay",
    version,
    about,
    allow_negative_numbers = true
)]
struct Cli {
    /// Workload: `--trace PATH` (default: the one-hour conversation trace in
    /// data/mooncake_conversation_trace.jsonl) or `--agentic` with its knobs; `--seed` also seeds the router.
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Workers in every mode (equal GPUs).
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(switchyard_replay::spec::MAX_VIRTUAL_WORKERS)))]
    workers: u32,
    /// Share of the workers that prefill in disagg and conditional mode (rounded, at least
    /// one prefill and one decode worker). Half suits prefill-heavy traces like Mooncake's
    /// (ISL:OSL about 35:1).
    #[arg(long, default_value_t = 0.5)]
    prefill_ratio: f64,
    /// Exact prefill worker count (overrides --prefill-ratio).
    #[arg(long)]
    prefill_workers: Option<u32>,
    /// Modes to run, comma-separated: agg, disagg, conditional.
    #[arg(long, value_delimiter = ',', default_value = "agg,disagg,conditional")]
    modes: Vec<ServingMode>,
    /// Multiplies the workload's arrival and think times (0.5 = twice the trace's rate).
    #[arg(long, alias = "time-scale", default_value_t = ArrivalScale::PLANNED)]
    arrival_scale: ArrivalScale,
    /// Offered-load multipliers (2 = twice the load at --arrival-scale); each mode runs once
    /// per level (the interactivity-vs-throughput plot's points).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    load_levels: Vec<LoadLevel>,
    /// Keep only the first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// Router config JSON (thresholds, policy, selection, load), as `PUT /v1/config` takes.
    #[arg(long)]
    conditional_disagg_config: Option<String>,
    /// Also sweep the isl_bounding thresholds in conditional mode.
    #[arg(long)]
    sweep: bool,
    /// eff_isl_threshold values of the sweep (with --sweep).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,512,1024,2048,4096,8192,16384",
        requires = "sweep"
    )]
    sweep_thresholds: Vec<u32>,
    /// eff_isl_ratio_threshold values of the sweep (with --sweep).
    #[arg(long, value_delimiter = ',', default_value = "0.7", requires = "sweep")]
    sweep_ratios: Vec<f64>,
    /// Sweep points within this share of the best goodput count as tied for the
    /// recommendation, the lowest TTFT p90 among them winning (0: only equal goodput ties;
    /// with --sweep).
    #[arg(long, default_value_t = 0.0, requires = "sweep")]
    goodput_tolerance: f64,
    /// TTFT objective for goodput, ms.
    #[arg(long, value_parser = switchyard_support::cli::objective_ms)]
    slo_ttft_ms: Option<f64>,
    /// ITL objective for goodput, ms.
    #[arg(long, value_parser = switchyard_support::cli::objective_ms)]
    slo_itl_ms: Option<f64>,
    /// Worker performance preset (gb200-fp8-tep4, gb200-fp8-dep4, gb200-nvfp4-dep4,
    /// h200-fp8-tep8).
    #[arg(long, default_value = "gb200-fp8-tep4")]
    perf_preset: String,
    /// Route the exact token ids the control plane computes from the load generator's chat
    /// bodies (Qwen3 tokenizer vocabulary and chat-template framing) instead of synthetic
    /// ids with the same structure. Needs the tokenizer (scripts/setup.sh).
    #[arg(long)]
    chat_framing: bool,
    /// Model folder with tokenizer.json and tokenizer_config.json (for --chat-framing).
    #[arg(long, env = "SWITCHYARD_MODEL_DIR")]
    model_dir: Option<PathBuf>,
    /// Model the gateway in front of the engines (`docs/virtual-time.md`; all gateway costs
    /// 0: no gateway stage): the body's way to the route call (client, Envoy), modelled µs
    /// per prompt token.
    #[arg(long, default_value_t = 0.0, value_parser = microseconds)]
    gateway_body_us_per_token: f64,
    /// Gateway: the control plane's route tokenization, modelled µs per prompt token.
    #[arg(long, default_value_t = 0.0, value_parser = microseconds)]
    gateway_route_us_per_token: f64,
    /// Gateway: the first worker's tokenization, modelled µs per prompt token.
    #[arg(long, default_value_t = 0.0, value_parser = microseconds)]
    gateway_worker_us_per_token: f64,
    /// Gateway: the decode worker's tokenization of a disaggregated request before its KV
    /// transfer, modelled µs per prompt token.
    #[arg(long, default_value_t = 0.0, value_parser = microseconds)]
    gateway_decode_leg_us_per_token: f64,
    /// Gateway: route calls tokenized at once (FIFO beyond; 0 = unbounded).
    #[arg(long, default_value_t = 2)]
    gateway_route_threads: u32,
    /// Gateway: cores the tokenizations share (may be fractional).
    #[arg(long, default_value_t = 2.0)]
    gateway_cpus: f64,
    /// Gateway: route call timeout, modelled ms; a slower verdict fails open.
    #[arg(long)]
    gateway_route_timeout_ms: Option<f64>,
    /// Output folder: comparison.md/json, plots, per-run reports, tuning, sweep.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Everything checked from the flags before any run starts.
struct Plan {
    workload: Workload,
    source: PromptSource,
    base: StackSpec,
    comparison: ComparisonPlan,
    slo: Slo,
}

/// The files this tool writes beside the comparison's.
const OWN_OUTPUTS: [&str; 4] = ["tuning.md", "tuning.json", "sweep.md", "sweep.json"];

fn main() -> ExitCode {
    let cli: Cli = match parse_args() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let plan = match plan(&cli) {
        Ok(p) => p,
        Err(e) => {
            switchyard_support::errln!("switchyard-replay: {}", error_chain(&e));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match run(&cli, plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            switchyard_support::errln!("switchyard-replay: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, skipping a cause whose text the message before it already
/// quotes (several library errors embed their source).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn default_trace() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/mooncake_conversation_trace.jsonl"
    ))
}

fn plan(cli: &Cli) -> Result<Plan> {
    let preset: PerfPreset = cli
        .perf_preset
        .parse()
        .map_err(|e| anyhow::anyhow!("--perf-preset: {e}"))?;
    let workload = load_workload(&cli.workload, default_trace, cli.max_requests)?;
    let comparison = ComparisonPlan {
        modes: cli.modes.clone(),
        load_levels: cli.load_levels.clone(),
        arrival_scale: cli.arrival_scale,
        workers: cli.workers,
        prefill: match cli.prefill_workers {
            Some(count) => PrefillWorkers::Count(count),
            None => PrefillWorkers::Share(cli.prefill_ratio),
        },
    };
    // Checked here so that bad modes, levels or splits exit 64 before anything runs.
    comparison.runs()?;
    workload
        .check_load_levels(comparison.arrival_scale, &comparison.load_levels)
        .map_err(anyhow::Error::msg)?;
    // slo_cost decides against the objectives the runs are scored against, unless the config
    // names its own.
    let (_, router) = switchyard_replay::spec::comparison_router(
        cli.conditional_disagg_config.as_deref(),
        Slo {
            ttft_ms: cli.slo_ttft_ms,
            itl_ms: cli.slo_itl_ms,
        },
    )
    .map_err(anyhow::Error::msg)?;
    if cli.sweep {
        // The sweep runs conditional serving: it needs a prefill and a decode worker.
        worker_split(ServingMode::Conditional, cli.workers, comparison.prefill)
            .map_err(|e| anyhow::anyhow!("--sweep runs conditional serving: {e}"))?;
        if !(0.0..1.0).contains(&cli.goodput_tolerance) {
            bail!(
                "--goodput-tolerance must be in [0, 1), got {}",
                cli.goodput_tolerance
            );
        }
        switchyard_replay::planner::check_grid(&ThresholdGrid {
            eff_isl_thresholds: cli.sweep_thresholds.clone(),
            ratio_thresholds: cli.sweep_ratios.clone(),
        })
        .map_err(|e| anyhow::anyhow!("--sweep-thresholds / --sweep-ratios: {e}"))?;
    }
    // Found now, not after the runs.
    if let Some(out) = &cli.out {
        std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    }
    // The split every split mode gets, and the threshold sweep (conditional mode) too;
    // with a single worker only agg runs, and there is none.
    let prefill = worker_split(ServingMode::Conditional, cli.workers, comparison.prefill)
        .map_or(0, |split| split.prefill);
    let mut base = StackSpec::new(
        ServingMode::Conditional,
        cli.workers,
        u32::try_from(prefill).unwrap_or(u32::MAX),
    );
    base.preset = preset;
    base.router = router;
    base.seed = cli.workload.seed;
    base.gateway = GatewayModel {
        body_ms_per_prompt_token: cli.gateway_body_us_per_token / 1e3,
        route_ms_per_prompt_token: cli.gateway_route_us_per_token / 1e3,
        // The flags model a cold control plane: every token costs the uncached rate.
        route_ms_per_cached_token: cli.gateway_route_us_per_token / 1e3,
        route_threads: cli.gateway_route_threads,
        long_lane_min_tokens: 0,
        route_timeout_ms_per_token: 0.0,
        route_timeout_cap_ms: None,
        worker_ms_per_prompt_token: cli.gateway_worker_us_per_token / 1e3,
        worker_ms_per_cached_token: cli.gateway_worker_us_per_token / 1e3,
        cpus: cli.gateway_cpus,
        decode_leg_ms_per_prompt_token: cli.gateway_decode_leg_us_per_token / 1e3,
        decode_leg_ms_per_cached_token: cli.gateway_decode_leg_us_per_token / 1e3,
        route_timeout_ms: cli.gateway_route_timeout_ms,
    };
    base.gateway
        .validate()
        .map_err(|e| anyhow::anyhow!("gateway: {e}"))?;
    let slo = Slo {
        ttft_ms: cli.slo_ttft_ms,
        itl_ms: cli.slo_itl_ms,
    };
    let source = if cli.chat_framing {
        chat_source(cli, workload.content_seed)?
    } else {
        PromptSource::synthetic(workload.content_seed)
    };
    Ok(Plan {
        workload,
        source,
        base,
        comparison,
        slo,
    })
}

/// Token ids as the control plane computes them from the load generator's chat bodies.
fn chat_source(cli: &Cli, content_seed: u64) -> Result<PromptSource> {
    let dir = cli.model_dir.clone().unwrap_or_else(default_model_dir);
    let tokenizer = ModelTokenizer::from_dir(&dir).with_context(|| {
        format!(
            "cannot load the tokenizer from {} (run scripts/setup.sh or pass --model-dir)",
            dir.display()
        )
    })?;
    let builder = BodyBuilder {
        api: ApiKind::Chat,
        model: DEFAULT_MODEL_NAME.to_string(),
        vocab: Vocabulary::from_tokenizer(&tokenizer)?,
        content_seed,
    };
    let framing = PromptFraming::measure(&tokenizer, &builder)?;
    Ok(PromptSource {
        vocab: builder.vocab,
        framing,
        content_seed,
    })
}

fn run(cli: &Cli, plan: Plan) -> Result<()> {
    let Plan {
        workload,
        source,
        base,
        comparison,
        slo,
    } = plan;
    switchyard_support::errln!(
        "{}: {} requests; {} workers ({} prefill in disagg/conditional), preset {}",
        workload.name,
        workload.requests.len(),
        base.workers,
        base.prefill_workers,
        base.preset.name()
    );
    if let Some(warning) = workload.span_warning() {
        switchyard_support::errln!("{warning}");
    }
    if let Some(out) = &cli.out {
        // This tool's own files too: an interrupted run must not leave an earlier tuning page.
        clear_earlier_comparison(out, &OWN_OUTPUTS)?;
    }
    let mut backend = VirtualBackend::new(&workload, &source, base.clone(), slo);
    let runs = block_on(run_comparison(
        &comparison,
        &mut backend,
        cli.out.as_deref(),
    ))?;
    let reports = runs.reports();
    let table = comparison_tables(&reports);
    switchyard_support::outln!("{table}");
    let tuning = runs
        .runs
        .iter()
        .find(|r| r.run.mode == ServingMode::Conditional)
        .map(|r| EffIslDistribution::from_notes(&r.detail.notes));
    let tuning_md = tuning.map(|dist| (tuning_markdown(&dist), dist));
    if let Some((md, _)) = &tuning_md {
        let advice = if cli.sweep {
            ""
        } else {
            "Thresholds are recommended from measurements only: run with --sweep (or \
             switchyard-plan).\n"
        };
        switchyard_support::outln!("## Effective ISL (conditional run)\n\n{md}\n{advice}");
    }
    let sweep = if cli.sweep {
        let grid = ThresholdGrid {
            eff_isl_thresholds: cli.sweep_thresholds.clone(),
            ratio_thresholds: cli.sweep_ratios.clone(),
        };
        // The sweep runs at the first load level's arrivals.
        let base = StackSpec {
            arrival_scale: comparison.arrival_scale.at_level(comparison.load_levels[0]),
            ..base.clone()
        };
        let points = sweep_thresholds(&workload, &source, &base, &grid, slo)?;
        let mut md = format!(
            "Conditional mode under `isl_bounding` at load {}× (the first of --load-levels); \
             SLOs: {}.\n\n",
            comparison.load_levels[0],
            slo.describe()
        );
        md.push_str(&sweep_markdown(&points));
        let defaults = RouterConfig::default().conditional;
        let rec = recommend_from_sweep(
            &points,
            cli.goodput_tolerance,
            (defaults.eff_isl_threshold, defaults.eff_isl_ratio_threshold),
        );
        match &rec {
            Some(rec) => {
                md.push('\n');
                md.push_str(&recommendation_markdown(rec));
            }
            None => md.push_str("\nNo sweep point ran without failures: no recommendation.\n"),
        }
        switchyard_support::outln!("## Threshold sweep\n\n{md}");
        Some((points, md, rec))
    } else {
        None
    };
    if let Some(out) = &cli.out {
        let write = |name: &str, text: String| {
            let path = out.join(name);
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
        };
        write_comparison(out, &table, &reports, &reports)?;
        if let Some((md, dist)) = tuning_md {
            write("tuning.md", md)?;
            write(
                "tuning.json",
                serde_json::to_string_pretty(&serde_json::json!({"distribution": dist}))?,
            )?;
        }
        if let Some((points, md, rec)) = sweep {
            write("sweep.md", md)?;
            write(
                "sweep.json",
                serde_json::to_string_pretty(
                    &serde_json::json!({"points": points, "recommendation": rec}),
                )?,
            )?;
        }
        switchyard_support::errln!("wrote {}", out.display());
    }
    // As the load generator: a run set in which nothing succeeded is a failed run (its report
    // is written all the same), not a result.
    if reports.iter().all(|r| r.requests.ok == 0) {
        bail!(
            "no request succeeded in any run (the errors are in the table above): prompts or \
             outputs beyond what the workers hold?"
        );
    }
    Ok(())
}

/// A gateway cost in µs per prompt token (clap value parser): finite and at least 0, named
/// with the flag and in the unit the user gave it.
fn microseconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!(
            "{text} is not a number of µs per prompt token >= 0"
        )),
    }
}
