//! The task that owns the [`Router`]; everyone else sends it a [`Command`].
//!
//! One owner means no locks around the router and a total order of events (a heartbeat, then
//! the KV events it unlocked, then a route call see each other's effects in that order). The
//! owner only does index math: tokenization, JSON and HTTP happen on the callers' tasks, so a
//! 32k-token prompt being tokenized never delays another request's verdict.
//!
//! Time: the owner reads tokio's clock (so tests can pause it) and hands the router
//! milliseconds since the service started.

mod owner;
pub mod run;
pub mod tokenizer;

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::lifecycle::LifecycleBatch;
use switchyard_protocol::replica::ReplicaUpdate;
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat, WorkerId, WorkerInfo};

use crate::config::{ConfigError, RouterConfig};
use crate::config_version::{IfMatch, PatchRefusal};
use crate::load::WorkerLoad;
use crate::metrics::Metrics;
use crate::replicas::ReplicaLink;
use owner::Owner;

use crate::router::core::{HeartbeatOutcome, KvBatchOutcome};
use crate::router::{Prompt, RouteError, Routed, Router, WorkerView};
use switchyard_protocol::hash::{BlockSize, SequenceHash};

pub use run::{run, run_with_tokenizer, Listeners, RunError, Shutdown};

/// How often the owner ticks the control core (looks for workers whose heartbeats stopped).
pub const EXPIRY_TICK: Duration = Duration::from_millis(switchyard_router::core::TICK_MS);

/// Commands queued to the owner task before callers wait.
const COMMAND_QUEUE: usize = 4_096;

/// One request to the router owner. Each carries its own reply channel.
#[derive(Debug)]
pub enum Command {
    /// A worker heartbeat (registration or refresh).
    Heartbeat {
        /// The message as received.
        heartbeat: WorkerHeartbeat,
        /// What changed, and the resync it calls for.
        reply: oneshot::Sender<HeartbeatOutcome>,
    },
    /// A declared worker passed its health check (registration or refresh).
    Declared {
        /// The worker as the pool file and its engine describe it.
        worker: WorkerInfo,
        /// How long it stays live unless confirmed again.
        expires_after_ms: u64,
        /// What changed.
        reply: oneshot::Sender<HeartbeatOutcome>,
    },
    /// The ids the pool file declares now (see `ControlCore::set_declared_ids`).
    DeclaredIds {
        /// Every declared worker's id.
        ids: std::collections::HashSet<WorkerId>,
        /// Workers registered by heartbeat under a newly declared id, taken out of the pools.
        reply: oneshot::Sender<Vec<WorkerId>>,
    },
    /// A declared worker leaves the pools and the index (unhealthy, or no longer declared).
    Withdraw {
        /// Which worker.
        worker: WorkerId,
        /// Whether it was there.
        reply: oneshot::Sender<bool>,
    },
    /// A batch of KV events from one worker.
    KvBatch {
        /// The batch as received.
        batch: KvEventBatch,
        /// Applied or rejected, and the resync it calls for.
        reply: oneshot::Sender<KvBatchOutcome>,
    },
    /// A worker's load report (no reply: nothing for the sender to act on).
    Load {
        /// The report as received.
        report: LoadReport,
    },
    /// Lifecycle milestones from the filter.
    Lifecycle {
        /// The batch as received.
        batch: LifecycleBatch,
    },
    /// Decide where a tokenized prompt goes.
    Route {
        /// The request.
        request: RouteRequest,
        /// The verdict (with the policy's call, for the status page), or why there is none.
        reply: oneshot::Sender<Result<Routed, RouteError>>,
    },
    /// Whether heartbeats can reach the control plane (its NATS connection is up). While
    /// they cannot, no worker is expired for silence.
    HeartbeatsReachable {
        /// Connected or not.
        reachable: bool,
        /// The resyncs to ask for (every worker, when NATS is back after an outage).
        reply: oneshot::Sender<Vec<crate::router::core::Resync>>,
    },
    /// Snapshot of live workers.
    Workers {
        /// The workers, ordered by id.
        reply: oneshot::Sender<Vec<WorkerEntry>>,
    },
    /// The current router config and its shared version (0: not shared).
    Config {
        /// The config.
        reply: oneshot::Sender<(RouterConfig, u64)>,
    },
    /// Another replica's update (see [`crate::replicas`]).
    Peer {
        /// The update as received.
        update: ReplicaUpdate,
    },
    /// A version of the shared config (see [`crate::replicas::config_store`]): applied if
    /// newer than the one in force.
    SetSharedConfig {
        /// The config.
        config: RouterConfig,
        /// Its version.
        version: u64,
        /// Whether it is what the store holds now (just written, or read directly), so that
        /// it applies even when its version is below ours: the store's revisions restarted.
        /// A watched revision may be an older one arriving late, and is not.
        current: bool,
        /// Done (or refused: the owner validates again).
        reply: oneshot::Sender<Result<(), ConfigError>>,
    },
    /// New workers whose first KV dump is still awaited (readiness).
    DumpsPending {
        /// How many.
        reply: oneshot::Sender<usize>,
    },
    /// Applies a JSON merge patch to the router config (absent fields keep their value).
    PatchConfig {
        /// The patch as received.
        patch: serde_json::Value,
        /// The version the change was made on (`If-Match`), if given.
        if_match: Option<IfMatch>,
        /// The new config and its version, or why it was refused (config unchanged).
        reply: oneshot::Sender<Result<(RouterConfig, u64), PatchRefusal>>,
    },
}

