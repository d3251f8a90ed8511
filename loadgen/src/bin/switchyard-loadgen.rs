//! `switchyard-loadgen`: replay a Mooncake trace or synthetic agentic sessions against an
//! OpenAI-compatible endpoint and report latency, interactivity, throughput per GPU and
//! goodput. `docs/loadgen.md` has the details.
//!
//! - `switchyard-loadgen [run] --endpoint URL (--trace PATH | --agentic) --gpus N --out DIR`
//! - `switchyard-loadgen plan (--trace PATH | --agentic) [--write-trace FILE]`: the workload's
//!   shape, no requests; optionally the workload written as a session trace.
//! - `switchyard-loadgen compare --out DIR RUN...`: comparison table and plots across runs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use switchyard_engine::SpeedUp;
use switchyard_loadgen::agentic::generate_agentic;
use switchyard_loadgen::client::{check_endpoint, replay_until, ClientConfig};
use switchyard_loadgen::compare::output::{write_comparison, write_run_files};
use switchyard_loadgen::compare::table::comparison_tables;
use switchyard_loadgen::markdown::run_markdown;
use switchyard_loadgen::prompts::{BodyBuilder, PromptFraming};
use switchyard_loadgen::report::{build_report, Interrupted, RunMeta, RunReport, Slo};
use switchyard_loadgen::sessions::write_session_trace;
use switchyard_loadgen::summary::WorkloadSummary;
use switchyard_loadgen::trace_file::{load_trace, TraceForm};
use switchyard_loadgen::vocab::Vocabulary;
use switchyard_loadgen::{ArrivalScale, Workload, WorkloadArgs};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::route::ServingMode;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_support::cli;

#[derive(Parser)]
#[command(
    name = "switchyard-loadgen",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a workload against an endpoint (the default).
    Run(Box<RunArgs>),
    /// Print the workload's shape (lengths, reuse) without sending anything.
    Plan(LoadgenWorkload),
    /// Compare finished runs: table (markdown, JSON) and interactivity-vs-throughput plots.
    Compare(CompareArgs),
}

