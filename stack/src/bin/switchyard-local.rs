//! `switchyard-local`: the whole Switchyard stack on this machine, in the foreground.
//!
//! Starts nats-server, the control plane, simulated workers (simulated: no GPU, a
//! performance model) and Envoy with the filter, prints where to send requests, and stays
//! the parent of every process until Ctrl-C, SIGTERM or SIGHUP. Then the gateway takes no
//! new connections, the requests in flight through it may finish (bounded; a second signal
//! stops at once), and every process is stopped.

use std::path::PathBuf;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use switchyard_filter::config::MAX_ROUTE_TIMEOUT_MS;
use switchyard_stack::{Profile, ServingMode, SpeedUp, StackBuilder, StackError};

/// Run the local Switchyard stack (Envoy + filter, control plane, NATS, simulated workers).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Simulated decode workers.
    #[arg(long, default_value_t = 2)]
    decode: usize,
    /// Simulated prefill workers.
    #[arg(long, default_value_t = 0)]
    prefill: usize,
    /// Simulated aggregated workers.
    #[arg(long, default_value_t = 0)]
    agg: usize,
    /// The control plane's serving mode.
    #[arg(long, value_enum, default_value_t = ServingMode::Conditional)]
    serving_mode: ServingMode,
    /// JSON policy config for conditional serving (`--conditional-disagg-config`).
    #[arg(long)]
    conditional_disagg_config: Option<String>,
    /// Envoy listener port (default: a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Envoy admin port (default: a free one).
    #[arg(long)]
    admin_port: Option<u16>,
    /// Control plane port (default: a free one).
    #[arg(long)]
    control_plane_port: Option<u16>,
    /// Control plane admin port (default: a free one).
    #[arg(long)]
    control_plane_admin_port: Option<u16>,
    /// The first simulated worker's port; the workers take consecutive ports from it,
    /// decode workers first, then prefill, then aggregated (default: free ones).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    worker_ports_from: Option<u16>,
    /// nats-server port (default: a free one).
    #[arg(long)]
    nats_port: Option<u16>,
    /// Control-plane replicas behind Envoy (active-active: decisions, lifecycle reports and
    /// config shared over NATS).
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=switchyard_stack::MAX_CONTROL_PLANES as i64))]
    control_planes: u16,
    /// Run `target/release` binaries (build with `cargo build --workspace --bins --release`).
    #[arg(long)]
    release: bool,
    /// How many times faster than the modelled hardware the simulated workers run (every
    /// time measured from outside is then that many times shorter than modelled).
    #[arg(long, alias = "time-scale", env = "SWITCHYARD_SPEED_UP")]
    speed_up: Option<SpeedUp>,
    /// The filter's route call timeout in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=MAX_ROUTE_TIMEOUT_MS))]
    route_timeout_ms: u64,
    /// On Ctrl-C, SIGTERM or SIGHUP, how long the requests in flight through the gateway
    /// may run on before everything stops (the gateway takes no new connections meanwhile;
    /// a second signal stops at once). 0 stops at once.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
    shutdown_grace_secs: u64,
    /// Directory for logs and generated config (default: a new one under the temp dir).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// A filter configuration key, `KEY=JSON` (e.g. `prefill_retries=2`,
    /// `prefill_timeout_ms=5000`); repeatable. Keys are listed in docs/gateway.md.
    #[arg(long = "filter-setting", value_parser = parse_filter_setting)]
    filter_settings: Vec<(String, serde_json::Value)>,
}