/// A request to route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRequest {
    /// Request id to echo and track.
    pub request_id: String,
    /// The filter's number for this call (`ROUTE_CALL_HEADER`), if it sent one.
    pub route_call: Option<u64>,
    /// The prompt, tokenized here or hashed by the filter.
    pub prompt: RoutePrompt,
    /// Choices the client asked for (`n`).
    pub choices: u32,
    /// The declared model it is for: only that model's workers serve it. `None` without
    /// declared models (every worker).
    pub model: Option<String>,
    /// Only show the verdict: nothing booked, shared or learned ([`Router::preview`]).
    ///
    /// [`Router::preview`]: crate::router::Router::preview
    pub dry_run: bool,
}

/// A route request's prompt: token ids (the control plane tokenized the body) or the block
/// hashes a filter sent (it tokenized; `switchyard_protocol::route_input`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutePrompt {
    /// Token ids.
    Tokens(Vec<u32>),
    /// Length and full-block sequence hashes at one block size.
    Hashed {
        /// Prompt tokens.
        isl: u32,
        /// The block size of `hashes`.
        block_size: BlockSize,
        /// Sequence hashes of the full blocks.
        hashes: Vec<SequenceHash>,
    },
    /// A prompt of `isl` tokens the engine computes whole (prompt logprobs):
    /// [`Prompt::Recomputed`].
    Recomputed {
        /// Prompt tokens.
        isl: u32,
    },
}

impl RoutePrompt {
    /// The same prompt matched against no cache: a request with a `cache_salt` has its
    /// blocks keyed by the salt in the engine, so no block the index knows is one it can
    /// reuse (and its own salted blocks are not indexed).
    #[must_use]
    pub fn uncached(self) -> Self {
        let (isl, block_size) = match self {
            RoutePrompt::Tokens(tokens) => (
                u32::try_from(tokens.len()).unwrap_or(u32::MAX),
                BlockSize::ONE,
            ),
            RoutePrompt::Hashed {
                isl, block_size, ..
            } => (isl, block_size),
            recomputed @ RoutePrompt::Recomputed { .. } => return recomputed,
        };
        RoutePrompt::Hashed {
            isl,
            block_size,
            hashes: Vec::new(),
        }
    }

    /// The router's view of it.
    pub fn as_prompt(&self) -> Prompt<'_> {
        match self {
            RoutePrompt::Tokens(tokens) => Prompt::Tokens(tokens),
            RoutePrompt::Hashed {
                isl,
                block_size,
                hashes,
            } => Prompt::Hashed {
                isl: *isl,
                block_size: *block_size,
                hashes,
            },
            RoutePrompt::Recomputed { isl } => Prompt::Recomputed { isl: *isl },
        }
    }

    /// The same prompt as the engine computes it for a request asking prompt logprobs: whole,
    /// whatever any worker caches.
    #[must_use]
    pub fn recomputed(self) -> Self {
        let isl = self.as_prompt().isl();
        RoutePrompt::Recomputed { isl }
    }
}

/// A live worker with its predicted load and cache size, as `GET /v1/workers` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerEntry {
    /// Registration and liveness.
    #[serde(flatten)]
    pub view: WorkerView,
    /// Predicted load (absent if the router has none for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<WorkerLoad>,
    /// KV blocks the index holds for it.
    pub cached_blocks: u64,
}

/// The owner task has stopped (shutdown in progress); callers answer 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the router task has stopped")]
pub struct ServiceStopped;

/// Cheap, cloneable sender side of the owner task.
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    tx: mpsc::Sender<Command>,
}

