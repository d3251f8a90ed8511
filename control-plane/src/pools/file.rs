//! The pool file: which engines serve which model, as an operator declares them.
//!
//! YAML (JSON is YAML too, so a JSON file works unchanged), typically mounted from a
//! Kubernetes ConfigMap. Parsed with `serde-saphyr`: pure Rust, no `unsafe` C parser, limits
//! on nesting and aliases against hostile files, and errors that carry the line and column.
//! Unknown fields are refused (a misspelt `kv_evnets` must not silently mean "no KV events").
//!
//! ```yaml
//! health: { interval_ms: 1000, timeout_ms: 500, unhealthy_after: 3 }
//! metrics: { interval_ms: 1000 }
//! models:
//!   - name: Qwen/Qwen3-0.6B
//!     model_dir: /models/qwen3-0.6b   # tokenizer.json + tokenizer_config.json; default --model-dir
//!     block_size: 16
//!     workers:
//!       - id: decode-0
//!         role: decode
//!         address: 10.0.0.5:8000
//!         engine: vllm
//!         kv_events: tcp://10.0.0.5:5557
//!         kv_replay: tcp://10.0.0.5:5558
//! ```
//! vLLM binds its publisher only for a wildcard endpoint (`tcp://*:5557`) and otherwise
//! connects to it. So a worker gives either `kv_events` (vLLM started with `tcp://*:PORT`;
//! Switchyard connects to the worker's host) or `kv_events_listen` (Switchyard binds there,
//! one port per worker, and vLLM is started with `endpoint` naming it). The replay socket is
//! always vLLM's to bind.
//! `metrics_url` and `health_url` default to `http://<address>/metrics` and `/health`;
//! `kv_capacity_blocks` defaults to what the engine's metrics say (vLLM's
//! `vllm:cache_config_info`, SGLang's `sglang:max_total_num_tokens`, TensorRT-LLM's
//! `kvCacheStats.maxNumBlocks`).
//!
//! `engine` is `vllm`, `sglang` or `trtllm`, one per model (its prefill and decode legs speak
//! that engine's handoff). SGLang publishes KV events as vLLM does, so its workers take the
//! same `kv_events`/`kv_events_listen`/`kv_replay`. TensorRT-LLM has no publisher: its
//! events are polled, and `kv_events` is then an `http://` URL (default
//! `http://<address>/kv_cache_events`). An SGLang prefill worker must give `bootstrap_port`
//! (its `--disaggregation-bootstrap-port`, which the decode leg is sent to); no other worker
//! may.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use switchyard_protocol::hash::BlockSize;
use switchyard_protocol::route::{
    is_header_safe_model, is_usable_request_id, model_cluster, DECODE_CLUSTER,
};
use switchyard_protocol::worker::{check_endpoint_address, Engine, WorkerId, WorkerRole};

/// Largest pool file read; a pool of thousands of workers is far below it.
pub const MAX_POOL_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Why a pool file was not taken. Names the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum PoolFileError {
    /// The file could not be read.
    #[error("pool file {file}: {source}")]
    Read {
        /// Which file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Larger than [`MAX_POOL_FILE_BYTES`].
    #[error("pool file {file}: {bytes} bytes, more than the {MAX_POOL_FILE_BYTES} accepted")]
    TooLarge {
        /// Which file.
        file: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// Not YAML, or not the pool file's shape (the message carries line and column).
    #[error("pool file {file}: {message}")]
    Syntax {
        /// Which file.
        file: PathBuf,
        /// The parser's words, with the location.
        message: String,
    },
    /// Well-formed, but a value is not acceptable.
    #[error("pool file {file}: {field}: {message}")]
    Invalid {
        /// Which file.
        file: PathBuf,
        /// Where, e.g. `models[0].workers[2].kv_events`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

/// How declared workers are health-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Time between two polls of a worker's health URL.
    pub interval_ms: u64,
    /// A poll that takes longer failed.
    pub timeout_ms: u64,
    /// Consecutive failed polls after which the worker leaves the pools (and the index); it
    /// comes back at its next healthy poll.
    pub unhealthy_after: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            interval_ms: 1_000,
            timeout_ms: 500,
            unhealthy_after: 3,
        }
    }
}

/// How declared workers' load is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// Time between two scrapes of a worker's metrics URL.
    pub interval_ms: u64,
    /// A scrape that takes longer failed.
    pub timeout_ms: u64,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            interval_ms: 1_000,
            timeout_ms: 500,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPoolFile {
    #[serde(default)]
    health: HealthSettings,
    #[serde(default)]
    metrics: MetricsSettings,
    models: Vec<RawModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    #[serde(default)]
    model_dir: Option<PathBuf>,
    block_size: u32,
    #[serde(default)]
    trtllm_disagg_request_id: bool,
    /// `workers:` with nothing under it (YAML's null) is no workers, as `[]` is.
    #[serde(default)]
    workers: Option<Vec<RawWorker>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    id: String,
    role: WorkerRole,
    address: String,
    engine: Engine,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    kv_events: Option<String>,
    #[serde(default)]
    kv_events_listen: Option<String>,
    #[serde(default)]
    kv_replay: Option<String>,
    #[serde(default)]
    metrics_url: Option<String>,
    #[serde(default)]
    health_url: Option<String>,
    #[serde(default)]
    kv_capacity_blocks: Option<u64>,
}

/// How the KV-event subscription meets a worker's publisher (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEventsSocket {
    /// Connect to the worker's bound publisher at this endpoint.
    Connect(String),
    /// Bind this endpoint; the worker's publisher connects to it.
    Listen(String),
}

