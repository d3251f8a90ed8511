//! `switchyard-control-plane`: parses flags, sets up logging, binds, connects to NATS and
//! calls [`switchyard_control_plane::service::run`]. Exits 64 (EX_USAGE) on bad flags or
//! config, 1 on other start-up failures.

use std::process::ExitCode;

use clap::Parser;

use switchyard_control_plane::service::{self, RunError};
use switchyard_control_plane::settings::{LogFormat, Settings};

// Prompt tokenization and template rendering are allocation-heavy; see the workspace
// Cargo.toml for the measurement behind this choice.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// EX_USAGE from sysexits.h: the command was used incorrectly.
const EXIT_USAGE: u8 = 64;

/// Binds `addr` (the value of `flag`), logging why it cannot.
async fn bind(flag: &str, addr: std::net::SocketAddr) -> Option<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .inspect_err(|e| tracing::error!(%addr, flag, error = %e, "cannot bind"))
        .ok()
}

fn init_logging(format: LogFormat) {
    // async-nats logs every failed reconnect (an ERROR a second while credentials are
    // refused, an INFO a second while no server listens); the bus's event callback says each
    // connection state once instead, whatever level RUST_LOG asks for.
    // A RUST_LOG the filter cannot parse gets the default, async-nats kept quiet too.
    let quiet = ["async_nats"];
    let rust_log = std::env::var("RUST_LOG").ok();
    let log_filter = switchyard_support::cli::log_filter;
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(rust_log.as_deref(), &quiet))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_filter(None, &quiet)));
    // Colour codes only on a terminal: a log file or collector would keep them as text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.event_format(JsonLines).init(),
    }
}

/// One JSON object per log line: `ts` (Unix seconds), `level`, `target`, then the event's
/// fields (`message` included). Written here because tracing-subscriber's own JSON output
/// needs an extra feature and crate.
struct JsonLines;

struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        // Log timestamps are wall-clock by definition.
        #[allow(clippy::disallowed_methods)]
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let meta = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert("ts".into(), ts.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        event.record(&mut JsonFields(&mut line));
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let settings = match Settings::try_parse() {
        Ok(s) => s,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return if usage {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS // --help, --version
            };
        }
    };
    init_logging(settings.log_format);
    // Fail fast on bad config, before binding or connecting anything.
    if let Err(e) = settings.router_config() {
        eprintln!("error: invalid --conditional-disagg-config: {e}");
        return ExitCode::from(EXIT_USAGE);
    }

    if let Err(e) = settings.admin_token() {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    if settings.admin_listen == settings.listen {
        eprintln!(
            "error: --admin-listen must differ from --listen (the admin API has its own listener)"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let (route, admin) = match (
        bind("--listen", settings.listen).await,
        bind("--admin-listen", settings.admin_listen).await,
    ) {
        (Some(route), Some(admin)) => (route, admin),
        _ => return ExitCode::FAILURE,
    };
    let listeners = service::Listeners { route, admin };
    // Connect in the background and keep retrying: the route API must serve (and the
    // filter fail open on stale state at worst) while NATS is unreachable.
    if !settings.nats.has_credentials() {
        tracing::warn!("connecting to NATS without credentials (see --nats-token-file and docs/control-plane.md)");
    }
    let nats = match switchyard_bus::connect(
        &settings.nats,
        "switchyard-control-plane",
        switchyard_bus::log_event,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match service::run(settings, listeners, nats, Box::pin(shutdown_signal())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(
            e @ (RunError::Config(_)
            | RunError::Tokenizer(_)
            | RunError::Registration(_)
            | RunError::AdminToken(_)
            | RunError::Pools(_)),
        ) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
