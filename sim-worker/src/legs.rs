//! What a request's handoff fields ask of a simulated worker, read in its engine's protocol
//! (`--engine`), and what its prefill answer says back.
//!
//! Each engine names the two legs differently (`switchyard_protocol::handoff` has the
//! gateway's side):
//! - vLLM: `kv_transfer_params.do_remote_decode` (prefill leg), `do_remote_prefill` plus the
//!   hold's host, port and id (decode leg); the answer's top-level `kv_transfer_params`.
//! - TensorRT-LLM: `disaggregated_params.request_type` `context_only` (prefill leg) and
//!   `generation_only` (decode leg) with the context answer's `choices[0].disaggregated_params`.
//!   **Simulated**: a real context server's `encoded_opaque_state` is its KV transceiver's
//!   state; the simulated one is base64 of where to pull the hold from (JSON), which only
//!   another simulated worker reads.
//! - SGLang: `bootstrap_host`, `bootstrap_port`, `bootstrap_room` on both legs, sent at once.
//!   The prefill worker holds the KV under the room; the decode worker fetches it from the
//!   bootstrap address, waiting for the prefill to finish. **Simulated**: the bootstrap server
//!   is the worker's own HTTP side channel (its advertised bootstrap port is its HTTP port).
//!
//! A worker reads only its own engine's fields: a vLLM worker ignores `bootstrap_room`, as
//! vLLM itself would.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use switchyard_protocol::handoff::{
    TrtllmDisaggregatedParams, VllmKvTransferParams, BOOTSTRAP_HOST, BOOTSTRAP_PORT,
    BOOTSTRAP_ROOM, DISAGGREGATED_PARAMS, DISAGG_REQUEST_ID, KV_TRANSFER_PARAMS,
    MIN_DISAGG_REQUEST_ID, TRTLLM_CONTEXT_ONLY, TRTLLM_GENERATION_ONLY,
};
use switchyard_protocol::worker::{Engine, WorkerRole};

use super::error::ApiError;
use super::handoff::{pull_target, PullTarget};
use super::metrics::PullFailure;

/// What the request asks of the worker's KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegRequest {
    /// Compute the prompt's KV and hold it for a decode worker; SGLang names the room the
    /// decode worker will ask for.
    Prefill {
        /// SGLang's bootstrap room.
        room: Option<u64>,
    },
    /// Fetch the prompt's KV from a prefill worker instead of computing it.
    Decode(KvSource),
}

/// Where a decode leg's KV is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvSource {
    /// A hold the prefill answer named (vLLM, TensorRT-LLM); an error when the fields do not
    /// say where (the worker prefills locally, counted, as vLLM does).
    Hold(Result<PullTarget, PullFailure>),
    /// A room on a bootstrap server (SGLang), which may not exist yet: the prefill leg runs
    /// at the same time.
    Room(PullTarget),
}

/// Reads the handoff fields of `body` in `engine`'s protocol, for a worker of `role` (SGLang's
/// two legs carry the same fields: the worker's role says which leg it got).
///
/// # Errors
/// A 400 naming the field when the fields are present but malformed.
pub fn read(
    engine: Engine,
    role: WorkerRole,
    body: &Map<String, Value>,
) -> Result<Option<LegRequest>, ApiError> {
    match engine {
        Engine::Vllm => read_vllm(body),
        Engine::Trtllm => read_trtllm(body),
        Engine::Sglang => read_sglang(role, body),
    }
}

fn present<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

fn read_vllm(body: &Map<String, Value>) -> Result<Option<LegRequest>, ApiError> {
    let Some(value) = present(body, KV_TRANSFER_PARAMS) else {
        return Ok(None);
    };
    let params = VllmKvTransferParams::deserialize(value).map_err(|e| {
        ApiError::bad_request(
            format!("invalid {KV_TRANSFER_PARAMS}: {e}"),
            Some(KV_TRANSFER_PARAMS),
        )
    })?;
    Ok(if params.do_remote_decode {
        Some(LegRequest::Prefill { room: None })
    } else if params.do_remote_prefill {
        Some(LegRequest::Decode(KvSource::Hold(pull_target(&params))))
    } else {
        None
    })
}