impl KvEventsSocket {
    /// The endpoint, either way.
    pub fn endpoint(&self) -> &str {
        match self {
            KvEventsSocket::Connect(e) | KvEventsSocket::Listen(e) => e,
        }
    }
}

impl std::fmt::Display for KvEventsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvEventsSocket::Connect(e) => write!(f, "connect {e}"),
            KvEventsSocket::Listen(e) => write!(f, "listen {e}"),
        }
    }
}

/// Where a worker's KV events come from, by engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEventsSource {
    /// vLLM and SGLang: a ZMQ publisher (the same framing and msgpack).
    Zmq(KvEventsSocket),
    /// TensorRT-LLM: `POST` this URL; each answer drains the engine's event queue.
    Polled(String),
}

impl std::fmt::Display for KvEventsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvEventsSource::Zmq(socket) => socket.fmt(f),
            KvEventsSource::Polled(url) => write!(f, "poll {url}"),
        }
    }
}

/// One worker as declared, validated and with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredWorker {
    /// Its name (unique in the file).
    pub id: WorkerId,
    /// The model it serves.
    pub model: String,
    /// Its role in the pools.
    pub role: WorkerRole,
    /// `host:port` of its OpenAI API: its Envoy endpoint.
    pub address: String,
    /// The engine.
    pub engine: Engine,
    /// Port of an SGLang prefill worker's bootstrap server (`None` for any other worker).
    pub bootstrap_port: Option<u16>,
    /// KV block size in tokens.
    pub block_size: BlockSize,
    /// Where its KV events come from.
    pub kv_events: KvEventsSource,
    /// ZMQ endpoint of its replay socket, if it has one.
    pub kv_replay: Option<String>,
    /// Where its Prometheus metrics are.
    pub metrics_url: String,
    /// Where its health check is.
    pub health_url: String,
    /// KV capacity in blocks, if declared.
    pub kv_capacity_blocks: Option<u64>,
}

/// A validated pool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    /// Health checking.
    pub health: HealthSettings,
    /// Load scraping.
    pub metrics: MetricsSettings,
    /// Every declared worker, by id.
    pub workers: BTreeMap<WorkerId, DeclaredWorker>,
    /// Declared model names, in file order.
    pub models: Vec<String>,
    /// The tokenizer folder of each model that names one (the others use `--model-dir`).
    pub model_dirs: BTreeMap<String, PathBuf>,
    /// Models whose disaggregated legs carry a `disagg_request_id` (`trtllm_disagg_request_id:
    /// true`: TensorRT-LLM servers moving KV with the Python transceiver).
    pub disagg_request_id_models: BTreeSet<String>,
}

/// What changed between two pool files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolChanges {
    /// Declared now, not before.
    pub added: Vec<DeclaredWorker>,
    /// Declared before, not now.
    pub removed: Vec<WorkerId>,
    /// Declared in both, with some setting changed (restarted with the new one).
    pub changed: Vec<DeclaredWorker>,
}

impl PoolChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl Pools {
    /// No workers declared.
    pub fn empty() -> Self {
        Pools {
            health: HealthSettings::default(),
            metrics: MetricsSettings::default(),
            workers: BTreeMap::new(),
            models: Vec::new(),
            model_dirs: BTreeMap::new(),
            disagg_request_id_models: BTreeSet::new(),
        }
    }

    /// Reads and validates `file`.
    ///
    /// # Errors
    /// [`PoolFileError`] naming the file and the line, column or field at fault.
    pub fn load(file: &Path) -> Result<Pools, PoolFileError> {
        let read = |source| PoolFileError::Read {
            file: file.to_owned(),
            source,
        };
        let bytes = std::fs::metadata(file).map_err(read)?.len();
        if bytes > MAX_POOL_FILE_BYTES {
            return Err(PoolFileError::TooLarge {
                file: file.to_owned(),
                bytes,
            });
        }
        let text = std::fs::read_to_string(file).map_err(read)?;
        Pools::parse(&text, file)
    }

    /// Parses and validates pool-file `text`; `file` names it in errors.
    ///
    /// # Errors
    /// [`PoolFileError::Syntax`] or [`PoolFileError::Invalid`].
    pub fn parse(text: &str, file: &Path) -> Result<Pools, PoolFileError> {
        let raw: RawPoolFile = serde_saphyr::from_str(text).map_err(|e| PoolFileError::Syntax {
            file: file.to_owned(),
            // The parser's text starts "error: ", which "pool file X: " already says, and
            // its advice on duplicate keys names a parser option the file cannot set.
            message: e.to_string().trim_start_matches("error: ").replace(
                ", set DuplicateKeyPolicy in Options if acceptable",
                " (each key may appear once per mapping)",
            ),
        })?;
        validate(raw).map_err(|(field, message)| PoolFileError::Invalid {
            file: file.to_owned(),
            field,
            message,
        })
    }

