//! The prefill -> decode KV handoff, as vLLM's NixlConnector behaves (simulated); TensorRT-LLM
//! and SGLang workers use the same side channel under their own request fields
//! ([`crate::legs`]).
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

/// Body of `POST /switchyard/kv/pull` and `POST /switchyard/kv/release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    /// The hold id (`kv_transfer_params.remote_request_id`).
    pub remote_request_id: String,
    /// Who pulls or releases it (for logs; may be left out).
    #[serde(default)]
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
    holds: Mutex<Holds>,
}

#[derive(Debug, Default)]
struct Holds {
    by_request: HashMap<u64, HoldRecord>,
    /// SGLang rooms: room -> request number of the hold.
    rooms: HashMap<u64, u64>,
}

impl HoldRegistry {
    /// Records a new hold (filed under SGLang's `room` too, when there is one), forgetting
    /// expired ones.
    pub fn insert(
        &self,
        id: u64,
        room: Option<u64>,
        prefix_hash: Option<SequenceHash>,
        expires_at_ms: f64,
        now_ms: f64,
    ) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let Holds { by_request, rooms } = &mut *holds;
        by_request.retain(|_, h| h.expires_at_ms >= now_ms);
        rooms.retain(|_, request| by_request.contains_key(request));
        by_request.insert(
            id,
            HoldRecord {
                prefix_hash,
                expires_at_ms,
            },
        );
        if let Some(room) = room {
            rooms.insert(room, id);
        }
    }

    /// Forgets a hold that is being pulled, returning its prefix hash (`None` when unknown).
    pub fn take(&self, id: u64) -> Option<Option<SequenceHash>> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.by_request.remove(&id).map(|h| h.prefix_hash)
    }

    /// The request number of the hold filed under `room`, forgetting the room.
    pub fn take_room(&self, room: u64) -> Option<u64> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.rooms.remove(&room)
    }

    /// Holds recorded (live or not yet swept).
    pub fn len(&self) -> usize {
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_request
            .len()
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

impl PullTarget {
    /// The side channel of the worker at `host`:`port`, for hold `hold_id`.
    pub fn new(host: &str, port: u16, hold_id: String) -> Self {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]") // IPv6 literal.
        } else {
            host.to_owned()
        };
        PullTarget {
            url: format!("http://{host}:{port}{PULL_PATH}"),
            hold_id,
        }
    }
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
            Ok(PullTarget::new(host, port, id.clone()))
        }
        _ => Err(PullFailure::InvalidParams),
    }
}

/// Longest a simulated SGLang decode worker waits for its room's KV (wall-clock): SGLang's
/// own decode side waits up to `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` (300 s by default);
/// a simulated run has no reason to wait that long.
pub const ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How often it asks meanwhile.
const ROOM_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Pulls a room's KV (SGLang), asking until the prefill worker holds it: the prefill leg runs
/// at the same time as this decode leg, so "not held" means "not yet", and an unreachable
/// bootstrap server may be one still starting, until [`ROOM_WAIT`] (SGLang's decode side
/// waits out its own timeout too; the gateway ends a request whose prefill leg failed).
///
/// # Errors
/// The [`PullFailure`]: an odd answer (at once), or the KV never came.
pub async fn pull_room(
    client: &reqwest::Client,
    target: &PullTarget,
    requester: &str,
) -> Result<PullResponse, PullFailure> {
    let deadline = tokio::time::Instant::now() + ROOM_WAIT;
    loop {
        match pull(client, target, requester).await {
            Err(PullFailure::NotHeld | PullFailure::Unreachable)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(ROOM_POLL).await;
            }
            other => return other,
        }
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
