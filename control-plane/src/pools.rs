//! Declared pools: engines listed in a pool file rather than registering themselves, as a
//! vLLM, SGLang or TensorRT-LLM fleet is (none of them registers anywhere; they report load
//! only on `/metrics`, and publish KV events on ZMQ (vLLM, SGLang) or hand them out when
//! polled (TensorRT-LLM)).
//!
//! Declared workers sit beside self-registering (NATS) workers in the same router: the same
//! registry, index, EDS and verdicts. The file is watched: re-read every
//! `--pool-reload-ms`, and when its contents change, added workers start, removed ones leave
//! the pools and the index, changed ones restart with their new settings. A file that does
//! not load keeps the last good pools (counted in `switchyard_pool_reloads_total`).
//!
//! # Layout
//! - [`file`]: the file's format, validation and the difference between two versions.
//! - [`health`]: health from polls (pure).
//! - [`scrape`]: load from each engine's metrics (pure).
//! - [`zmq`]: a vLLM or SGLang worker's SUB and replay sockets.
//! - [`worker`]: one declared worker's task, tying them together.

pub mod file;
pub mod first_polls;
pub mod health;
pub mod scrape;
pub mod worker;
pub mod zmq;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_protocol::worker::WorkerId;

use crate::metrics::{Metrics, ReasonLabels};
use crate::models::{Models, ServedModel};
use crate::service::ServiceHandle;
use file::{PoolFileError, Pools};
use first_polls::FirstPolls;
use worker::WorkerContext;

/// Declared models by name, ready to install.
type DeclaredModels = std::collections::BTreeMap<String, Arc<ServedModel>>;

/// Loads the pool file for start-up: an invalid file stops the start. (Its models'
/// tokenizers are [`Models::load_declared`]'s.)
///
/// # Errors
/// [`PoolFileError`] naming the file and the field.
pub fn load(file: &std::path::Path) -> Result<Pools, PoolFileError> {
    Pools::load(file)
}

/// The running declared workers and the file they come from.
pub struct PoolWatcher {
    file: PathBuf,
    current: Pools,
    /// The file's text when last read, to skip re-parsing an unchanged file.
    last_text: Option<String>,
    tasks: HashMap<WorkerId, tokio::task::JoinHandle<()>>,
    service: ServiceHandle,
    metrics: Metrics,
    /// The served models, which follow the file's `models`.
    models: Arc<Models>,
    http: reqwest::Client,
    /// While starting: the gate each initial worker's first health poll holds shut.
    first_polls: Option<FirstPolls>,
}

impl PoolWatcher {
    /// Starts every worker of `pools` (loaded from `file`, its models already installed in
    /// `models`); each holds `first_polls` shut until its first health poll is done.
    pub async fn start(
        file: PathBuf,
        pools: Pools,
        service: ServiceHandle,
        metrics: Metrics,
        models: Arc<Models>,
        first_polls: FirstPolls,
    ) -> Self {
        let mut watcher = PoolWatcher {
            last_text: std::fs::read_to_string(&file).ok(),
            file,
            current: Pools::empty(),
            tasks: HashMap::new(),
            service,
            metrics,
            models,
            // Health and metrics are in-cluster addresses: never through a proxy from the
            // environment.
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_default(),
            first_polls: Some(first_polls),
        };
        watcher.count("ok");
        watcher.apply(pools).await;
        watcher.first_polls = None;
        watcher
    }

    /// Re-reads the file every `every` and applies what changed, forever.
    pub async fn watch(mut self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.reload().await;
        }
    }

    /// Reads the file once; applies it if it changed and loads, keeps the last good pools
    /// (and counts the failure) if it does not.
    pub async fn reload(&mut self) {
        // Unchanged, or still unreadable (deleted, say): counted and logged once, when it
        // changed, not on every tick.
        let text = std::fs::read_to_string(&self.file).ok();
        if text == self.last_text {
            return;
        }
        self.last_text = text;
        let loaded = match load(&self.file) {
            Ok(pools) => self.load_models(pools).await,
            Err(e) => Err(e.to_string()),
        };
        match loaded {
            Ok((pools, declared)) => {
                self.count("ok");
                // Models first: a new model's workers may be routed to as soon as they join.
                self.models.install(declared);
                self.apply(pools).await;
            }
            Err(e) => {
                self.count("error");
                tracing::error!(error = %e, "pool file not reloaded; the last good pools stay");
            }
        }
    }

    /// The tokenizers of `pools`' models, loaded off the async threads.
    async fn load_models(&self, pools: Pools) -> Result<(Pools, DeclaredModels), String> {
        let models = Arc::clone(&self.models);
        tokio::task::spawn_blocking(move || {
            let declared = models.load_declared(&pools).map_err(|e| e.to_string())?;
            Ok((pools, declared))
        })
        .await
        .map_err(|e| format!("tokenizer loading stopped: {e}"))?
    }

    fn count(&self, result: &str) {
        self.metrics
            .pool_reloads
            .get_or_create(&ReasonLabels {
                reason: result.into(),
            })
            .inc();
    }

    async fn apply(&mut self, next: Pools) {
        // First, so that no heartbeat takes a newly declared id while its engine's first
        // health poll is out.
        let ids = next.workers.keys().cloned().collect();
        if let Ok(taken) = self.service.set_declared_ids(ids).await {
            for id in taken {
                tracing::warn!(worker = %id, "a self-registering worker held an id the pool file now declares: it left the pools, and its heartbeats are refused while the id is declared");
            }
        }
        let mut changes = self.current.changes_to(&next);
        if (next.health, next.metrics) != (self.current.health, self.current.metrics) {
            // New polling settings apply to every worker: restart them all.
            changes.changed = next
                .workers
                .values()
                .filter(|w| self.current.workers.contains_key(&w.id))
                .cloned()
                .collect();
        }
        for id in changes
            .removed
            .iter()
            .chain(changes.changed.iter().map(|w| &w.id))
        {
            if let Some(task) = self.tasks.remove(id) {
                task.abort();
                let _ = task.await;
            }
            let _ = self.service.withdraw(id.clone()).await;
        }
        let cx = WorkerContext {
            service: self.service.clone(),
            metrics: self.metrics.clone(),
            http: self.http.clone(),
            health: next.health,
            scrape: next.metrics,
        };
        for worker in changes.added.into_iter().chain(changes.changed) {
            tracing::info!(worker = %worker.id, role = worker.role.as_str(), address = %worker.address, kv_events = %worker.kv_events, "declared worker");
            let id = worker.id.clone();
            let first_poll = self.first_polls.as_ref().map(FirstPolls::token);
            self.tasks.insert(
                id,
                tokio::spawn(worker::run(worker, cx.clone(), first_poll)),
            );
        }
        for id in &changes.removed {
            tracing::info!(worker = %id, "declared worker removed from the pool file");
        }
        let serves = |pools: &Pools, model: &str| pools.workers.values().any(|w| w.model == model);
        for model in &next.models {
            if serves(&self.current, model) && !serves(&next, model) {
                tracing::warn!(
                    model = %model,
                    "the pool file declares no workers for this model any more: only workers registering over NATS serve it now, and without any its requests are refused no_workers"
                );
            }
        }
        self.current = next;
    }

    /// Ids of the workers running now.
    pub fn running(&self) -> Vec<WorkerId> {
        let mut ids: Vec<_> = self.tasks.keys().cloned().collect();
        ids.sort();
        ids
    }
}

impl Drop for PoolWatcher {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}