/// `KEY=JSON`; a value that is not JSON is taken as a string.
fn parse_filter_setting(raw: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = raw
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {raw:?}"))?;
    if key.is_empty() {
        return Err(format!("empty key in {raw:?}"));
    }
    // A key with a flag of its own: two places to set it would mean one silently losing.
    if key == "route_timeout_ms" {
        return Err("route_timeout_ms has its own flag: use --route-timeout-ms".into());
    }
    let value = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    Ok((key.to_string(), value))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // Bad flags exit 64, as every Switchyard binary's do.
    let args: Args = match switchyard_support::cli::parse_args() {
        Ok(args) => args,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            switchyard_support::errln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<StoppedDuringStartUp>() => {
            // What was started is stopped by then (the builder's future was dropped).
            switchyard_support::errln!("{e}");
            ExitCode::from(130)
        }
        Err(e) => {
            // One line, causes included; no backtrace even under RUST_BACKTRACE=1 (these
            // are the user's errors, not the program's).
            switchyard_support::errln!(
                "error: {}",
                switchyard_support::cli::error_line(e.as_ref())
            );
            if is_usage_error(&e) {
                ExitCode::from(switchyard_support::cli::EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A signal that came while the stack was starting.
#[derive(Debug, thiserror::Error)]
#[error("{0} during start-up: stopped everything")]
struct StoppedDuringStartUp(&'static str);

/// Whether `error` is the user's settings at fault (exit 64) rather than a failed run: a
/// setting the stack refuses, or a component that refused its configuration (the control
/// plane exits 64 on one).
fn is_usage_error(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StackError>(),
            Some(StackError::InvalidSetting(_))
        ) || matches!(
            cause.downcast_ref::<StackError>(),
            Some(StackError::Exited { status, .. }) if status.ends_with(": 64")
        )
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut builder = StackBuilder::new()
        .decode_workers(args.decode)
        .prefill_workers(args.prefill)
        .agg_workers(args.agg)
        .serving_mode(args.serving_mode)
        .profile(if args.release {
            Profile::Release
        } else {
            Profile::Debug
        })
        .route_timeout_ms(args.route_timeout_ms)
        .control_planes(usize::from(args.control_planes));
    if let Some(v) = args.conditional_disagg_config {
        builder = builder.conditional_disagg_config(v);
    }
    if let Some(v) = args.port {
        builder = builder.listen_port(v);
    }
    if let Some(v) = args.admin_port {
        builder = builder.admin_port(v);
    }
    if let Some(v) = args.control_plane_port {
        builder = builder.control_plane_port(v);
    }
    if let Some(v) = args.control_plane_admin_port {
        builder = builder.control_plane_admin_port(v);
    }
    if let Some(v) = args.worker_ports_from {
        builder = builder.first_worker_port(v);
    }
    if let Some(v) = args.nats_port {
        builder = builder.nats_port(v);
    }
    if let Some(v) = args.speed_up {
        builder = builder.speed_up(v);
    }
    if let Some(v) = args.run_dir {
        builder = builder.run_dir(v);
    }
    for (key, value) in args.filter_settings {
        builder = builder.filter_setting(&key, value);
    }

    // Signals are watched from the start, so a Ctrl-C during start-up also stops what began.
    let mut signals = Signals::install()?;
    let stack = tokio::select! {
        started = builder.start() => started.context("starting the stack")?,
        signal = signals.next() => return Err(StoppedDuringStartUp(signal).into()),
    };

    switchyard_support::outln!(
        "Switchyard is up (simulated workers; logs in {}).",
        stack.run_dir().display()
    );
    for worker in stack.workers() {
        switchyard_support::outln!(
            "  worker {:<10} {:<8} {}",
            worker.id.0,
            worker.role.as_str(),
            worker.address
        );
    }
    switchyard_support::outln!("  control plane  {} (route API)", stack.control_plane_url());
    for replica in 1..stack.control_planes() {
        switchyard_support::outln!(
            "  replica cp-{replica}   {} (route API), {} (admin API)",
            stack.control_plane_replica_url(replica),
            stack.control_plane_replica_admin_url(replica)
        );
    }
    switchyard_support::outln!(
        "  admin API      {} (token: {})",
        stack.control_plane_admin_url(),
        stack
            .run_dir()
            .join(switchyard_stack::ADMIN_TOKEN_FILE)
            .display()
    );
    switchyard_support::outln!("  envoy admin    {}", stack.admin_url());
    switchyard_support::outln!("  nats           {}", stack.nats_url());
    switchyard_support::outln!();
    switchyard_support::outln!("Send requests to {}, e.g.:", stack.gateway_url());
    switchyard_support::outln!(
        "  curl -sN -i {}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"qwen3\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":16,\"stream\":true}}'",
        stack.gateway_url()
    );
    if !args.release {
        // A burst of long cold prompts takes the debug control plane past the route timeout,
        // and the gateway then fails open: a user measuring routing would measure that.
        switchyard_support::outln!(
            "These are debug builds: long prompts tokenize slower than in a release build, and \
             a route call over --route-timeout-ms ({} ms) fails open \
             (x-switchyard-route: fail-open;reason=timeout). To put load on it, build with \
             --release and run with --release.",
            args.route_timeout_ms
        );
    }
    if args.shutdown_grace_secs == 0 {
        switchyard_support::outln!("Ctrl-C stops everything.");
    } else {
        switchyard_support::outln!(
            "Ctrl-C stops everything (the requests in flight may finish first, up to {} s; \
             Ctrl-\\ stops at once).",
            args.shutdown_grace_secs
        );
    }

    let mut stack = stack;
    let mut health = tokio::time::interval(std::time::Duration::from_secs(1));
    let started = tokio::time::Instant::now();
    let why = loop {
        tokio::select! {
            signal = signals.next() => break signal,
            _ = health.tick() => {
                // A child that dies is named, with why and its log's end; the others keep
                // serving (the gateway fails open around a dead control plane, say).
                for exited in stack.reap_exited() {
                    switchyard_support::errln!(
                        "switchyard-local: {exited}\n({} s after start; the rest keeps running, Ctrl-C stops it)",
                        started.elapsed().as_secs()
                    );
                }
            }
        }
    };
    let grace = std::time::Duration::from_secs(args.shutdown_grace_secs);
    if !grace.is_zero() && why != QUIT {
        drain_gateway(&stack, why, grace, &mut signals).await;
    }
    // A child that died while the gateway drained is named too (the health loop is over).
    for exited in stack.reap_exited() {
        switchyard_support::errln!("switchyard-local: {exited}");
    }
    stack.shutdown();
    switchyard_support::outln!("{why}: stopped everything");
    Ok(())
}

/// The signals that stop the launcher. SIGHUP too (the terminal closed): nats-server takes
/// it for "reload" and would outlive the launcher. Each is a stream installed once, so one
/// that comes while nothing waits on it is kept for the next wait, not lost.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hang_up: tokio::signal::unix::Signal,
    /// Ctrl-\ in a terminal: stop at once, without the drain. Unhandled, it ended the
    /// launcher alone (the stack's processes are in groups of their own) and left the rest
    /// running.
    quit: tokio::signal::unix::Signal,
}

/// The name [`Signals::next`] gives SIGQUIT: a stop that skips the drain.
const QUIT: &str = "SIGQUIT";

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            hang_up: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
            quit: signal(SignalKind::quit()).context("installing the SIGQUIT handler")?,
        })
    }

    /// The next stop signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "Ctrl-C",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hang_up.recv() => "SIGHUP",
            _ = self.quit.recv() => QUIT,
        }
    }
}