impl ServiceHandle {
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ServiceStopped> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| ServiceStopped)?;
        rx.await.map_err(|_| ServiceStopped)
    }

    /// Registers or refreshes a worker.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn heartbeat(
        &self,
        heartbeat: WorkerHeartbeat,
    ) -> Result<HeartbeatOutcome, ServiceStopped> {
        self.call(|reply| Command::Heartbeat { heartbeat, reply })
            .await
    }

    /// Registers or refreshes a declared worker whose health check passed.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn declared(
        &self,
        worker: WorkerInfo,
        expires_after_ms: u64,
    ) -> Result<HeartbeatOutcome, ServiceStopped> {
        self.call(|reply| Command::Declared {
            worker,
            expires_after_ms,
            reply,
        })
        .await
    }

    /// Reserves the pool file's worker ids for its engines; returns the self-registered
    /// workers that held a newly declared id and were taken out of the pools.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn set_declared_ids(
        &self,
        ids: std::collections::HashSet<WorkerId>,
    ) -> Result<Vec<WorkerId>, ServiceStopped> {
        self.call(|reply| Command::DeclaredIds { ids, reply }).await
    }

    /// Takes a worker out of the pools and the index; whether it was there.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn withdraw(&self, worker: WorkerId) -> Result<bool, ServiceStopped> {
        self.call(|reply| Command::Withdraw { worker, reply }).await
    }

    /// Applies a KV event batch.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn kv_batch(&self, batch: KvEventBatch) -> Result<KvBatchOutcome, ServiceStopped> {
        self.call(|reply| Command::KvBatch { batch, reply }).await
    }

    /// Folds in a load report.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn load(&self, report: LoadReport) -> Result<(), ServiceStopped> {
        self.tx
            .send(Command::Load { report })
            .await
            .map_err(|_| ServiceStopped)
    }

    /// Applies lifecycle milestones.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn lifecycle(&self, batch: LifecycleBatch) -> Result<(), ServiceStopped> {
        self.tx
            .send(Command::Lifecycle { batch })
            .await
            .map_err(|_| ServiceStopped)
    }

    /// Routes a tokenized prompt.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn route(
        &self,
        request: RouteRequest,
    ) -> Result<Result<Routed, RouteError>, ServiceStopped> {
        self.call(|reply| Command::Route { request, reply }).await
    }

    /// Tells the owner whether heartbeats can reach it.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn heartbeats_reachable(
        &self,
        reachable: bool,
    ) -> Result<Vec<crate::router::core::Resync>, ServiceStopped> {
        self.call(|reply| Command::HeartbeatsReachable { reachable, reply })
            .await
    }

    /// Live workers.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn workers(&self) -> Result<Vec<WorkerEntry>, ServiceStopped> {
        self.call(|reply| Command::Workers { reply }).await
    }

    /// The current router config.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn config(&self) -> Result<RouterConfig, ServiceStopped> {
        Ok(self.versioned_config().await?.0)
    }

    /// The current router config and its shared version (0: the start-up config, not
    /// shared).
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn versioned_config(&self) -> Result<(RouterConfig, u64), ServiceStopped> {
        self.call(|reply| Command::Config { reply }).await
    }

    /// Applies another replica's update (no reply: nothing for the sender to act on).
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn peer(&self, update: ReplicaUpdate) -> Result<(), ServiceStopped> {
        self.tx
            .send(Command::Peer { update })
            .await
            .map_err(|_| ServiceStopped)
    }

    /// Applies version `version` of the shared config, unless a newer one is in force, or,
    /// when `current` (what the store holds now), unless that very version is.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn set_shared_config(
        &self,
        config: RouterConfig,
        version: u64,
        current: bool,
    ) -> Result<Result<(), ConfigError>, ServiceStopped> {
        self.call(|reply| Command::SetSharedConfig {
            config,
            version,
            current,
            reply,
        })
        .await
    }

    /// New workers whose first KV dump is still awaited.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn dumps_pending(&self) -> Result<usize, ServiceStopped> {
        self.call(|reply| Command::DumpsPending { reply }).await
    }

    /// Patches the router config if it is at a version `if_match` admits; answers the new
    /// config and its version.
    ///
    /// # Errors
    /// [`ServiceStopped`] during shutdown.
    pub async fn patch_config(
        &self,
        patch: serde_json::Value,
        if_match: Option<IfMatch>,
    ) -> Result<Result<(RouterConfig, u64), PatchRefusal>, ServiceStopped> {
        self.call(|reply| Command::PatchConfig {
            patch,
            if_match,
            reply,
        })
        .await
    }
}

/// Starts the owner task. It runs until every [`ServiceHandle`] is dropped. With `replicas`,
/// it shares its decisions and the lifecycle reports it receives with the other replicas.
pub fn spawn(
    router: Router,
    metrics: Metrics,
    heartbeat_misses: u32,
    replicas: Option<ReplicaLink>,
) -> (ServiceHandle, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel(COMMAND_QUEUE);
    let mut owner = Owner::new(router, metrics, heartbeat_misses, Instant::now(), replicas);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = rx.recv() => match command {
                    Some(command) => owner.handle(command),
                    None => break,
                },
                _ = tick.tick() => owner.tick(),
            }
        }
        tracing::debug!("router task stopped");
    });
    (ServiceHandle { tx }, task)
}
