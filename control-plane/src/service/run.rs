//! Wiring: router owner, NATS consumer and the two HTTP listeners (route API, admin API),
//! started together and stopped together. `main.rs` only parses flags, binds, connects and
//! calls [`run`]; tests call it in-process on `127.0.0.1:0`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::tokenize_lanes::TokenizeLanes;

use crate::api::{self, route::RequestIds, ApiState};
use crate::consumers::{self, Admission};
use crate::metrics::Metrics;
use crate::models::Models;
use crate::pools::first_polls::FirstPolls;
use crate::pools::PoolWatcher;
use crate::readiness::Readiness;
use crate::replicas::{self, ReplicaLink};
use crate::router::Router;
use crate::service::tokenizer::{
    load_model_tokenizer, PromptTokenizer, SegmentCacheStats, TokenizerLoadError,
    DEFAULT_MODEL_DIR_NAMED_BY,
};
use crate::settings::Settings;

/// The signal that stops the service, boxed. [`run`] and [`run_with_tokenizer`] take it
/// rather than `impl Future` on purpose: a generic body (the service, its warp filter chain,
/// hyper's server) would be compiled again in every crate that calls it, each test binary
/// included, at ~40 s apiece on 2 cores; non-generic and public, it is compiled once, here.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The tokenizer (model directory) could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerLoadError),
    /// `--conditional-disagg-config` is invalid.
    #[error("invalid --conditional-disagg-config: {0}")]
    Config(String),
    /// The registration secret cannot be read or is too short.
    #[error(transparent)]
    Registration(#[from] switchyard_bus::BusError),
    /// `--pool-file` does not load.
    #[error(transparent)]
    Pools(#[from] crate::pools::file::PoolFileError),
    /// The admin token cannot be loaded.
    #[error(transparent)]
    AdminToken(#[from] crate::api::auth::AdminTokenError),
    /// The listener has no local address.
    #[error("listener: {0}")]
    Listener(#[from] std::io::Error),
}

/// The two bound listeners: the route API for Envoy, the admin API for operators.
#[derive(Debug)]
pub struct Listeners {
    /// `--listen`: route verdicts, lifecycle reports, EDS, metrics, health.
    pub route: TcpListener,
    /// `--admin-listen`: config and workers behind the admin token, metrics, health.
    pub admin: TcpListener,
}

/// Loads the tokenizer from `--model-dir`, then serves until `shutdown` resolves (see
/// [`run_with_tokenizer`]).
///
/// # Errors
/// [`RunError`] when start-up fails; serving itself does not fail.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    nats: async_nats::Client,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let dir = settings.model_dir_or_default();
    let tokenizer =
        tokio::task::spawn_blocking(move || load_model_tokenizer(&dir, DEFAULT_MODEL_DIR_NAMED_BY))
            .await
            .map_err(|e| {
                RunError::Tokenizer(TokenizerLoadError {
                    dir: "?".into(),
                    named_by: DEFAULT_MODEL_DIR_NAMED_BY.into(),
                    message: e.to_string(),
                })
            })??;
    run_with_tokenizer(settings, tokenizer, listeners, nats, shutdown).await
}

pub use crate::models::DEFAULT_MAX_MODEL_LEN;

/// Tells the router owner whenever NATS can be heard or not (connected and echoing,
/// `switchyard_bus::watch_connection`), so it never expires a worker for heartbeats that could
/// not arrive.
async fn forward_reachability(
    nats: async_nats::Client,
    service: crate::service::ServiceHandle,
    readiness: Readiness,
    metrics: Metrics,
) {
    let (mut connected, poller) = switchyard_bus::watch_connection(nats.clone());
    loop {
        let reachable = *connected.borrow_and_update();
        readiness.nats_connected(reachable, tokio::time::Instant::now());
        readiness.nats_silent(!reachable && switchyard_bus::is_connected(&nats));
        let Ok(resyncs) = service.heartbeats_reachable(reachable).await else {
            break;
        };
        for resync in resyncs {
            consumers::carry_out_resync(&nats, &metrics, resync).await;
        }
        if connected.changed().await.is_err() {
            break;
        }
    }
    poller.abort();
}

/// A process-unique prefix for made-up request ids: the start time.
fn request_id_prefix() -> String {
    // Wall clock on purpose: ids must differ across restarts, which a monotonic clock
    // cannot promise. Read once at start.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos & u128::from(u64::MAX))
}

/// Serves the route and admin APIs on `listeners` and consumes worker messages from `nats` until `shutdown`
/// resolves; then stops accepting, gives in-flight requests `--shutdown-grace-secs` to
/// finish, and stops the consumer and the router owner.
///
/// `nats` may still be connecting (`retry_on_initial_connect`): HTTP serves regardless and
/// the consumer subscribes once NATS is reachable.
///
/// # Errors
/// [`RunError`] when start-up fails.
pub async fn run_with_tokenizer(
    settings: Settings,
    tokenizer: Arc<dyn PromptTokenizer>,
    listeners: Listeners,
    nats: async_nats::Client,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let admin_token = settings.admin_token()?;
    if admin_token.is_none() {
        tracing::warn!("no admin token (--admin-token-file or SWITCHYARD_ADMIN_TOKEN): the admin API refuses every config and workers request");
    }
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let config = settings
        .router_config()
        .map_err(|e| RunError::Config(e.to_string()))?;
    let admission = match (
        settings.registration.secret()?,
        settings.allow_unsigned_registrations,
    ) {
        (Some(secret), _) => Admission::Signed(secret),
        (None, true) => {
            tracing::warn!("--allow-unsigned-registrations: any NATS client can register a worker and receive prompts; use --registration-secret-file outside development");
            Admission::Unsigned
        }
        (None, false) => {
            tracing::warn!(
                "no --registration-secret-file: heartbeats from NATS register no worker"
            );
            Admission::Closed
        }
    };
    let models = Arc::new(Models::single(
        settings.model_dir_or_default(),
        tokenizer,
        settings.max_model_len,
    ));
    tracing::info!(
        max_model_len = models.default_model().max_model_len,
        "longer prompts and larger max_tokens are refused"
    );
    let router = Router::with_config(config, settings.seed);
    let (link, updates) = match &settings.replica_id {
        Some(id) => {
            tracing::info!(replica = %id, "one of several replicas: decisions, lifecycle reports and config shared over NATS");
            let (link, updates) = ReplicaLink::new(metrics.clone());
            (Some(link), Some(updates))
        }
        None => (None, None),
    };
    let (service, owner) = super::spawn(router, metrics.clone(), settings.heartbeat_misses, link);
    let mut replica_tasks = Vec::new();
    if let (Some(id), Some(updates)) = (&settings.replica_id, updates) {
        let me = replicas::ReplicaIdentity::new(id.clone());
        replica_tasks.push(tokio::spawn(replicas::publish(
            nats.clone(),
            me.clone(),
            updates,
            metrics.clone(),
        )));
        replica_tasks.push(tokio::spawn(replicas::subscribe(
            nats.clone(),
            me,
            service.clone(),
            metrics.clone(),
        )));
        replica_tasks.push(tokio::spawn(replicas::config_store::follow(
            nats.clone(),
            service.clone(),
            metrics.clone(),
        )));
    }
    let readiness = Readiness::default();
    let needs_nats = settings.replica_id.is_some() || !matches!(admission, Admission::Closed);
    let consumer = tokio::spawn(consumers::run(
        nats.clone(),
        service.clone(),
        metrics.clone(),
        admission,
    ));
    let reachability = tokio::spawn(forward_reachability(
        nats.clone(),
        service.clone(),
        readiness.clone(),
        metrics.clone(),
    ));
    let mut first_polls = FirstPolls::open();
    let pools = match &settings.pool_file {
        Some(file) => {
            let pools = crate::pools::load(file)?;
            let declared = {
                let (models, pools) = (Arc::clone(&models), pools.clone());
                tokio::task::spawn_blocking(move || models.load_declared(&pools))
                    .await
                    .map_err(|e| {
                        RunError::Tokenizer(TokenizerLoadError {
                            dir: "?".into(),
                            named_by: format!("the pool file {}", file.display()),
                            message: e.to_string(),
                        })
                    })??
            };
            models.install(declared);
            tracing::info!(file = %file.display(), workers = pools.workers.len(), models = ?models.names(), "pool file loaded");
            // A first poll takes at most the health timeout; a second's margin for the rest.
            first_polls = FirstPolls::until(
                tokio::time::Instant::now(),
                Duration::from_millis(pools.health.timeout_ms) + Duration::from_secs(1),
            );
            let watcher = PoolWatcher::start(
                file.clone(),
                pools,
                service.clone(),
                metrics.clone(),
                Arc::clone(&models),
                first_polls.clone(),
            )
            .await;
            Some(tokio::spawn(
                watcher.watch(Duration::from_millis(settings.pool_reload_ms)),
            ))
        }
        None => None,
    };

    let permits = usize::try_from(settings.route_tokenize_threads)
        .unwrap_or(1)
        .max(1);
    let state = ApiState {
        service,
        models,
        tokenize_lanes: TokenizeLanes::new(permits),
        metrics: metrics.clone(),
        registry: Arc::new(registry),
        nats,
        max_route_body_bytes: settings.max_route_body_bytes,
        request_ids: Arc::new(RequestIds::new(request_id_prefix())),
        cache_stats_seen: Arc::new(Mutex::new(SegmentCacheStats::default())),
        first_polls,
        admin_token,
        recent: Arc::new(Mutex::new(crate::status::RecentDecisions::default())),
        started: tokio::time::Instant::now(),
        readiness: readiness.clone(),
        needs_nats,
        ready_after_ms: settings.ready_after_ms,
        replica_id: settings.replica_id.clone(),
        whatif_dir: settings.whatif_dir.as_deref().map(Arc::from),
    };
    match &state.whatif_dir {
        Some(dir) if api::whatif::is_complete(dir) => {
            tracing::info!(dir = %dir.display(), "status page what-if served");
        }
        Some(dir) => {
            tracing::warn!(dir = %dir.display(), "--whatif-dir lacks the what-if module (scripts/build-whatif.sh builds it): the status page says it is unavailable");
        }
        None => {}
    }

    let readiness_watch = tokio::spawn(api::admin::watch_readiness(state.clone()));
    let route_addr = listeners.route.local_addr()?;
    let admin_addr = listeners.admin.local_addr()?;
    tracing::info!(route = %route_addr, admin = %admin_addr, "listening");
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut stop_rx: watch::Receiver<bool>| async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    let route_server = switchyard_support::http_server::serve(
        listeners.route,
        api::route_api(state.clone()),
        stopped(stop_rx.clone()),
    );
    let admin_server = switchyard_support::http_server::serve(
        listeners.admin,
        api::admin_api(state),
        stopped(stop_rx),
    );
    // Both listeners serve until shutdown, then drain together.
    let mut server = Box::pin(async move {
        tokio::join!(route_server, admin_server);
    });
    tokio::select! {
        () = &mut server => tracing::warn!("HTTP servers stopped by themselves"),
        () = shutdown => {
            let delay = settings.shutdown_delay();
            let mut served_on = true;
            if !delay.is_zero() {
                // Not ready first, still serving, so Envoy moves route calls elsewhere
                // before this replica stops taking them (see `crate::readiness`).
                readiness.stopping();
                metrics.ready.set(0);
                tracing::info!(delay_ms = delay.as_millis() as u64, "shutting down: not ready, still serving");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = &mut server => {
                        tracing::warn!("HTTP servers stopped by themselves");
                        served_on = false;
                    }
                }
            }
            // A finished server is not polled again (that would panic).
            if served_on {
                tracing::info!(grace_secs = settings.shutdown_grace_secs, "shutting down: draining HTTP requests");
                let _ = stop_tx.send(true);
                if tokio::time::timeout(settings.shutdown_grace(), &mut server).await.is_err() {
                    tracing::warn!("grace period over; dropping unfinished requests");
                }
            }
        }
    }
    drop(server);
    consumer.abort();
    reachability.abort();
    readiness_watch.abort();
    for task in &replica_tasks {
        task.abort();
    }
    if let Some(pools) = pools {
        pools.abort();
        let _ = pools.await;
    }
    let _ = consumer.await;
    let _ = reachability.await;
    // The last ServiceHandle went with the server and the consumer: the owner ends.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), owner).await;
    tracing::info!("stopped");
    Ok(())
}