    /// What must change to go from `self` to `next`.
    pub fn changes_to(&self, next: &Pools) -> PoolChanges {
        let mut changes = PoolChanges::default();
        for (id, worker) in &next.workers {
            match self.workers.get(id) {
                None => changes.added.push(worker.clone()),
                Some(old) if old != worker => changes.changed.push(worker.clone()),
                Some(_) => {}
            }
        }
        changes.removed = self
            .workers
            .keys()
            .filter(|id| !next.workers.contains_key(*id))
            .cloned()
            .collect();
        changes
    }
}

type Invalid = (String, String);

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    (field.into(), message.into())
}

fn validate(raw: RawPoolFile) -> Result<Pools, Invalid> {
    check_range("health.interval_ms", raw.health.interval_ms, 100, 3_600_000)?;
    check_range("health.timeout_ms", raw.health.timeout_ms, 10, 60_000)?;
    check_range(
        "health.unhealthy_after",
        u64::from(raw.health.unhealthy_after),
        1,
        1_000,
    )?;
    check_range(
        "metrics.interval_ms",
        raw.metrics.interval_ms,
        100,
        3_600_000,
    )?;
    check_range("metrics.timeout_ms", raw.metrics.timeout_ms, 10, 60_000)?;
    let mut pools = Pools {
        health: raw.health,
        metrics: raw.metrics,
        ..Pools::empty()
    };
    let mut addresses = HashSet::new();
    let mut feeds = HashSet::new();
    for (m, model) in raw.models.into_iter().enumerate() {
        let at = format!("models[{m}]");
        if model.name.trim().is_empty() || model.name.len() > 256 {
            return Err(invalid(
                format!("{at}.name"),
                "a model name of 1 to 256 characters",
            ));
        }
        // The filter names the request's model to Envoy in a header so that a request that
        // fails open stays in its model's pools; a name no header can carry would fail open
        // to any model's workers.
        if !is_header_safe_model(&model.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!(
                    "model name {:?} must be printable ASCII without a leading or trailing space (the gateway carries it in a header)",
                    model.name
                ),
            ));
        }
        if pools.models.contains(&model.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("model {:?} is declared twice", model.name),
            ));
        }
        // Each model gets its own Envoy clusters, named from the model: two names that map to
        // one cluster would serve one model's fail-open traffic to the other.
        let cluster = model_cluster(DECODE_CLUSTER, &model.name);
        if let Some(other) = pools
            .models
            .iter()
            .find(|m| model_cluster(DECODE_CLUSTER, m) == cluster)
        {
            return Err(invalid(
                format!("{at}.name"),
                format!(
                    "model {:?} and model {other:?} would share the Envoy cluster {cluster}",
                    model.name
                ),
            ));
        }
        if let Some(dir) = model.model_dir {
            if dir.as_os_str().is_empty() {
                return Err(invalid(
                    format!("{at}.model_dir"),
                    "a folder with tokenizer.json (leave it out for --model-dir)",
                ));
            }
            pools.model_dirs.insert(model.name.clone(), dir);
        }
        let block_size = BlockSize::try_new(model.block_size)
            .map_err(|e| invalid(format!("{at}.block_size"), e.to_string()))?;
        // The handoff between a model's prefill and decode legs is one engine's protocol.
        let mut model_engine: Option<(Engine, String)> = None;
        for (w, worker) in model.workers.unwrap_or_default().into_iter().enumerate() {
            let at = format!("{at}.workers[{w}]");
            let declared = validate_worker(worker, &model.name, block_size, &at)?;
            match &model_engine {
                None => model_engine = Some((declared.engine, declared.id.0.clone())),
                Some((engine, first)) if *engine != declared.engine => {
                    return Err(invalid(
                        format!("{at}.engine"),
                        format!(
                            "model {:?} mixes engines {} (worker {first:?}) and {} (worker {:?}): a model's workers run one engine",
                            model.name,
                            engine.as_str(),
                            declared.engine.as_str(),
                            declared.id.0
                        ),
                    ))
                }
                Some(_) => {}
            }
            if pools.workers.contains_key(&declared.id) {
                return Err(invalid(
                    format!("{at}.id"),
                    format!("worker {:?} is declared twice", declared.id.0),
                ));
            }
            if !addresses.insert(declared.address.clone()) {
                return Err(invalid(
                    format!("{at}.address"),
                    format!("{} is declared for two workers", declared.address),
                ));
            }
            // One engine's feed filed under two workers would give each the other's blocks:
            // cache hits the router sees on a worker that holds nothing. (A listening socket
            // is Switchyard's to bind, so a second worker there would get no feed at all.)
            let (key, what) = match &declared.kv_events {
                KvEventsSource::Zmq(KvEventsSocket::Listen(e)) => ("kv_events_listen", e),
                KvEventsSource::Zmq(KvEventsSocket::Connect(e)) => ("kv_events", e),
                KvEventsSource::Polled(url) => ("kv_events", url),
            };
            if !feeds.insert(what.clone()) {
                return Err(invalid(
                    format!("{at}.{key}"),
                    format!("{what} is declared for two workers: each engine publishes its own KV events"),
                ));
            }
            if let Some(replay) = &declared.kv_replay {
                if !feeds.insert(replay.clone()) {
                    return Err(invalid(
                        format!("{at}.kv_replay"),
                        format!("{replay} is declared twice: each engine answers replays of its own KV events"),
                    ));
                }
            }
            pools.workers.insert(declared.id.clone(), declared);
        }
        if model.trtllm_disagg_request_id {
            // Only TensorRT-LLM's legs have the field; any other engine would refuse it.
            if let Some((engine, worker)) = model_engine.filter(|(e, _)| *e != Engine::Trtllm) {
                return Err(invalid(
                    format!("{at}.trtllm_disagg_request_id"),
                    format!(
                        "model {:?} runs {} (worker {worker:?}): only a TensorRT-LLM model's legs carry a disagg_request_id",
                        model.name,
                        engine.as_str()
                    ),
                ));
            }
            pools.disagg_request_id_models.insert(model.name.clone());
        }
        pools.models.push(model.name);
    }
    Ok(pools)
}