/// Lets the workers finish the requests in flight through the gateway before the stop:
/// Envoy takes no new connections and closes each open one after its current response
/// ([`switchyard_stack::Stack::close_gateway`]), and the launcher waits up to `grace` for
/// those requests to end. A second signal ends the wait, and so does Envoy's admin interface
/// not answering. Stopping Envoy first without this cut every stream the workers could have
/// finished.
async fn drain_gateway(
    stack: &switchyard_stack::Stack,
    why: &str,
    grace: std::time::Duration,
    signals: &mut Signals,
) {
    let drain = async {
        let in_flight = stack.close_gateway().await?;
        if in_flight == 0 {
            return Ok((0, 0));
        }
        switchyard_support::outln!(
            "{why}: the gateway takes no new connections; waiting up to {} s for {in_flight} request(s) in flight (a second signal stops at once)",
            grace.as_secs()
        );
        let left = stack.wait_gateway_idle(grace).await?;
        Ok::<_, StackError>((in_flight, left))
    };
    // The admin calls around the wait are bounded too: the whole drain stays within the
    // grace plus a few of their timeouts.
    let bound = grace + 3 * switchyard_stack::ENVOY_ADMIN_TIMEOUT;
    tokio::select! {
        drained = tokio::time::timeout(bound, drain) => match drained {
            Ok(Ok((0, _))) => {}
            Ok(Ok((_, 0))) => switchyard_support::outln!("every request in flight ended"),
            Ok(Ok((_, left))) => switchyard_support::outln!(
                "{left} request(s) still in flight after {} s: cut",
                grace.as_secs()
            ),
            Ok(Err(e)) => switchyard_support::errln!(
                "switchyard-local: cannot drain the gateway, stopping at once: {}",
                switchyard_support::cli::error_line(&e)
            ),
            Err(_) => switchyard_support::outln!(
                "the gateway did not drain within {} s: stopping",
                bound.as_secs()
            ),
        },
        signal = signals.next() => switchyard_support::outln!("{signal}: stopping at once"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_filter_setting;

    #[test]
    fn filter_settings_parse_as_json_or_string() {
        assert_eq!(
            parse_filter_setting("prefill_retries=2"),
            Ok(("prefill_retries".to_string(), serde_json::json!(2)))
        );
        assert_eq!(
            parse_filter_setting("prefill_cluster=pf"),
            Ok(("prefill_cluster".to_string(), serde_json::json!("pf")))
        );
        assert!(parse_filter_setting("no-equals").is_err());
        assert!(parse_filter_setting("=1").is_err());
        let own_flag = parse_filter_setting("route_timeout_ms=50").unwrap_err();
        assert!(own_flag.contains("--route-timeout-ms"), "{own_flag}");
    }
}