/// Where a simulated TensorRT-LLM context server's hold can be pulled: the content of its
/// `encoded_opaque_state` (base64 of this, as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimulatedOpaqueState {
    /// The context worker's host.
    pub host: String,
    /// Its side channel's port.
    pub port: u16,
    /// The hold id.
    pub hold: String,
}

impl SimulatedOpaqueState {
    /// Base64 of the JSON, as `encoded_opaque_state` carries a real engine's bytes.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    /// The state back from `encoded_opaque_state`; `None` when it is not one of ours.
    pub fn decode(encoded: &str) -> Option<Self> {
        let json = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()?;
        serde_json::from_slice(&json).ok()
    }
}

fn read_trtllm(body: &Map<String, Value>) -> Result<Option<LegRequest>, ApiError> {
    let Some(value) = present(body, DISAGGREGATED_PARAMS) else {
        return Ok(None);
    };
    let params = TrtllmDisaggregatedParams::deserialize(value).map_err(|e| {
        ApiError::bad_request(
            format!("invalid {DISAGGREGATED_PARAMS}: {e}"),
            Some(DISAGGREGATED_PARAMS),
        )
    })?;
    match params.request_type.as_deref() {
        Some(TRTLLM_CONTEXT_ONLY) => Ok(Some(LegRequest::Prefill { room: None })),
        Some(TRTLLM_GENERATION_ONLY) => {
            let target = params
                .encoded_opaque_state
                .as_deref()
                .and_then(SimulatedOpaqueState::decode)
                .map(|state| PullTarget::new(&state.host, state.port, state.hold))
                .ok_or(PullFailure::InvalidParams);
            Ok(Some(LegRequest::Decode(KvSource::Hold(target))))
        }
        // `context_and_generation` (TensorRT-LLM's default) and anything else: a whole
        // request.
        _ => Ok(None),
    }
}

/// What a simulated TensorRT-LLM server makes of `disaggregated_params.disagg_request_id`, the
/// id a gateway may draw for both legs of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DisaggRequestId {
    /// TensorRT-LLM 1.0, whose request models forbid fields they do not know: a leg carrying
    /// one is refused 400.
    #[default]
    Refused,
    /// A newer server moving KV with the Python transceiver, whose sender asserts that the
    /// context leg carried one: a leg without one is refused 500 (the assertion, as the
    /// request fails inside the server), as is one below the gateway range.
    Required,
}

impl std::str::FromStr for DisaggRequestId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "refused" => Ok(DisaggRequestId::Refused),
            "required" => Ok(DisaggRequestId::Required),
            other => Err(format!("{other:?}: expected refused or required")),
        }
    }
}

/// Checks a TensorRT-LLM leg's `disagg_request_id` against what the server models; any other
/// engine's body, and a whole request (no `disaggregated_params`), passes.
///
/// # Errors
/// A 400 for an id a 1.0 server would not know, a 500 for one the Python transceiver misses.
pub fn check_disagg_request_id(
    engine: Engine,
    expects: DisaggRequestId,
    body: &Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(Value::Object(params)) = present(body, DISAGGREGATED_PARAMS) else {
        return Ok(());
    };
    if engine != Engine::Trtllm {
        return Ok(());
    }
    let id = params.get(DISAGG_REQUEST_ID).filter(|v| !v.is_null());
    match (expects, id) {
        (DisaggRequestId::Refused, Some(_)) => Err(ApiError::bad_request(
            format!("{DISAGGREGATED_PARAMS}.{DISAGG_REQUEST_ID}: extra inputs are not permitted (simulated TensorRT-LLM 1.0)"),
            Some(DISAGGREGATED_PARAMS),
        )),
        (DisaggRequestId::Required, id)
            if !id
                .and_then(Value::as_u64)
                .is_some_and(|id| (MIN_DISAGG_REQUEST_ID..1 << 63).contains(&id)) =>
        {
            Err(ApiError::internal(format!(
                "the Python KV transceiver needs {DISAGGREGATED_PARAMS}.{DISAGG_REQUEST_ID}, an integer in [2^40, 2^63); got {id:?} (simulated)"
            )))
        }
        _ => Ok(()),
    }
}

/// The hold id a simulated SGLang prefill worker files a room's KV under.
pub fn room_hold_id(room: u64) -> String {
    format!("room-{room}")
}