fn validate_worker(
    raw: RawWorker,
    model: &str,
    block_size: BlockSize,
    at: &str,
) -> Result<DeclaredWorker, Invalid> {
    if !is_usable_request_id(&raw.id) {
        return Err(invalid(
            format!("{at}.id"),
            "a worker id of 1 to 128 printable characters without spaces",
        ));
    }
    // The address becomes the worker's Envoy endpoint, which takes an IP address.
    check_endpoint_address(&raw.address)
        .map_err(|e| invalid(format!("{at}.address"), e.to_string()))?;
    check_bootstrap_port(raw.engine, raw.role, raw.bootstrap_port, &raw.id)
        .map_err(|m| invalid(format!("{at}.bootstrap_port"), m))?;
    let kv_events = match raw.engine {
        Engine::Vllm | Engine::Sglang => KvEventsSource::Zmq(zmq_events(
            raw.kv_events,
            raw.kv_events_listen,
            raw.kv_replay.as_deref(),
            at,
        )?),
        Engine::Trtllm => {
            // TensorRT-LLM has no publisher or replay socket: its events are polled.
            for (field, given) in [
                ("kv_events_listen", &raw.kv_events_listen),
                ("kv_replay", &raw.kv_replay),
            ] {
                if given.is_some() {
                    return Err(invalid(
                        format!("{at}.{field}"),
                        "not for engine trtllm (its KV events are polled from kv_events, an http:// URL)",
                    ));
                }
            }
            let url = match raw.kv_events {
                Some(url) => {
                    check_http_url(&url).map_err(|m| {
                        invalid(
                            format!("{at}.kv_events"),
                            format!("{m} (trtllm-serve's POST /kv_cache_events)"),
                        )
                    })?;
                    url
                }
                None => format!("http://{}/kv_cache_events", raw.address),
            };
            KvEventsSource::Polled(url)
        }
    };
    let url = |given: Option<String>, field: &str, path: &str| -> Result<String, Invalid> {
        match given {
            Some(url) => {
                check_http_url(&url).map_err(|m| invalid(format!("{at}.{field}"), m))?;
                Ok(url)
            }
            None => Ok(format!("http://{}{path}", raw.address)),
        }
    };
    let metrics_url = url(raw.metrics_url, "metrics_url", "/metrics")?;
    let health_url = url(raw.health_url, "health_url", "/health")?;
    if raw.kv_capacity_blocks == Some(0) {
        return Err(invalid(
            format!("{at}.kv_capacity_blocks"),
            "at least 1 block (leave it out to read it from the engine)",
        ));
    }
    Ok(DeclaredWorker {
        id: WorkerId(raw.id),
        model: model.to_owned(),
        role: raw.role,
        address: raw.address,
        engine: raw.engine,
        bootstrap_port: raw.bootstrap_port,
        block_size,
        kv_events,
        kv_replay: raw.kv_replay,
        metrics_url,
        health_url,
        kv_capacity_blocks: raw.kv_capacity_blocks,
    })
}

/// An SGLang prefill worker needs its bootstrap port (the decode leg connects to it); no
/// other worker has one, so a port given elsewhere is a mistake worth naming.
fn check_bootstrap_port(
    engine: Engine,
    role: WorkerRole,
    port: Option<u16>,
    id: &str,
) -> Result<(), String> {
    let needed = engine == Engine::Sglang && role == WorkerRole::Prefill;
    match (needed, port) {
        (true, None) => Err(format!(
            "missing: worker {id:?} is an SGLang prefill worker; give its --disaggregation-bootstrap-port"
        )),
        (true, Some(0)) => Err(format!("worker {id:?}: a port in 1..=65535")),
        (true, Some(_)) | (false, None) => Ok(()),
        (false, Some(_)) => Err(format!(
            "worker {id:?} is a {} {} worker: only an SGLang prefill worker has a bootstrap port",
            engine.as_str(),
            role.as_str()
        )),
    }
}