/// The shared workload flags plus the ones only the load generator takes.
#[derive(Args, Clone)]
struct LoadgenWorkload {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Keep only the first N requests (by arrival).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_requests: Option<usize>,
    /// Fail on any malformed trace line instead of skipping and reporting it.
    #[arg(long)]
    strict: bool,
    /// Also write the workload as a session trace (JSONL) to this file, hash ids of
    /// --block-tokens tokens: replaying it with --trace gives the same workload.
    #[arg(long)]
    write_trace: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    workload: LoadgenWorkload,
    /// Base URL of the gateway or OpenAI-compatible server, e.g. http://127.0.0.1:8080 (or
    /// http://127.0.0.1:8080/v1, as OpenAI's SDKs take it); requests go to /v1/... under it.
    #[arg(long)]
    endpoint: Option<String>,
    /// API to use: one user message (chat) or a raw prompt (completions).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    api: Api,
    /// Model folder with tokenizer.json and tokenizer_config.json.
    #[arg(long, env = "SWITCHYARD_MODEL_DIR")]
    model_dir: Option<PathBuf>,
    /// Value of the request's `model` field.
    #[arg(long, default_value = "Qwen/Qwen3-235B-A22B")]
    model_name: String,
    /// Multiplies the planned arrival and think times, modelled time (0.5 = twice the
    /// planned rate; 0 = all at once). With --speed-up the client sends that much faster.
    #[arg(long, default_value_t = ArrivalScale::PLANNED)]
    arrival_scale: ArrivalScale,
    /// Requests in flight at most.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_concurrency: Option<usize>,
    /// Send nothing after this many seconds.
    #[arg(long, value_parser = cli::positive_seconds)]
    max_duration_s: Option<f64>,
    /// Seconds in-flight requests get after --max-duration-s.
    #[arg(long, default_value_t = 60.0, value_parser = cli::seconds)]
    drain_s: f64,
    /// Per-request limit in seconds.
    #[arg(long, value_parser = cli::positive_seconds)]
    request_timeout_s: Option<f64>,
    /// TTFT objective for goodput, ms.
    #[arg(long, value_parser = cli::objective_ms)]
    slo_ttft_ms: Option<f64>,
    /// ITL objective for goodput, ms.
    #[arg(long, value_parser = cli::objective_ms)]
    slo_itl_ms: Option<f64>,
    /// Prefill + decode GPUs behind the endpoint (or use --workers).
    #[arg(long, conflicts_with = "workers")]
    gpus: Option<u32>,
    /// Prefill + decode workers behind the endpoint; GPUs = workers × --gpus-per-worker.
    #[arg(long)]
    workers: Option<u32>,
    /// GPUs per worker (a simulated GB200 worker is 4).
    #[arg(long, default_value_t = 4)]
    gpus_per_worker: u32,
    /// Speed-up of the simulated workers behind the endpoint (their --speed-up): the client
    /// sends that much faster, and measured times are multiplied by it so the report is in
    /// modelled-hardware time.
    #[arg(long, env = "SWITCHYARD_SPEED_UP", default_value_t = SpeedUp::REAL)]
    speed_up: SpeedUp,
    /// Run label.
    #[arg(long)]
    label: Option<String>,
    /// Serving mode measured, for comparisons.
    #[arg(long, value_enum)]
    mode: Option<ServingMode>,
    /// Bearer token for the endpoint.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Output folder: records.jsonl, report.json, report.md.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct CompareArgs {
    /// Output folder: comparison.md, comparison.json and the plots.
    #[arg(long)]
    out: PathBuf,
    /// Run folders (with report.json) or report JSON files.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Api {
    Chat,
    Completions,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    // Bad flags exit 64, as every Switchyard binary's do.
    let cli: Cli = match cli::parse_args() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let result = match cli.command {
        Some(Command::Run(args)) => run(*args),
        None => run(cli.run),
        Some(Command::Plan(args)) => plan(&args),
        Some(Command::Compare(args)) => compare(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.is::<Usage>() => {
            switchyard_support::errln!("error: {e}");
            std::process::ExitCode::from(cli::EXIT_USAGE)
        }
        Err(e) if e.is::<StoppedBySignal>() => {
            switchyard_support::errln!("{e}");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            // One line, causes included; no backtrace even under RUST_BACKTRACE=1 (these
            // are the user's errors, not the program's).
            switchyard_support::errln!(
                "error: {}",
                switchyard_support::cli::error_line(e.as_ref())
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves at the first of SIGINT, SIGTERM and SIGHUP.
///
/// # Errors
/// When the handlers cannot be installed.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind: SignalKind| signal(kind).context("installing a signal handler");
    let mut int = handler(SignalKind::interrupt())?;
    let mut term = handler(SignalKind::terminate())?;
    let mut hup = handler(SignalKind::hangup())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    })
}

/// A run stopped by a signal: its report is written, and the exit status is 130, as for an
/// interrupted command.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StoppedBySignal(String);

/// Bad or missing flags (or a workload config they name) that clap cannot check alone: exit
/// 64 like clap's own refusals, before anything is sent.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

fn usage(message: impl Into<String>) -> anyhow::Error {
    Usage(message.into()).into()
}

/// Loads the workload the flags describe, reporting malformed trace lines; writes it as a
/// session trace with `--write-trace`.
fn load_workload(args: &LoadgenWorkload) -> Result<(Workload, usize)> {
    let w = &args.workload;
    let (mut workload, malformed) = match (&w.trace, w.agentic) {
        (Some(path), _) => {
            let loaded = load_trace(path, w.trace_form, w.block_tokens, w.seed)
                .map_err(|e| usage(e.to_string()))?;
            if loaded.form == TraceForm::Mooncake && args.write_trace.is_some() {
                return Err(usage(format!(
                    "--write-trace writes session traces, and {} is an open-loop (Mooncake) \
                     trace: its requests wait for no earlier turn",
                    path.display()
                )));
            }
            for bad in loaded.malformed.iter().take(10) {
                switchyard_support::errln!("{}:{}: {}", path.display(), bad.line, bad.reason);
            }
            let malformed = loaded.malformed.len();
            if malformed > 0 {
                switchyard_support::errln!(
                    "{}: {malformed} malformed line(s) skipped ({} trace)",
                    path.display(),
                    loaded.form
                );
                if args.strict {
                    return Err(usage(format!(
                        "{malformed} malformed line(s) in {} (--strict)",
                        path.display()
                    )));
                }
            }
            if loaded.workload.requests.is_empty() {
                return Err(usage(format!("{} has no usable rows", path.display())));
            }
            (loaded.workload, malformed)
        }
        (None, true) => {
            let config = w.agentic_config().map_err(usage)?;
            (generate_agentic(&config, w.seed)?, 0)
        }
        (None, false) => return Err(usage("give a workload: --trace PATH or --agentic")),
    };
    if let Some(n) = args.max_requests {
        workload.truncate(n);
    }
    // A real run waits out the span: say so before the wait, not after a silent hour.
    if let Some(warning) = workload.span_warning() {
        switchyard_support::errln!("{warning}");
    }
    if let Some(path) = &args.write_trace {
        let rows = write_session_trace(path, &workload, w.block_tokens)
            .map_err(|e| usage(e.to_string()))?;
        switchyard_support::errln!(
            "wrote {rows} session-trace rows to {} ({} tokens per hash id)",
            path.display(),
            w.block_tokens
        );
    }
    Ok((workload, malformed))
}

fn plan(args: &LoadgenWorkload) -> Result<()> {
    let (workload, malformed) = load_workload(args)?;
    switchyard_support::outln!(
        "{}",
        WorkloadSummary::of(&workload)
            .render()
            .trim_end_matches('\n')
    );
    // A generated workload read no trace: nothing to say of its lines.
    if !args.workload.agentic {
        switchyard_support::outln!("{malformed} malformed trace line(s) skipped");
    }
    Ok(())
}

fn run(args: RunArgs) -> Result<()> {
    let endpoint = args
        .endpoint
        .clone()
        .ok_or_else(|| usage("--endpoint is required"))?;
    let out = args
        .out
        .clone()
        .ok_or_else(|| usage("--out DIR is required"))?;
    let gpus = match (args.gpus, args.workers) {
        (Some(0), _) => return Err(usage("--gpus must be at least 1")),
        (Some(g), _) => g,
        (None, Some(0)) => return Err(usage("--workers must be at least 1")),
        (None, Some(_)) if args.gpus_per_worker == 0 => {
            return Err(usage("--gpus-per-worker must be at least 1"))
        }
        (None, Some(w)) => w
            .checked_mul(args.gpus_per_worker)
            .ok_or_else(|| usage("--workers × --gpus-per-worker is too large"))?,
        (None, None) => {
            return Err(usage(
                "give --gpus N or --workers N (throughput per GPU needs the GPU count)",
            ))
        }
    };
    check_endpoint(&endpoint).map_err(|e| usage(e.to_string()))?;
    let (workload, malformed) = load_workload(&args.workload)?;
    // Before anything is sent: a run whose report cannot be written is not worth starting.
    std::fs::create_dir_all(&out)
        .map_err(|e| usage(format!("cannot create --out {}: {e}", out.display())))?;
    let model_dir = args.model_dir.clone().unwrap_or_else(default_model_dir);
    let tokenizer = ModelTokenizer::from_dir(&model_dir).with_context(|| {
        format!(
            "cannot load the tokenizer from {} (run scripts/setup.sh or pass --model-dir)",
            model_dir.display()
        )
    })?;
    let builder = BodyBuilder {
        api: match args.api {
            Api::Chat => ApiKind::Chat,
            Api::Completions => ApiKind::Completions,
        },
        model: args.model_name.clone(),
        vocab: Vocabulary::from_tokenizer(&tokenizer)?,
        content_seed: workload.content_seed,
    };
    let framing = PromptFraming::measure(&tokenizer, &builder)?;
    switchyard_support::errln!(
        "{} request framing: {} template tokens before the content, {} after",
        builder.api.as_str(),
        framing.prefix_tokens(),
        framing.suffix_tokens()
    );
    let mode = args.mode.map(ServingMode::as_str);
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("{}@arrival-x{}", mode.unwrap_or("run"), args.arrival_scale));
    let meta = RunMeta {
        label: label.clone(),
        mode: mode.map(str::to_string),
        workload: workload.name.clone(),
        endpoint: endpoint.clone(),
        gpus,
        arrival_scale: args.arrival_scale,
        load_level: None,
        seed: args.workload.workload.seed,
        planned_requests: workload.requests.len(),
        malformed_trace_lines: malformed,
        offered_rps: workload.offered_rps(args.arrival_scale),
        speed_up: args.speed_up,
        interrupted: None,
    };
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    let config = ClientConfig {
        endpoint,
        arrival_scale: args.arrival_scale.on_wall_clock(args.speed_up),
        max_concurrency: args.max_concurrency,
        max_duration: args.max_duration_s.map(secs),
        drain: secs(args.drain_s),
        request_timeout: args.request_timeout_s.map(secs),
        api_key: args.api_key.clone(),
        run_tag: label.replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
        framing,
        progress: !args.quiet,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let outcome = runtime.block_on(async {
        // Ctrl-C (or SIGTERM, or the terminal closing) stops the run but keeps what finished.
        let stop = stop_signal()?;
        anyhow::Ok(replay_until(workload, builder, config, stop).await?)
    })?;
    let slo = Slo {
        ttft_ms: args.slo_ttft_ms,
        itl_ms: args.slo_itl_ms,
    };
    let mut meta = meta;
    meta.interrupted = outcome.stopped_after.map(|after| Interrupted {
        after_s: after.as_secs_f64(),
        cut: outcome.cut,
    });
    let report = build_report(meta, &outcome.records, outcome.not_sent, slo);
    write_run_files(&out, &outcome.records, &report)?;
    switchyard_support::outln!("{}", run_markdown(&report));
    switchyard_support::errln!("wrote {}", out.display());
    if let Some(stop) = report.meta.interrupted {
        return Err(StoppedBySignal(format!(
            "interrupted after {:.1} s of real time ({:.1} s modelled): the report measures the {} requests that finished ({} cut, {} not sent)",
            stop.after_s,
            stop.after_modelled_s(report.meta.speed_up),
            report.requests.sent,
            stop.cut,
            report.requests.not_sent
        ))
        .into());
    }
    // A run in which nothing succeeded measured nothing: a script that goes on to compare
    // it must not take it for a result. Partial failures are data and exit 0.
    if report.requests.ok == 0 {
        let errors: Vec<String> = report
            .errors
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        bail!(
            "no request succeeded ({} sent, {} not sent; errors: {}); the report is in {}",
            report.requests.sent,
            report.requests.not_sent,
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join(", ")
            },
            out.display()
        );
    }
    Ok(())
}

fn compare(args: &CompareArgs) -> Result<()> {
    let mut runs = Vec::new();
    for path in &args.runs {
        let file = if path.is_dir() {
            path.join("report.json")
        } else {
            path.clone()
        };
        // Input the user named, unreadable: a usage error (64), as for `run`'s trace.
        let text = std::fs::read_to_string(&file)
            .map_err(|e| usage(format!("cannot read {}: {e}", file.display())))?;
        let report: RunReport = serde_json::from_str(&text)
            .map_err(|e| usage(format!("{} is not a run report: {e}", file.display())))?;
        runs.push(report);
    }
    // Runs left at their default labels (mode and arrival scale) may share one: name each
    // such row by where its report came from, or the table's rows cannot be told apart.
    let labels: Vec<String> = runs.iter().map(|r| r.meta.label.clone()).collect();
    for (report, path) in runs.iter_mut().zip(&args.runs) {
        if labels.iter().filter(|l| **l == report.meta.label).count() > 1 {
            report.meta.label = format!("{} ({})", report.meta.label, path.display());
        }
    }
    // Runs given in any order read best grouped by mode, by rising offered load; a closed
    // loop has no offered rate, so its runs go by how fast their arrivals were played (a
    // smaller arrival scale is more load).
    let load = |m: &switchyard_loadgen::report::RunMeta| {
        m.offered_rps.unwrap_or_else(|| {
            let factor = m.arrival_scale.factor();
            if factor > 0.0 {
                1.0 / factor
            } else {
                f64::INFINITY
            }
        })
    };
    runs.sort_by(|a, b| {
        (a.meta.mode.as_deref(), load(&a.meta))
            .partial_cmp(&(b.meta.mode.as_deref(), load(&b.meta)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let table = comparison_tables(&runs);
    write_comparison(&args.out, &table, &runs, &runs)?;
    switchyard_support::outln!("{table}");
    Ok(())
}