/// The room of a [`room_hold_id`].
pub fn parse_room_hold_id(id: &str) -> Option<u64> {
    id.strip_prefix("room-")?.parse().ok()
}

fn read_sglang(
    role: WorkerRole,
    body: &Map<String, Value>,
) -> Result<Option<LegRequest>, ApiError> {
    let Some(room) = present(body, BOOTSTRAP_ROOM) else {
        return Ok(None);
    };
    let invalid = |field: &str, what: &str| {
        ApiError::bad_request(format!("`{field}` must be {what}"), Some(field))
    };
    let room = room
        .as_u64()
        .filter(|room| *room < 1 << 63)
        .ok_or_else(|| invalid(BOOTSTRAP_ROOM, "an integer in 0..2^63"))?;
    let host = present(body, BOOTSTRAP_HOST)
        .and_then(Value::as_str)
        .filter(|host| !host.is_empty())
        .ok_or_else(|| invalid(BOOTSTRAP_HOST, "the prefill worker's host"))?;
    let port = present(body, BOOTSTRAP_PORT)
        .and_then(Value::as_u64)
        .and_then(|port| u16::try_from(port).ok())
        .filter(|port| *port != 0)
        .ok_or_else(|| invalid(BOOTSTRAP_PORT, "a port between 1 and 65535"))?;
    if role == WorkerRole::Prefill {
        return Ok(Some(LegRequest::Prefill { room: Some(room) }));
    }
    let target = PullTarget::new(host, port, room_hold_id(room));
    Ok(Some(LegRequest::Decode(KvSource::Room(target))))
}

/// What a prefill answer carries back, per engine: vLLM's top-level `kv_transfer_params`,
/// TensorRT-LLM's `choices[0].disaggregated_params`, nothing for SGLang (its decode worker
/// knows the room already).
#[derive(Debug, Clone, PartialEq)]
pub enum PrefillAnswer {
    /// vLLM.
    Vllm(VllmKvTransferParams),
    /// TensorRT-LLM.
    Trtllm(TrtllmDisaggregatedParams),
}