/// The ZMQ KV-event settings of a vLLM or SGLang worker (both publish alike).
fn zmq_events(
    kv_events: Option<String>,
    kv_events_listen: Option<String>,
    kv_replay: Option<&str>,
    at: &str,
) -> Result<KvEventsSocket, Invalid> {
    let kv_events = match (kv_events, kv_events_listen) {
        (Some(connect), None) => {
            check_zmq_endpoint(&connect).map_err(|m| invalid(format!("{at}.kv_events"), m))?;
            KvEventsSocket::Connect(connect)
        }
        (None, Some(listen)) => {
            check_zmq_endpoint(&listen)
                .map_err(|m| invalid(format!("{at}.kv_events_listen"), m))?;
            KvEventsSocket::Listen(listen)
        }
        (Some(_), Some(_)) => {
            return Err(invalid(
                format!("{at}.kv_events_listen"),
                "give kv_events (connect to the worker) or kv_events_listen (the worker connects here), not both",
            ))
        }
        (None, None) => {
            return Err(invalid(
                format!("{at}.kv_events"),
                "missing: the worker's KV-event publisher (or kv_events_listen)",
            ))
        }
    };
    if let Some(replay) = kv_replay {
        check_zmq_endpoint(replay).map_err(|m| invalid(format!("{at}.kv_replay"), m))?;
        if replay == kv_events.endpoint() {
            return Err(invalid(
                format!("{at}.kv_replay"),
                "the replay socket cannot be the event socket",
            ));
        }
    }
    Ok(kv_events)
}

fn check_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), Invalid> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(invalid(field, format!("{value} is outside {min}..={max}")))
    }
}

/// `host:port` with a non-empty host and a port in 1..=65535.
fn check_host_port(text: &str) -> Result<(), String> {
    if text.contains('@') {
        return Err(format!(
            "{} carries credentials: the pool file takes none in addresses (give host:port only)",
            shown(text)
        ));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} is not host:port"));
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.[]:_".contains(c));
    match port.parse::<u16>() {
        Ok(p) if p > 0 && host_ok => Ok(()),
        _ => Err(format!("{text:?} is not host:port")),
    }
}

/// `text` quoted for an error message, without any credentials before an `@` (the message
/// goes to logs).
fn shown(text: &str) -> String {
    match text.rsplit_once('@') {
        Some((before, after)) => {
            let scheme = before.split_once("://").map_or("", |(s, _)| s);
            let scheme = if scheme.is_empty() {
                String::new()
            } else {
                format!("{scheme}://")
            };
            format!("{:?}", format!("{scheme}…@{after}"))
        }
        None => format!("{text:?}"),
    }
}

fn check_zmq_endpoint(text: &str) -> Result<(), String> {
    let Some(rest) = text.strip_prefix("tcp://") else {
        return Err(format!(
            "{}: a ZMQ TCP endpoint, tcp://host:port (the engine's host for kv_events and kv_replay, this control plane's for kv_events_listen)",
            shown(text)
        ));
    };
    if rest.starts_with('*') {
        return Err(format!(
            "{text:?}: name a host, not *: the engine's for kv_events and kv_replay, this control plane's for kv_events_listen"
        ));
    }
    check_host_port(rest)
}

