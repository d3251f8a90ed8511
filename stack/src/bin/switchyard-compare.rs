//! `switchyard-compare`: aggregated vs disaggregated vs conditional serving on the real
//! local stack (nats-server, control plane, simulated workers, Envoy with the filter).
//!
//! Each mode gets a fresh stack with the same workers, the same workload is replayed through
//! the gateway, and the comparison (tables, JSON, interactivity-vs-throughput plots) goes to
//! `--out`. `--cross-check` also replays every run in virtual time and prints the ratios.
//! **Simulated workers**: see `docs/benchmarks.md`. Bad input exits with 64; Ctrl-C stops
//! every process the runs started.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use switchyard_filter::config::MAX_ROUTE_TIMEOUT_MS;
use switchyard_loadgen::report::Slo;
use switchyard_loadgen::{ArrivalScale, LoadLevel, WorkloadArgs};
use switchyard_stack::compare::output::comparison_markdown;
use switchyard_stack::compare::workload::default_trace;
use switchyard_stack::compare::{run_comparison, CompareConfig, CompareError, WorkloadSpec};
use switchyard_stack::{stop_children_on_signal, Profile, ServingMode, SpeedUp};
use switchyard_support::cli::{parse_args, EXIT_USAGE};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProfileArg {
    Debug,
    Release,
}

/// Compare agg, disagg and conditional serving on the local stack (simulated workers).
#[derive(Debug, Parser)]
// A flag given twice takes its last value, so `scripts/demo.sh --max-requests 400` overrides
// the demo's own `--max-requests 200`; the list flags use `ArgAction::Set` so that a second
// `--load-levels` replaces the demo's list instead of appending to it.
#[command(
    name = "switchyard-compare",
    version,
    args_override_self = true,
    allow_negative_numbers = true
)]
struct Cli {
    /// Workload: `--trace PATH` (default:
    /// data/mooncake_conversation_trace.jsonl) or `--agentic` with its knobs.
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Workers in every mode (equal GPUs).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Share of the workers that prefill in disagg and conditional mode.
    #[arg(long, default_value_t = 0.25)]
    prefill_ratio: f64,
    /// Modes to run, comma-separated.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "agg,disagg,conditional")]
    modes: Vec<ServingMode>,
    /// Keep only the first N requests.
    #[arg(long, default_value_t = 200)]
    max_requests: usize,
    /// How many times faster than the modelled hardware the simulated workers run; reported
    /// times are converted back to modelled time.
    #[arg(
        long,
        alias = "time-scale",
        env = "SWITCHYARD_SPEED_UP",
        default_value = "4"
    )]
    speed_up: SpeedUp,
    /// Multiplies the workload's arrival and think times (0.5 = twice its rate).
    #[arg(long, default_value_t = ArrivalScale::PLANNED)]
    arrival_scale: ArrivalScale,
    /// Offered-load multipliers (2 = twice the load at --arrival-scale); each mode runs once
    /// per level (for the plot).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "1")]
    load_levels: Vec<LoadLevel>,
    /// TTFT objective for goodput, modelled ms.
    #[arg(long, value_parser = switchyard_support::cli::objective_ms)]
    slo_ttft_ms: Option<f64>,
    /// ITL objective for goodput, modelled ms.
    #[arg(long, value_parser = switchyard_support::cli::objective_ms)]
    slo_itl_ms: Option<f64>,
    /// Router config JSON for the control plane (`--conditional-disagg-config`).
    #[arg(long)]
    conditional_disagg_config: Option<String>,
    /// Which target/ binaries to run.
    #[arg(long, value_enum, default_value_t = ProfileArg::Release)]
    profile: ProfileArg,
    /// The filter's route call timeout, wall ms (a request whose verdict is later fails
    /// open and is counted as `fail-open`).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_ROUTE_TIMEOUT_MS))]
    route_timeout_ms: u64,
    /// Output folder (default: results/compare-<UTC timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Nothing is sent after this many wall seconds of a run.
    #[arg(long, default_value_t = 120.0)]
    max_run_s: f64,
    /// Wall seconds in-flight requests get after --max-run-s.
    #[arg(long, default_value_t = 30.0)]
    drain_s: f64,
    /// Per-request limit, wall seconds.
    #[arg(long, default_value_t = 60.0)]
    request_timeout_s: f64,
    /// Also replay every run in virtual time and print real/virtual p50 TTFT and ITL.
    #[arg(long)]
    cross_check: bool,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli: Cli = match parse_args() {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    let config = match config(cli) {
        Ok(c) => c,
        Err(e) => {
            switchyard_support::errln!("switchyard-compare: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Ctrl-C / SIGTERM: every stack process is stopped before exiting.
    stop_children_on_signal();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            switchyard_support::errln!("switchyard-compare: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_comparison(&config)) {
        Ok(comparison) => {
            switchyard_support::outln!("{}", comparison_markdown(&config, &comparison));
            switchyard_support::errln!("wrote {}", config.out.display());
            ExitCode::SUCCESS
        }
        Err(
            e @ (CompareError::InvalidSetting(_)
            | CompareError::Plan(_)
            | CompareError::Workload(_)),
        ) => {
            switchyard_support::errln!("switchyard-compare: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            switchyard_support::errln!("switchyard-compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config(cli: Cli) -> Result<CompareConfig, String> {
    let workload = match cli.workload.trace_or(default_trace) {
        Some(path) => {
            if !path.exists() {
                return Err(format!("trace {} not found (give --trace)", path.display()));
            }
            WorkloadSpec::Trace {
                path,
                block_tokens: cli.workload.block_tokens,
                form: cli.workload.trace_form,
            }
        }
        None => WorkloadSpec::Agentic(cli.workload.agentic_config()?),
    };
    let modes = cli.modes.clone();
    let out = cli
        .out
        .unwrap_or_else(|| PathBuf::from("results").join(format!("compare-{}", utc_stamp())));
    let mut config = CompareConfig::new(workload, out);
    config.seed = cli.workload.seed;
    config.max_requests = Some(cli.max_requests);
    config.workers = cli.workers;
    config.prefill_ratio = cli.prefill_ratio;
    config.modes = modes;
    config.load_levels = cli.load_levels;
    config.speed_up = cli.speed_up;
    config.arrival_scale = cli.arrival_scale;
    config.slo = Slo {
        ttft_ms: cli.slo_ttft_ms,
        itl_ms: cli.slo_itl_ms,
    };
    config.conditional_disagg_config = cli.conditional_disagg_config;
    config.profile = match cli.profile {
        ProfileArg::Debug => Profile::Debug,
        ProfileArg::Release => Profile::Release,
    };
    config.route_timeout_ms = cli.route_timeout_ms;
    config.max_run_s = cli.max_run_s;
    config.drain_s = cli.drain_s;
    config.request_timeout_s = cli.request_timeout_s;
    config.cross_check = cli.cross_check;
    config.progress = !cli.quiet;
    // Settings are checked before anything starts.
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// `YYYYMMDD-HHMMSS` in UTC, for the default output folder name.
#[allow(clippy::disallowed_methods)] // naming a results folder needs the wall clock
fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
