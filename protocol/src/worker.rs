//! Worker identity, registration/heartbeat and load reports.
//!
//! A worker announces itself with a [`WorkerHeartbeat`] on [`crate::subjects::HEARTBEAT`] at a
//! fixed interval (default [`DEFAULT_HEARTBEAT_INTERVAL_MS`]). Each heartbeat carries the
//! worker's full [`WorkerInfo`], so a control plane that starts (or restarts) after the
//! workers learns the whole pool within one interval; a worker that misses
//! [`DEFAULT_HEARTBEAT_MISSES`] intervals is expired. The first heartbeat of a worker process
//! is also its registration: `instance_id` changes on every restart, which tells the control
//! plane that the worker's KV cache is cold again.

use serde::{Deserialize, Serialize};

/// Default interval between heartbeats.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// Heartbeats a worker may miss before the control plane expires it.
pub const DEFAULT_HEARTBEAT_MISSES: u32 = 3;
/// Longest interval a heartbeat may promise. The interval sets how long the worker stays in
/// the pools without another heartbeat, and the signature does not cover it: unbounded, one
/// heartbeat (or a recorded one sent again) could keep a dead worker in Envoy's pools for
/// ever.
pub const MAX_HEARTBEAT_INTERVAL_MS: u64 = 60_000;
/// Longest worker id a heartbeat may carry.
pub const MAX_WORKER_ID_LEN: usize = 128;
/// Most KV blocks a worker may state as its capacity or its use: 2^40, far above any engine
/// (a GB200 worker holds ~2^18 blocks of 16 tokens), so that the router's sums of a few such
/// counts stay far from `u64`'s end.
pub const MAX_KV_BLOCKS: u64 = 1 << 40;
/// Most prompt tokens a load report may state as queued.
pub const MAX_QUEUED_TOKENS: u64 = 1 << 48;

/// Whether `id` can name a worker that registers over NATS: one subject token of 1 to
/// [`MAX_WORKER_ID_LEN`] ASCII letters, digits, `-` or `_`.
pub fn is_usable_worker_id(id: &str) -> bool {
    id.len() <= MAX_WORKER_ID_LEN && crate::subjects::is_valid_worker_token(id)
}

/// Why a heartbeat cannot register its worker, whoever signed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidWorker {
    /// The id cannot name the worker's NATS subjects.
    #[error("worker id {0:?} must be 1 to {MAX_WORKER_ID_LEN} ASCII letters, digits, '-' or '_' (it names NATS subjects)")]
    Id(String),
    /// The address is not one Envoy can take as an endpoint.
    #[error("address {0:?} must be ip:port with a port above 0: it becomes an Envoy endpoint, which takes an IP address, not a host name")]
    Address(String),
    /// The promised interval is longer than [`MAX_HEARTBEAT_INTERVAL_MS`].
    #[error("interval_ms {0} is above {MAX_HEARTBEAT_INTERVAL_MS}")]
    Interval(u64),
    /// The model name cannot be a header value and a metric label.
    #[error("model {0:?} must be 1 to {max} printable ASCII characters without quotes or backslashes (it becomes a header value and a metric label)", max = crate::route::MAX_MODEL_HEADER_LEN)]
    Model(String),
    /// The stated KV capacity is above [`MAX_KV_BLOCKS`].
    #[error("kv_capacity_blocks {0} is above {MAX_KV_BLOCKS}")]
    Capacity(u64),
}

/// Why a load report is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLoad {
    /// A count above its bound ([`MAX_KV_BLOCKS`], [`MAX_QUEUED_TOKENS`]).
    #[error("{field} {value} is above {max}")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// What it said.
        value: u64,
        /// Its bound.
        max: u64,
    },
    /// More KV blocks in use than the capacity it states.
    #[error("kv_used_blocks {used} is above kv_total_blocks {total}")]
    UsedOverTotal {
        /// `kv_used_blocks`.
        used: u64,
        /// `kv_total_blocks`.
        total: u64,
    },
}