/// A simulated TensorRT-LLM context answer's params: the first token, the context request's
/// id, and where the hold is (in the opaque state).
pub fn trtllm_context_params(
    request: u64,
    first_token: u32,
    host: &str,
    port: u16,
    hold: String,
) -> TrtllmDisaggregatedParams {
    let state = SimulatedOpaqueState {
        host: host.to_owned(),
        port,
        hold,
    };
    TrtllmDisaggregatedParams {
        request_type: Some(TRTLLM_CONTEXT_ONLY.to_owned()),
        first_gen_tokens: Some(vec![first_token]),
        ctx_request_id: Some(request),
        encoded_opaque_state: Some(state.encode()),
        draft_tokens: None,
        extra: Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn a_disagg_request_id_is_refused_by_1_0_and_required_by_the_python_transceiver() {
        let leg = |params: Value| object(json!({ "disaggregated_params": params }));
        let with = leg(json!({"request_type": "context_only", "disagg_request_id": 1u64 << 50}));
        let without = leg(json!({"request_type": "context_only"}));
        let local = leg(json!({"request_type": "context_only", "disagg_request_id": 7}));
        let check = |expects, body: &Map<String, Value>| {
            check_disagg_request_id(Engine::Trtllm, expects, body).map_err(|e| e.status)
        };
        assert_eq!(check(DisaggRequestId::Refused, &without), Ok(()));
        assert_eq!(check(DisaggRequestId::Refused, &with), Err(400));
        assert_eq!(check(DisaggRequestId::Required, &with), Ok(()));
        for missing in [&without, &local] {
            assert_eq!(check(DisaggRequestId::Required, missing), Err(500));
        }
        // A whole request, and another engine's body, pass either way.
        let whole = object(json!({"model": "m"}));
        assert_eq!(check(DisaggRequestId::Required, &whole), Ok(()));
        assert_eq!(
            check_disagg_request_id(Engine::Vllm, DisaggRequestId::Required, &with)
                .map_err(|e| e.status),
            Ok(())
        );
        assert_eq!("required".parse(), Ok(DisaggRequestId::Required));
        assert!("sometimes".parse::<DisaggRequestId>().is_err());
    }

    #[test]
    fn each_engine_reads_only_its_own_fields() {
        let vllm_prefill = object(json!({"kv_transfer_params": {"do_remote_decode": true}}));
        let trtllm_ctx = object(json!({"disaggregated_params": {"request_type": "context_only"}}));
        let sglang = object(json!({"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
            "bootstrap_room": 7}));
        assert_eq!(
            read(Engine::Vllm, WorkerRole::Decode, &vllm_prefill).unwrap(),
            Some(LegRequest::Prefill { room: None })
        );
        assert_eq!(
            read(Engine::Trtllm, WorkerRole::Decode, &trtllm_ctx).unwrap(),
            Some(LegRequest::Prefill { room: None })
        );
        assert_eq!(
            read(Engine::Sglang, WorkerRole::Decode, &sglang).unwrap(),
            Some(LegRequest::Decode(KvSource::Room(PullTarget::new(
                "10.0.0.1",
                8998,
                "room-7".into()
            ))))
        );
        assert_eq!(
            read(Engine::Sglang, WorkerRole::Prefill, &sglang).unwrap(),
            Some(LegRequest::Prefill { room: Some(7) })
        );
        for engine in Engine::ALL {
            for body in [&vllm_prefill, &trtllm_ctx, &sglang] {
                let own = match engine {
                    Engine::Vllm => std::ptr::eq(body, &vllm_prefill),
                    Engine::Trtllm => std::ptr::eq(body, &trtllm_ctx),
                    Engine::Sglang => std::ptr::eq(body, &sglang),
                };
                assert_eq!(
                    read(engine, WorkerRole::Decode, body).unwrap().is_some(),
                    own,
                    "{engine} {body:?}"
                );
            }
        }
    }

    #[test]
    fn a_trtllm_generation_leg_pulls_from_the_opaque_state() {
        let params = trtllm_context_params(42, 9, "10.0.0.3", 8100, "hold-1".into());
        assert_eq!(params.ctx_request_id, Some(42));
        let mut generation = serde_json::to_value(&params).unwrap();
        generation["request_type"] = "generation_only".into();
        let body = object(json!({ "disaggregated_params": generation }));
        assert_eq!(
            read(Engine::Trtllm, WorkerRole::Decode, &body).unwrap(),
            Some(LegRequest::Decode(KvSource::Hold(Ok(PullTarget::new(
                "10.0.0.3",
                8100,
                "hold-1".into()
            )))))
        );
        // A real engine's opaque state (not ours) cannot be pulled from: local prefill.
        let foreign = object(
            json!({"disaggregated_params": {"request_type": "generation_only",
            "encoded_opaque_state": "AAEC"}}),
        );
        assert_eq!(
            read(Engine::Trtllm, WorkerRole::Decode, &foreign).unwrap(),
            Some(LegRequest::Decode(KvSource::Hold(Err(
                PullFailure::InvalidParams
            ))))
        );
        let whole =
            object(json!({"disaggregated_params": {"request_type": "context_and_generation"}}));
        assert_eq!(
            read(Engine::Trtllm, WorkerRole::Decode, &whole).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_fields_are_refused_by_name() {
        let cases = [
            (
                Engine::Sglang,
                json!({"bootstrap_room": -1, "bootstrap_host": "h", "bootstrap_port": 1}),
                "bootstrap_room",
            ),
            (
                Engine::Sglang,
                json!({"bootstrap_room": 1u64 << 63, "bootstrap_host": "h", "bootstrap_port": 1}),
                "bootstrap_room",
            ),
            (
                Engine::Sglang,
                json!({"bootstrap_room": 1, "bootstrap_port": 1}),
                "bootstrap_host",
            ),
            (
                Engine::Sglang,
                json!({"bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": 70000}),
                "bootstrap_port",
            ),
            (
                Engine::Trtllm,
                json!({"disaggregated_params": {"ctx_request_id": "x"}}),
                "disaggregated_params",
            ),
            (
                Engine::Vllm,
                json!({"kv_transfer_params": {"remote_port": "x"}}),
                "kv_transfer_params",
            ),
        ];
        for (engine, body, field) in cases {
            let err = read(engine, WorkerRole::Decode, &object(body.clone())).unwrap_err();
            assert_eq!(err.status, 400, "{body}");
            assert!(
                err.to_json().to_string().contains(field),
                "{body}: {}",
                err.to_json()
            );
        }
    }
}