fn check_http_url(text: &str) -> Result<(), String> {
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(format!("{}: an http:// URL", shown(text)));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    check_host_port(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
health: { interval_ms: 500, unhealthy_after: 2 }
models:
  - name: tiny
    block_size: 16
    workers:
      - id: decode-0
        role: decode
        address: 127.0.0.1:8100
        engine: vllm
        kv_events: tcp://127.0.0.1:5557
        kv_replay: tcp://127.0.0.1:5558
      - id: prefill-0
        role: prefill
        address: 127.0.0.1:8101
        engine: vllm
        kv_events: tcp://127.0.0.1:5559
        metrics_url: http://127.0.0.1:9000/metrics
        kv_capacity_blocks: 4096
"#;

    fn parse(text: &str) -> Result<Pools, PoolFileError> {
        Pools::parse(text, Path::new("pools.yaml"))
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("refused").to_string()
    }

    #[test]
    fn a_good_file_gives_every_worker_with_its_defaults() {
        let pools = parse(GOOD).unwrap();
        assert_eq!(pools.health.interval_ms, 500);
        assert_eq!(pools.health.timeout_ms, 500, "default kept");
        assert_eq!(pools.metrics, MetricsSettings::default());
        assert_eq!(pools.models, vec!["tiny".to_string()]);
        let decode = &pools.workers[&WorkerId("decode-0".into())];
        assert_eq!(decode.role, WorkerRole::Decode);
        assert_eq!(decode.block_size.get(), 16);
        assert_eq!(decode.metrics_url, "http://127.0.0.1:8100/metrics");
        assert_eq!(decode.health_url, "http://127.0.0.1:8100/health");
        assert_eq!(decode.kv_capacity_blocks, None);
        let prefill = &pools.workers[&WorkerId("prefill-0".into())];
        assert_eq!(prefill.metrics_url, "http://127.0.0.1:9000/metrics");
        assert_eq!(prefill.kv_replay, None);
        assert_eq!(
            decode.kv_events,
            KvEventsSource::Zmq(KvEventsSocket::Connect("tcp://127.0.0.1:5557".into()))
        );
        let listening = parse(&GOOD.replace(
            "kv_events: tcp://127.0.0.1:5559",
            "kv_events_listen: tcp://127.0.0.1:5559",
        ))
        .unwrap();
        assert_eq!(
            listening.workers[&WorkerId("prefill-0".into())].kv_events,
            KvEventsSource::Zmq(KvEventsSocket::Listen("tcp://127.0.0.1:5559".into()))
        );
        assert_eq!(prefill.kv_capacity_blocks, Some(4096));
    }

    #[test]
    fn a_model_with_no_workers_yet_is_fine() {
        let pools = parse("models:\n  - name: m\n    block_size: 16\n    workers:\n").unwrap();
        assert!(pools.workers.is_empty());
        assert_eq!(pools.models, vec!["m".to_string()]);
    }

    #[test]
    fn credentials_in_an_address_are_refused_and_not_echoed() {
        for (from, to) in [
            ("http://127.0.0.1:9000", "http://user:s3cret@127.0.0.1:9000"),
            (
                "http://127.0.0.1:9000",
                "https://user:s3cret@127.0.0.1:9000",
            ),
            ("tcp://127.0.0.1:5557", "tcp://user:s3cret@127.0.0.1:5557"),
            ("tcp://127.0.0.1:5557", "user:s3cret@127.0.0.1:5557"),
        ] {
            let e = error(&GOOD.replace(from, to));
            assert!(e.contains("127.0.0.1"), "{e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        let e = error(&GOOD.replace("http://127.0.0.1:9000", "http://user:s3cret@127.0.0.1:9000"));
        assert!(e.contains("credentials"), "{e}");
    }

    #[test]
    fn a_duplicate_key_is_named_without_parser_advice() {
        let e = error(&GOOD.replace(
            "    block_size: 16\n",
            "    block_size: 16\n    block_size: 32\n",
        ));
        assert!(e.contains("duplicate") && e.contains("block_size"), "{e}");
        assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    }

    #[test]
    fn json_is_accepted_too() {
        let json = r#"{"models": [{"name": "m", "block_size": 16, "workers": [
            {"id": "d", "role": "agg", "address": "10.0.0.1:1", "engine": "vllm",
             "kv_events": "tcp://h:2"}]}]}"#;
        assert_eq!(parse(json).unwrap().workers.len(), 1);
    }

    #[test]
    fn errors_name_the_file_and_the_line_or_field() {
        let e = error(&GOOD.replace("kv_replay:", "kv_replya:"));
        assert!(e.contains("pools.yaml") && e.contains("kv_replya"), "{e}");
        assert!(!e.contains("error: "), "said twice: {e}");
        assert!(
            e.contains("line 12 column 9"),
            "the typo's line and column: {e}"
        );
        let e = error(&GOOD.replace("role: decode", "role: chef"));
        assert!(e.contains("chef"), "{e}");
        let e = error(&GOOD.replace("block_size: 16", "block_size: 0"));
        assert!(e.contains("models[0].block_size"), "{e}");
        let e = error(&GOOD.replace("tcp://127.0.0.1:5557", "127.0.0.1:5557"));
        assert!(e.contains("models[0].workers[0].kv_events"), "{e}");
        let e = error(&GOOD.replace("tcp://127.0.0.1:5557", "tcp://*:5557"));
        assert!(e.contains("not *"), "{e}");
        let e = error(&GOOD.replace("127.0.0.1:8101", "127.0.0.1:8100"));
        assert!(e.contains("workers[1].address"), "{e}");
        // Envoy's endpoints are IP addresses: a host name would get verdicts no route serves.
        let e = error(&GOOD.replace("127.0.0.1:8101", "vllm-decode:8101"));
        assert!(
            e.contains("workers[1].address") && e.contains("not a host name"),
            "{e}"
        );
        let e = error(&GOOD.replace("prefill-0", "decode-0"));
        assert!(e.contains("declared twice"), "{e}");
        // Two workers on one listening event socket: the second's feed could never bind.
        let e = error(
            &GOOD
                .replace(
                    "kv_events: tcp://127.0.0.1:5557",
                    "kv_events_listen: tcp://127.0.0.1:5560",
                )
                .replace(
                    "kv_events: tcp://127.0.0.1:5559",
                    "kv_events_listen: tcp://127.0.0.1:5560",
                ),
        );
        assert!(
            e.contains("workers[1].kv_events_listen") && e.contains("two workers"),
            "{e}"
        );
        // A model name no header can carry would fail open to any model's workers.
        for name in ["modèle", " tiny", "tiny ", "ti\tny"] {
            let e = error(&GOOD.replace("name: tiny", &format!("name: {name:?}")));
            assert!(
                e.contains("models[0].name") && e.contains("printable ASCII"),
                "{name:?}: {e}"
            );
        }
        let e = error(&GOOD.replace("unhealthy_after: 2", "unhealthy_after: 0"));
        assert!(e.contains("health.unhealthy_after"), "{e}");
        let e = error(&GOOD.replace("http://127.0.0.1:9000", "ftp://x"));
        assert!(e.contains("workers[1].metrics_url"), "{e}");
        let e = error(&GOOD.replace("4096", "0"));
        assert!(e.contains("kv_capacity_blocks"), "{e}");
        let e = error(&GOOD.replace("kv_events: tcp://127.0.0.1:5559", ""));
        assert!(
            e.contains("workers[1].kv_events") && e.contains("missing"),
            "{e}"
        );
        let e = error(&GOOD.replace(
            "kv_events: tcp://127.0.0.1:5559",
            "kv_events: tcp://127.0.0.1:5559\n        kv_events_listen: tcp://127.0.0.1:5560",
        ));
        assert!(e.contains("not both"), "{e}");
        let e = error("models: [ {");
        assert!(e.contains("pools.yaml"), "{e}");
        let e = error("health: {}\n");
        assert!(e.contains("models"), "{e}");
    }

    #[test]
    fn changes_are_additions_removals_and_changed_settings() {
        let before = parse(GOOD).unwrap();
        let after = parse(
            &GOOD
                .replace("id: prefill-0", "id: prefill-1")
                .replace("tcp://127.0.0.1:5558", "tcp://127.0.0.1:6000"),
        )
        .unwrap();
        let changes = before.changes_to(&after);
        assert_eq!(
            changes
                .added
                .iter()
                .map(|w| w.id.0.as_str())
                .collect::<Vec<_>>(),
            ["prefill-1"]
        );
        assert_eq!(changes.removed, vec![WorkerId("prefill-0".into())]);
        assert_eq!(changes.changed.len(), 1);
        assert_eq!(
            changes.changed[0].kv_replay.as_deref(),
            Some("tcp://127.0.0.1:6000")
        );
        assert!(after.changes_to(&after).is_empty());
        assert_eq!(
            Pools::empty().changes_to(&before).added.len(),
            2,
            "a first load adds everyone"
        );
    }

    /// One model served by SGLang (with its bootstrap port) and one by TensorRT-LLM.
    const ENGINES: &str = r#"