/// Checks that `address` is `ip:port` (port above 0), the form of an Envoy endpoint.
///
/// # Errors
/// [`InvalidWorker::Address`].
pub fn check_endpoint_address(address: &str) -> Result<std::net::SocketAddr, InvalidWorker> {
    match address.parse::<std::net::SocketAddr>() {
        Ok(socket) if socket.port() > 0 => Ok(socket),
        _ => Err(InvalidWorker::Address(address.to_owned())),
    }
}

/// Stable name of a worker, unique in the deployment (e.g. `decode-0`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

impl std::fmt::Display for WorkerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a worker does, as vLLM's NixlConnector roles behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Computes KV caches for other workers (answers `max_tokens: 1` requests carrying
    /// `kv_transfer_params.do_remote_decode`).
    Prefill,
    /// Decodes; runs the prefill locally unless handed `kv_transfer_params` to pull.
    Decode,
    /// Aggregated: prefill and decode on the same worker, no prefill pool.
    Agg,
}

impl WorkerRole {
    /// Lower-case name, as in the wire format and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
            WorkerRole::Agg => "agg",
        }
    }

    /// Whether requests may be sent to this worker to be decoded.
    pub fn serves_decode(self) -> bool {
        matches!(self, WorkerRole::Decode | WorkerRole::Agg)
    }
}

impl std::str::FromStr for WorkerRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prefill" => Ok(WorkerRole::Prefill),
            "decode" => Ok(WorkerRole::Decode),
            "agg" => Ok(WorkerRole::Agg),
            other => Err(format!(
                "unknown worker role {other:?} (expected prefill, decode or agg)"
            )),
        }
    }
}

/// The engine a worker runs, and so the protocol its prefill and decode legs speak
/// ([`crate::handoff::Handoff`]). A model's prefill and decode workers run the same engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM (KV handed over by its NIXL connector).
    #[default]
    Vllm,
    /// TensorRT-LLM's `trtllm-serve` (context-only and generation-only legs).
    Trtllm,
    /// SGLang (both legs at once, tied by a bootstrap room).
    Sglang,
}

impl Engine {
    /// Every engine, in a fixed order.
    pub const ALL: [Engine; 3] = [Engine::Vllm, Engine::Trtllm, Engine::Sglang];

    /// Lower-case name, as in pool files, flags, the wire format and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Trtllm => "trtllm",
            Engine::Sglang => "sglang",
        }
    }

    /// The handoff protocol of this engine's disaggregated legs.
    pub fn handoff(self) -> crate::handoff::Handoff {
        match self {
            Engine::Vllm => crate::handoff::Handoff::VllmNixl,
            Engine::Trtllm => crate::handoff::Handoff::TrtllmDisagg,
            Engine::Sglang => crate::handoff::Handoff::SglangBootstrap,
        }
    }

    /// Whether this is vLLM (the default, left out of serialized messages).
    pub fn is_vllm(&self) -> bool {
        *self == Engine::Vllm
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown engine {s:?} (expected vllm, trtllm or sglang)"))
    }
}

/// Everything the control plane needs to know to route to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Stable worker name.
    pub worker_id: WorkerId,
    /// Changes on every process start: a new instance has a cold cache.
    pub instance_id: u64,
    /// The worker's role.
    pub role: WorkerRole,
    /// `ip:port` of the worker's OpenAI HTTP API; this is also the Envoy endpoint address
    /// that `x-gateway-destination-endpoint` names (see [`check_endpoint_address`]).
    pub address: String,
    /// Model name served (as in `/v1/models`).
    pub model: String,
    /// KV block size in tokens.
    pub block_size: u32,
    /// KV cache capacity in blocks; 0 when the worker does not report one.
    pub kv_capacity_blocks: u64,
    /// The engine; absent (vLLM) in registrations from before engines other than vLLM.
    #[serde(default, skip_serializing_if = "Engine::is_vllm")]
    pub engine: Engine,
    /// Port of SGLang's bootstrap server on the worker's host (an SGLang prefill worker's
    /// `--disaggregation-bootstrap-port`): the decode leg's `bootstrap_port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
}

