//! `switchyard-plan`: on a GPU budget and two SLOs, sweeps agg, disagg at every
//! prefill:decode split and conditional at every split and threshold pair, in virtual time
//! and in parallel, and recommends the deployment with the most goodput. **Simulated**: see
//! `docs/planner.md`.
//!
//! Bad input (flags, trace) exits with 64 and a message naming the problem.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use switchyard_engine::PerfPreset;
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::{ArrivalScale, LoadLevel, Workload, WorkloadArgs};
use switchyard_replay::planner::{plan_deployment, plan_points, write_plan, Execution, PlanSpace};
use switchyard_replay::workload::load_workload;
use switchyard_replay::{PromptSource, StackSpec, ThresholdGrid};
use switchyard_router::config::ServingMode;
use switchyard_support::cli::{parse_args, EXIT_USAGE};

/// Plans a deployment in virtual time (simulated GB200 workers): on a GPU budget and two
/// SLOs, sweeps agg, disagg at every prefill:decode split and conditional at every split and
/// threshold pair, and recommends the one with the most goodput (docs/planner.md).
#[derive(Parser)]
#[command(name = "switchyard-plan", version, allow_negative_numbers = true)]
struct Cli {
    /// Workload: `--trace PATH` (Mooncake or session trace; default: the conversation trace
    /// in data/) or `--agentic` with its knobs; `--seed` also seeds the router.
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Keep only the first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// GPU budget in workers (GPUs per worker come from --perf-preset).
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(switchyard_replay::spec::MAX_VIRTUAL_WORKERS)))]
    workers: u32,
    /// Worker performance preset.
    #[arg(long, default_value = "gb200-fp8-tep4")]
    perf_preset: String,
    /// Modes to plan, comma-separated: agg, disagg, conditional.
    #[arg(long, value_delimiter = ',', default_value = "agg,disagg,conditional")]
    modes: Vec<ServingMode>,
    /// Multiplies the workload's arrival and think times.
    #[arg(long, default_value_t = ArrivalScale::PLANNED)]
    arrival_scale: ArrivalScale,
    /// Offered-load multipliers; every deployment runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    load_levels: Vec<LoadLevel>,
    /// TTFT objective, ms.
    #[arg(long)]
    slo_ttft_ms: f64,
    /// ITL objective, ms.
    #[arg(long)]
    slo_itl_ms: f64,
    /// eff_isl_threshold values tried in conditional mode.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,512,1024,2048,4096,8192,16384"
    )]
    sweep_thresholds: Vec<u32>,
    /// eff_isl_ratio_threshold values tried in conditional mode.
    #[arg(long, value_delimiter = ',', default_value = "0.7")]
    sweep_ratios: Vec<f64>,
    /// Also plan conditional mode under the `slo_cost` policy (no thresholds; its ITL
    /// objective is --slo-itl-ms) at every split.
    #[arg(long)]
    slo_cost: bool,
    /// Points run at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Start no point after this many minutes (running points finish; the rest are
    /// reported as not run).
    #[arg(long, default_value_t = 60.0)]
    max_minutes: f64,
    /// Output folder: plan.md, plan.json, frontier_throughput.svg, frontier_goodput.svg.
    #[arg(long)]
    out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn default_trace() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/mooncake_conversation_trace.jsonl"
    ))
}

/// Everything checked from the flags before any run starts.
struct Checked {
    workload: Workload,
    base: StackSpec,
    space: PlanSpace,
    slo: Slo,
    points: usize,
}