models:
  - name: s
    block_size: 64
    workers:
      - { id: s-prefill, role: prefill, address: "10.0.0.1:30000", engine: sglang,
          bootstrap_port: 8998, kv_events: "tcp://10.0.0.1:5557" }
      - { id: s-decode, role: decode, address: "10.0.0.2:30000", engine: sglang,
          kv_events: "tcp://10.0.0.2:5557" }
  - name: t
    block_size: 32
    workers:
      - { id: t-ctx, role: prefill, address: "10.0.0.3:8000", engine: trtllm }
      - { id: t-gen, role: decode, address: "10.0.0.4:8000", engine: trtllm,
          kv_events: "http://10.0.0.4:9000/kv_cache_events" }
"#;

    #[test]
    fn engines_bootstrap_ports_and_polled_events_are_read() {
        let pools = parse(ENGINES).unwrap();
        let worker = |id: &str| pools.workers[&WorkerId(id.into())].clone();
        assert_eq!(worker("s-prefill").engine, Engine::Sglang);
        assert_eq!(worker("s-prefill").bootstrap_port, Some(8998));
        assert_eq!(worker("s-decode").bootstrap_port, None);
        assert_eq!(
            worker("s-decode").kv_events,
            KvEventsSource::Zmq(KvEventsSocket::Connect("tcp://10.0.0.2:5557".into()))
        );
        assert_eq!(worker("t-ctx").engine, Engine::Trtllm);
        assert_eq!(
            worker("t-ctx").kv_events,
            KvEventsSource::Polled("http://10.0.0.3:8000/kv_cache_events".into()),
            "the default: trtllm-serve's own endpoint"
        );
        assert_eq!(
            worker("t-gen").kv_events,
            KvEventsSource::Polled("http://10.0.0.4:9000/kv_cache_events".into())
        );
        assert_eq!(worker("t-gen").metrics_url, "http://10.0.0.4:8000/metrics");
        let vllm = parse(GOOD).unwrap();
        assert!(vllm.workers.values().all(|w| w.engine == Engine::Vllm));
        assert!(vllm.workers.values().all(|w| w.bootstrap_port.is_none()));
    }

    #[test]
    fn two_workers_never_share_a_kv_event_feed() {
        let shared = |from: &str, to: &str| error(&ENGINES.replace(from, to));
        // Two engines' events under one subscription (ZMQ), one polled queue (TensorRT-LLM).
        let e = shared("tcp://10.0.0.2:5557", "tcp://10.0.0.1:5557");
        assert!(
            e.contains("models[0].workers[1].kv_events") && e.contains("two workers"),
            "{e}"
        );
        let e = shared(
            "kv_events: \"http://10.0.0.4:9000/kv_cache_events\"",
            "kv_events: \"http://10.0.0.3:8000/kv_cache_events\"",
        );
        assert!(e.contains("models[1].workers[1].kv_events"), "{e}");
        let e = shared(
            "kv_events: \"tcp://10.0.0.2:5557\"",
            "kv_events: \"tcp://10.0.0.2:5557\", kv_replay: \"tcp://10.0.0.1:5557\"",
        );
        assert!(e.contains("models[0].workers[1].kv_replay"), "{e}");
    }

    #[test]
    fn only_a_tensorrt_llm_model_asks_for_a_disagg_request_id() {
        assert!(parse(ENGINES).unwrap().disagg_request_id_models.is_empty());
        let asked = ENGINES.replace(
            "  - name: t\n    block_size: 32\n",
            "  - name: t\n    block_size: 32\n    trtllm_disagg_request_id: true\n",
        );
        let pools = parse(&asked).unwrap();
        assert_eq!(
            pools.disagg_request_id_models.iter().collect::<Vec<_>>(),
            ["t"]
        );
        // A model without declared workers (they register over NATS) may ask too.
        let bare = "models:\n  - name: m\n    block_size: 16\n    trtllm_disagg_request_id: true\n";
        assert!(parse(bare).unwrap().disagg_request_id_models.contains("m"));
        // An SGLang model's legs have no such field.
        let e = error(&ENGINES.replace(
            "  - name: s\n",
            "  - name: s\n    trtllm_disagg_request_id: true\n",
        ));
        assert!(
            e.contains("models[0].trtllm_disagg_request_id")
                && e.contains("sglang")
                && e.contains("s-prefill"),
            "{e}"
        );
    }

    #[test]
    fn bootstrap_ports_are_required_for_sglang_prefill_only() {
        let e = error(&ENGINES.replace("bootstrap_port: 8998, ", ""));
        assert!(
            e.contains("models[0].workers[0].bootstrap_port")
                && e.contains("missing")
                && e.contains("s-prefill"),
            "{e}"
        );
        let e = error(&ENGINES.replace("8998", "0"));
        assert!(e.contains("workers[0].bootstrap_port"), "{e}");
        let e = error(&ENGINES.replace("8998", "70000"));
        assert!(e.contains("70000") || e.contains("bootstrap_port"), "{e}");
        let e = error(&ENGINES.replace(
            "engine: sglang,\n          kv_events",
            "engine: sglang, bootstrap_port: 1,\n          kv_events",
        ));
        assert!(
            e.contains("models[0].workers[1].bootstrap_port")
                && e.contains("s-decode")
                && e.contains("sglang decode"),
            "{e}"
        );
        let e = error(&ENGINES.replace(
            "role: prefill, address: \"10.0.0.3:8000\", engine: trtllm",
            "role: prefill, address: \"10.0.0.3:8000\", engine: trtllm, bootstrap_port: 8998",
        ));
        assert!(
            e.contains("models[1].workers[0].bootstrap_port") && e.contains("trtllm prefill"),
            "{e}"
        );
        let e = error(&GOOD.replace(
            "engine: vllm\n        kv_events: tcp://127.0.0.1:5559",
            "engine: vllm\n        bootstrap_port: 8998\n        kv_events: tcp://127.0.0.1:5559",
        ));
        assert!(
            e.contains("workers[1].bootstrap_port") && e.contains("vllm prefill"),
            "{e}"
        );
    }

    #[test]
    fn a_model_runs_one_engine() {
        let e = error(&ENGINES.replace(
            "engine: sglang,\n          kv_events",
            "engine: vllm,\n          kv_events",
        ));
        assert!(
            e.contains("models[0].workers[1].engine")
                && e.contains("model \"s\"")
                && e.contains("sglang")
                && e.contains("vllm"),
            "{e}"
        );
        let e = error(&GOOD.replace(
            "engine: vllm\n        kv_events: tcp://127.0.0.1:5559",
            "engine: chef\n        kv_events: tcp://127.0.0.1:5559",
        ));
        assert!(e.contains("chef"), "{e}");
    }

    #[test]
    fn trtllm_events_are_an_http_url_and_take_no_zmq_settings() {
        let e = error(&ENGINES.replace("http://10.0.0.4:9000", "tcp://10.0.0.4:9000"));
        assert!(
            e.contains("models[1].workers[1].kv_events") && e.contains("http://"),
            "{e}"
        );
        let e = error(&ENGINES.replace(
            "engine: trtllm }",
            "engine: trtllm, kv_replay: \"tcp://10.0.0.3:5558\" }",
        ));
        assert!(
            e.contains("models[1].workers[0].kv_replay") && e.contains("trtllm"),
            "{e}"
        );
        let e = error(&ENGINES.replace(
            "engine: trtllm }",
            "engine: trtllm, kv_events_listen: \"tcp://10.0.0.3:5558\" }",
        ));
        assert!(e.contains("models[1].workers[0].kv_events_listen"), "{e}");
        let e = error(&ENGINES.replace(
            "kv_events: \"tcp://10.0.0.2:5557\"",
            "health_url: \"http://h:1/\"",
        ));
        assert!(
            e.contains("models[0].workers[1].kv_events") && e.contains("missing"),
            "sglang needs its publisher as vLLM does: {e}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = Pools::load(Path::new("/nonexistent/pools.yaml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/pools.yaml"), "{e}");
    }
}