impl WorkerHeartbeat {
    /// Checks what the control plane needs of a worker that registers over NATS: an id that
    /// is one subject token, an endpoint address, an interval within bounds.
    ///
    /// # Errors
    /// The first [`InvalidWorker`] found.
    pub fn check(&self) -> Result<(), InvalidWorker> {
        let id = &self.worker.worker_id.0;
        if !is_usable_worker_id(id) {
            return Err(InvalidWorker::Id(id.clone()));
        }
        check_endpoint_address(&self.worker.address)?;
        if self.interval_ms > MAX_HEARTBEAT_INTERVAL_MS {
            return Err(InvalidWorker::Interval(self.interval_ms));
        }
        if !crate::route::is_header_safe_model(&self.worker.model) {
            return Err(InvalidWorker::Model(self.worker.model.clone()));
        }
        if self.worker.kv_capacity_blocks > MAX_KV_BLOCKS {
            return Err(InvalidWorker::Capacity(self.worker.kv_capacity_blocks));
        }
        Ok(())
    }
}

/// Periodic liveness message; doubles as registration (see module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHeartbeat {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// The worker's full description.
    pub worker: WorkerInfo,
    /// Interval the worker promises between heartbeats, so the control plane can expire it
    /// after missing a few.
    pub interval_ms: u64,
    /// When the worker sent it (Unix milliseconds); covered by `signature`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sent_at_ms: u64,
    /// HMAC-SHA256 of the worker's description and `sent_at_ms` under the deployment's
    /// registration secret (hex), when the worker has one (`registration` module, feature
    /// `registration`). A control plane with a secret refuses heartbeats without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The worker's own view of its load, published every interval on [`crate::subjects::LOAD`].
/// It corrects the control plane's predictions made from routing decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Protocol version.
    #[serde(default = "crate::default_version")]
    pub v: u32,
    /// Which worker.
    pub worker_id: WorkerId,
    /// The process that sampled it (its heartbeat's `instance_id`): a report of another
    /// process than the registered one under this id (a second process given a taken id) is
    /// ignored. Absent from workers that predate it, and from reports the control plane makes
    /// itself from a declared worker's metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<u64>,
    /// Requests being computed (prefill or decode).
    pub running: u32,
    /// Requests queued, not yet scheduled.
    pub waiting: u32,
    /// KV blocks in use by running requests.
    pub kv_used_blocks: u64,
    /// KV capacity in blocks.
    pub kv_total_blocks: u64,
    /// Prompt tokens still to be prefilled (queued and partially prefilled requests); absent
    /// (`None`) from a worker that does not know it, as engines whose metrics are scraped do
    /// not: the router's own count of what it sent there then stands alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_prefill_tokens: Option<u64>,
    /// KV blocks the queued (waiting) requests need to be admitted, at most (their whole
    /// sequences; a prefix-cache hit needs fewer). `kv_used_blocks` leaves them out, so a
    /// worker whose queue waits for KV looks less full than it is without this. 0 (absent)
    /// from workers that do not report it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_waiting_blocks: u64,
}