fn main() -> ExitCode {
    let cli: Cli = match parse_args() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let checked = match check(&cli) {
        Ok(c) => c,
        Err(e) => {
            switchyard_support::errln!(
                "switchyard-plan: {}",
                switchyard_support::cli::error_line(e.as_ref())
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Watched from here on: an interrupted plan still writes the points that ran.
    let interrupts = watch_interrupts();
    match run(&cli, checked, &interrupts) {
        // Cut short: exit as a signal-stopped program does (its plan is written).
        Ok(Stopped::Early) => ExitCode::from(130),
        Ok(Stopped::Whole) => ExitCode::SUCCESS,
        Err(e) => {
            switchyard_support::errln!(
                "switchyard-plan: {}",
                switchyard_support::cli::error_line(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

/// What the signal watcher and the plan share.
#[derive(Default)]
struct Interrupts {
    /// Set by the first Ctrl-C, SIGTERM or SIGHUP: no further point starts.
    requested: AtomicBool,
    /// Set while the plan's files are written: a second signal then waits for them, so the
    /// folder never holds half of this plan beside half of an earlier one.
    writing: AtomicBool,
}

/// Watches Ctrl-C, SIGTERM and SIGHUP on a thread of its own. The first stops points from
/// starting; the points running finish and the plan of those that ran is written (the
/// process then exits 130). A second exits at once, unless the plan is being written.
/// Before, the first killed the plan and every finished point was lost.
fn watch_interrupts() -> Arc<Interrupts> {
    let interrupts = Arc::new(Interrupts::default());
    let shared = interrupts.clone();
    let (installed, handlers_ready) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                use tokio::signal::unix::{signal, SignalKind};
                // Installed here, before the plan goes on: from now on none is lost.
                let (Ok(mut interrupt), Ok(mut terminate), Ok(mut hang_up)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                    signal(SignalKind::hangup()),
                ) else {
                    return;
                };
                let _ = installed.send(());
                let mut first = true;
                loop {
                    let name = tokio::select! {
                        _ = interrupt.recv() => "Ctrl-C",
                        _ = terminate.recv() => "SIGTERM",
                        _ = hang_up.recv() => "SIGHUP",
                    };
                    if first {
                        first = false;
                        shared.requested.store(true, Ordering::SeqCst);
                        switchyard_support::errln!(
                            "switchyard-plan: {name}: no further point starts; the plan of the \
                             points that ran is written once the running ones finish (a second \
                             signal stops at once)"
                        );
                    } else if shared.writing.load(Ordering::SeqCst) {
                        switchyard_support::errln!(
                            "switchyard-plan: {name}: writing the plan; it stops once written"
                        );
                    } else {
                        switchyard_support::errln!("switchyard-plan: {name} again: stopped");
                        std::process::exit(130);
                    }
                }
            });
        });
    // Until the handlers are in, a signal keeps its default (the plan stops at once).
    if spawned.is_ok() {
        let _ = handlers_ready.recv_timeout(Duration::from_secs(5));
    }
    interrupts
}

fn check(cli: &Cli) -> Result<Checked> {
    let preset: PerfPreset = cli
        .perf_preset
        .parse()
        .map_err(|e| anyhow::anyhow!("--perf-preset: {e}"))?;
    for (name, value) in [
        ("--slo-ttft-ms", cli.slo_ttft_ms),
        ("--slo-itl-ms", cli.slo_itl_ms),
    ] {
        if !(value.is_finite() && value > 0.0) {
            bail!("{name} must be a positive number of ms, got {value}");
        }
    }
    if !(cli.max_minutes > 0.0 && cli.max_minutes * 60.0 <= switchyard_support::cli::MAX_SECONDS) {
        bail!(
            "--max-minutes must be above 0 and at most a year, got {}",
            cli.max_minutes
        );
    }
    if cli.jobs == Some(0) {
        bail!("--jobs must be at least 1");
    }
    if cli.slo_cost && !cli.modes.contains(&ServingMode::Conditional) {
        bail!("--slo-cost plans conditional serving: add conditional to --modes");
    }
    let space = PlanSpace {
        workers: cli.workers,
        modes: cli.modes.clone(),
        load_levels: cli.load_levels.clone(),
        thresholds: ThresholdGrid {
            eff_isl_thresholds: cli.sweep_thresholds.clone(),
            ratio_thresholds: cli.sweep_ratios.clone(),
        },
        slo_cost: cli.slo_cost,
    };
    let points = plan_points(&space)?.len();
    let workload = load_workload(&cli.workload, default_trace, cli.max_requests)?;
    workload
        .check_load_levels(cli.arrival_scale, &cli.load_levels)
        .map_err(anyhow::Error::msg)?;
    // Found now, not after a sweep of many minutes (and made only for a usable plan and
    // workload).
    std::fs::create_dir_all(&cli.out)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", cli.out.display()))?;
    let mut base = StackSpec::new(ServingMode::Agg, cli.workers, 0);
    base.preset = preset;
    base.seed = cli.workload.seed;
    base.arrival_scale = cli.arrival_scale;
    // slo_cost decides against the objectives the plan scores against.
    base.router.conditional.slo_itl_ms = cli.slo_itl_ms;
    base.router.conditional.slo_ttft_ms = cli.slo_ttft_ms;
    Ok(Checked {
        workload,
        base,
        space,
        slo: Slo {
            ttft_ms: Some(cli.slo_ttft_ms),
            itl_ms: Some(cli.slo_itl_ms),
        },
        points,
    })
}

/// Whether an interrupt left points of the plan unrun.
enum Stopped {
    /// Every point ran (or the time bound stopped them, which the plan says).
    Whole,
    /// An interrupt stopped points from starting.
    Early,
}

fn run(cli: &Cli, checked: Checked, interrupts: &Interrupts) -> Result<Stopped> {
    let Checked {
        workload,
        base,
        space,
        slo,
        points,
    } = checked;
    let jobs = cli
        .jobs
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
        // No more threads than points run at once.
        .min(points.max(1));
    switchyard_support::errln!(
        "{}: {} requests; {} workers ({} GPUs), {points} points on {jobs} threads, at most {} min",
        workload.name,
        workload.requests.len(),
        base.workers,
        base.gpus(),
        cli.max_minutes
    );
    if let Some(warning) = workload.span_warning() {
        switchyard_support::errln!("{warning}");
    }
    let bar = ProgressBar::new(points as u64);
    if cli.quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} points, {elapsed} ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let limit = Duration::from_secs_f64(cli.max_minutes * 60.0);
    // The one wall-clock read: the time bound is about the machine's time, not the model's.
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let interrupted = || interrupts.requested.load(Ordering::SeqCst);
    let out_of_time = || interrupted() || started.elapsed() >= limit;
    let on_point_done = |done: usize| bar.set_position(done as u64);
    let execution = Execution {
        jobs,
        out_of_time: &out_of_time,
        on_point_done: &on_point_done,
    };
    let source = PromptSource::synthetic(workload.content_seed);
    let outcome = plan_deployment(&workload, &source, &base, &space, slo, &execution)?;
    bar.finish_and_clear();
    interrupts.writing.store(true, Ordering::SeqCst);
    let markdown = write_plan(&cli.out, &outcome)?;
    interrupts.writing.store(false, Ordering::SeqCst);
    switchyard_support::outln!("{markdown}");
    let stopped_by = if interrupted() {
        "the interrupt"
    } else {
        "the time bound"
    };
    switchyard_support::errln!(
        "wrote {} ({} of {points} points not run before {stopped_by})",
        cli.out.display(),
        outcome.not_run()
    );
    if outcome.nothing_served() {
        // As switchyard-replay: a plan no request succeeded in is no result to act on.
        bail!(
            "no request succeeded at any point (the errors are in each point's report.json): \
             prompts or outputs beyond what the workers hold?"
        );
    }
    Ok(if interrupted() && outcome.not_run() > 0 {
        Stopped::Early
    } else {
        Stopped::Whole
    })
}
