//! The prefill -> decode KV handoff, as vLLM's NixlConnector behaves (simulated).
//!
//! 1. A prefill worker gets a request with `kv_transfer_params.do_remote_decode: true`. It
//!    prefills (one token), keeps the prompt's blocks pinned under a *hold id*, and answers
//!    the normal completion plus `kv_transfer_params` naming itself
//!    ([`prefill_response_params`]).
//! 2. The decode worker gets those params (`do_remote_prefill: true`). Where NIXL would read
//!    the blocks over RDMA, the simulated decode worker makes a real HTTP call to the prefill
//!    worker's side channel, `POST /switchyard/kv/pull` ([`PullRequest`] -> [`PullResponse`]):
//!    the prefill worker releases the hold and says how much it held. The decode worker then
//!    waits the modelled transfer time and submits the request with the KV marked present.
//! 3. A pull that fails (prefill worker gone, hold expired or already pulled, a different
//!    prompt) falls back to local prefill and is counted by reason.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use switchyard_protocol::hash::SequenceHash;

use super::metrics::PullFailure;
use switchyard_protocol::handoff::VllmKvTransferParams as KvTransferParams;

/// Path of the side-channel endpoint on every worker's HTTP port.
pub const PULL_PATH: &str = "/switchyard/kv/pull";
/// How long a decode worker waits for a prefill worker's pull answer.
pub const PULL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Body of `POST /switchyard/kv/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    /// The hold id (`kv_transfer_params.remote_request_id`).
    pub remote_request_id: String,
    /// The decode worker pulling (for logs).
    pub requester: String,
}

/// Answer of `POST /switchyard/kv/pull` when the KV was held (and is now released).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullResponse {
    /// The prefill worker.
    pub worker_id: String,
    /// Prompt length the KV covers.
    pub prompt_tokens: u32,
    /// The engine blocks that held it.
    pub block_ids: Vec<u32>,
    /// Sequence hash of the held prompt's last full block (it names the whole prefix), so the
    /// decode worker can check the KV is for its prompt; `None` below one block.
    #[serde(default)]
    pub prefix_hash: Option<SequenceHash>,
}

/// What a prefill worker remembers about each hold beyond the engine's pinned blocks.
#[derive(Debug, Clone, Copy)]
struct HoldRecord {
    prefix_hash: Option<SequenceHash>,
    expires_at_ms: f64,
}

/// The prefill side's record of its holds, keyed by engine request id. Entries leave when
/// pulled, or at the next insert after their lease ran out (the engine unpins the blocks on
/// its own), so the map stays as small as the set of live holds.
#[derive(Debug, Default)]
pub struct HoldRegistry {
    holds: Mutex<HashMap<u64, HoldRecord>>,
}

impl HoldRegistry {
    /// Records a new hold, forgetting expired ones.
    pub fn insert(
        &self,
        id: u64,
        prefix_hash: Option<SequenceHash>,
        expires_at_ms: f64,
        now_ms: f64,
    ) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.retain(|_, h| h.expires_at_ms >= now_ms);
        holds.insert(
            id,
            HoldRecord {
                prefix_hash,
                expires_at_ms,
            },
        );
    }

    /// Forgets a hold that is being pulled, returning its prefix hash (`None` when unknown).
    pub fn take(&self, id: u64) -> Option<Option<SequenceHash>> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.remove(&id).map(|h| h.prefix_hash)
    }

    /// Holds recorded (live or not yet swept).
    pub fn len(&self) -> usize {
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no hold is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hold ids are `<worker id>-<instance id hex>-<request number>`: unique per process, and a
/// restarted worker recognises ids of its previous life as not held.
pub fn hold_id(worker_id: &str, instance_id: u64, request: u64) -> String {
    format!("{worker_id}-{instance_id:016x}-{request}")
}

/// The request number of a hold id issued by this worker instance, if it is one.
pub fn parse_hold_id(id: &str, worker_id: &str, instance_id: u64) -> Option<u64> {
    let (prefix, number) = id.rsplit_once('-')?;
    if prefix != format!("{worker_id}-{instance_id:016x}") {
        return None;
    }
    number.parse().ok()
}

/// The `kv_transfer_params` a prefill worker answers with (vLLM's field names).
pub fn prefill_response_params(
    worker_id: &str,
    hold_id: String,
    block_ids: &[u32],
    host: &str,
    port: u16,
) -> KvTransferParams {
    KvTransferParams {
        do_remote_decode: false,
        do_remote_prefill: true,
        remote_engine_id: Some(worker_id.to_owned()),
        remote_block_ids: Some(serde_json::json!(block_ids)),
        remote_request_id: Some(hold_id),
        remote_host: Some(host.to_owned()),
        remote_port: Some(port),
        tp_size: Some(1),
        extra: serde_json::Map::new(),
    }
}

/// Where to pull from, read from a decode request's `kv_transfer_params`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullTarget {
    /// `http://host:port/switchyard/kv/pull`.
    pub url: String,
    /// The hold id.
    pub hold_id: String,
}

/// Reads the pull target from the decode leg's params.
///
/// # Errors
/// [`PullFailure::InvalidParams`] when the host, port or hold id is missing.
pub fn pull_target(params: &KvTransferParams) -> Result<PullTarget, PullFailure> {
    match (
        &params.remote_host,
        params.remote_port,
        &params.remote_request_id,
    ) {
        (Some(host), Some(port), Some(id)) if !host.is_empty() && !id.is_empty() => {
            let host = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]") // IPv6 literal.
            } else {
                host.clone()
            };
            Ok(PullTarget {
                url: format!("http://{host}:{port}{PULL_PATH}"),
                hold_id: id.clone(),
            })
        }
        _ => Err(PullFailure::InvalidParams),
    }
}

/// Pulls (releases) the held KV from the prefill worker over HTTP.
///
/// # Errors
/// The [`PullFailure`] to count; the caller falls back to local prefill.
pub async fn pull(
    client: &reqwest::Client,
    target: &PullTarget,
    requester: &str,
) -> Result<PullResponse, PullFailure> {
    let body = PullRequest {
        remote_request_id: target.hold_id.clone(),
        requester: requester.to_owned(),
    };
    let response = client
        .post(&target.url)
        .timeout(PULL_TIMEOUT)
        .json(&body)
        .send()
        .await
        .map_err(|_| PullFailure::Unreachable)?;
    match response.status().as_u16() {
        200 => response
            .json::<PullResponse>()
            .await
            .map_err(|_| PullFailure::BadResponse),
        404 => Err(PullFailure::NotHeld),
        _ => Err(PullFailure::BadResponse),
    }
}