impl LoadReport {
    /// Checks that the counts can be true of an engine: none above its bound, and no more
    /// blocks in use than the capacity stated (0: not stated). The router adds these counts up
    /// when it routes; a report of `u64::MAX` blocks in use wrapped around and made a full
    /// worker look empty.
    ///
    /// # Errors
    /// The first [`InvalidLoad`] found.
    pub fn check(&self) -> Result<(), InvalidLoad> {
        let bounded = [
            ("kv_used_blocks", self.kv_used_blocks, MAX_KV_BLOCKS),
            ("kv_total_blocks", self.kv_total_blocks, MAX_KV_BLOCKS),
            ("kv_waiting_blocks", self.kv_waiting_blocks, MAX_KV_BLOCKS),
            (
                "queued_prefill_tokens",
                self.queued_prefill_tokens.unwrap_or(0),
                MAX_QUEUED_TOKENS,
            ),
        ];
        if let Some(&(field, value, max)) = bounded.iter().find(|(_, v, max)| v > max) {
            return Err(InvalidLoad::TooLarge { field, value, max });
        }
        if self.kv_total_blocks > 0 && self.kv_used_blocks > self.kv_total_blocks {
            return Err(InvalidLoad::UsedOverTotal {
                used: self.kv_used_blocks,
                total: self.kv_total_blocks,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heartbeat(id: &str, address: &str, interval_ms: u64) -> WorkerHeartbeat {
        WorkerHeartbeat {
            v: 1,
            worker: WorkerInfo {
                worker_id: WorkerId(id.into()),
                instance_id: 1,
                role: WorkerRole::Decode,
                address: address.into(),
                model: "m".into(),
                block_size: 16,
                kv_capacity_blocks: 0,
                engine: Engine::default(),
                bootstrap_port: None,
            },
            interval_ms,
            sent_at_ms: 0,
            signature: None,
        }
    }

    #[test]
    fn a_heartbeat_needs_a_subject_token_id_an_endpoint_address_and_a_bounded_interval() {
        assert_eq!(
            heartbeat("decode-0", "127.0.0.1:8000", 1_000).check(),
            Ok(())
        );
        assert_eq!(
            heartbeat("d_1", "[::1]:8000", MAX_HEARTBEAT_INTERVAL_MS).check(),
            Ok(())
        );
        for id in [
            "",
            "bad.id",
            "sp ace",
            "a*",
            &"x".repeat(MAX_WORKER_ID_LEN + 1),
        ] {
            assert_eq!(
                heartbeat(id, "127.0.0.1:8000", 1_000).check(),
                Err(InvalidWorker::Id(id.into()))
            );
        }
        for address in [
            "localhost:8000",
            "127.0.0.1",
            "127.0.0.1:0",
            "10.0.0.1:99999",
            "",
        ] {
            assert_eq!(
                heartbeat("decode-0", address, 1_000).check(),
                Err(InvalidWorker::Address(address.into()))
            );
        }
        assert_eq!(
            heartbeat("decode-0", "127.0.0.1:8000", u64::MAX).check(),
            Err(InvalidWorker::Interval(u64::MAX))
        );
        for model in ["evil\"} 1\nforged 42\n#", "", "a\\b", &"m".repeat(300)] {
            let mut hb = heartbeat("decode-0", "127.0.0.1:8000", 1_000);
            hb.worker.model = model.into();
            assert_eq!(hb.check(), Err(InvalidWorker::Model(model.into())));
        }
        let mut hb = heartbeat("decode-0", "127.0.0.1:8000", 1_000);
        hb.worker.kv_capacity_blocks = MAX_KV_BLOCKS + 1;
        assert_eq!(hb.check(), Err(InvalidWorker::Capacity(MAX_KV_BLOCKS + 1)));
    }

    fn load(used: u64, total: u64) -> LoadReport {
        LoadReport {
            v: 1,
            worker_id: WorkerId("decode-0".into()),
            instance_id: None,
            running: 1,
            waiting: 0,
            kv_used_blocks: used,
            kv_total_blocks: total,
            queued_prefill_tokens: Some(0),
            kv_waiting_blocks: 0,
        }
    }

    #[test]
    fn a_load_report_states_counts_an_engine_can_have() {
        assert_eq!(load(10, 100).check(), Ok(()));
        assert_eq!(load(100, 100).check(), Ok(()));
        assert_eq!(load(10, 0).check(), Ok(()), "capacity not stated");
        assert_eq!(
            load(101, 100).check(),
            Err(InvalidLoad::UsedOverTotal {
                used: 101,
                total: 100
            })
        );
        assert_eq!(
            load(u64::MAX, 0).check(),
            Err(InvalidLoad::TooLarge {
                field: "kv_used_blocks",
                value: u64::MAX,
                max: MAX_KV_BLOCKS
            })
        );
        let mut queued = load(0, 100);
        queued.queued_prefill_tokens = Some(u64::MAX);
        assert!(matches!(
            queued.check(),
            Err(InvalidLoad::TooLarge {
                field: "queued_prefill_tokens",
                ..
            })
        ));
    }
}
