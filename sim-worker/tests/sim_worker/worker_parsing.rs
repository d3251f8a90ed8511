//! Pure parts of the worker: `--worker` specs, request fields, hold ids, pull targets, the
//! time scale.

use serde_json::json;
use switchyard_engine::SpeedUp;
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::worker::{Engine, WorkerId, WorkerRole};
use switchyard_sim_worker::config::SpecError;
use switchyard_sim_worker::handoff::{
    hold_id, parse_hold_id, prefill_response_params, pull_target,
};
use switchyard_sim_worker::legs::{self, KvSource, LegRequest};
use switchyard_sim_worker::openai::{parse_request, DEFAULT_MAX_TOKENS};
use switchyard_sim_worker::runtime::EngineClock;
use switchyard_sim_worker::{PullFailure, WorkerConfig, WorkerSpec};

#[test]
fn worker_specs_parse_role_id_host_and_port() {
    let spec: WorkerSpec = "decode:decode-0@127.0.0.1:8001".parse().unwrap();
    assert_eq!(spec.role, WorkerRole::Decode);
    assert_eq!(spec.id, WorkerId("decode-0".into()));
    assert_eq!(spec.host, "127.0.0.1");
    assert_eq!(spec.port, 8001);
    let v6: WorkerSpec = "prefill:p_1@[::1]:0".parse().unwrap();
    assert_eq!(v6.host, "::1");
    assert_eq!(v6.port, 0);

    let refused = |spec: &str| spec.parse::<WorkerSpec>().expect_err(spec);
    assert!(matches!(refused("decode-0@h:1"), SpecError::Shape(_)));
    assert!(matches!(refused("agg:w@:1"), SpecError::Shape(_)));
    assert!(matches!(refused("agg:w@h"), SpecError::Shape(_)));
    assert!(matches!(refused("chef:w@h:1"), SpecError::Role { .. }));
    assert!(matches!(refused("agg:w.x@h:1"), SpecError::Id(_)));
    assert!(matches!(refused("agg:@h:1"), SpecError::Id(_)));
    // Longer than the control plane takes over NATS: it would never join.
    let long = format!("agg:{}@h:1", "d".repeat(129));
    assert!(matches!(refused(&long), SpecError::Id(_)));
    assert!(matches!(refused("agg:w@h:70000"), SpecError::Port(_)));
    // Advertised as an Envoy endpoint, which takes an IP address.
    assert!(matches!(
        refused("decode:d@localhost:8001"),
        SpecError::Host(_)
    ));
}

#[test]
fn worker_configs_reject_unusable_values() {
    let spec: WorkerSpec = "agg:w@127.0.0.1:0".parse().unwrap();
    let mut cfg = WorkerConfig::new(spec);
    assert!(cfg.validate().is_ok());
    // A speed-up of 0 or NaN cannot be built at all (the field is a `SpeedUp`).
    assert!(SpeedUp::new(0.0)
        .unwrap_err()
        .to_string()
        .contains("speed-up"));
    assert!(SpeedUp::new(f64::NAN).is_err());
    cfg.speed_up = SpeedUp::REAL;
    cfg.engine.kv_capacity_blocks = 0;
    assert!(cfg.validate().unwrap_err().contains("kv_capacity_blocks"));
}

/// The simulated model's context.
const CONTEXT: u32 = switchyard_sim_worker::config::DEFAULT_MAX_MODEL_LEN;

#[test]
fn request_fields_have_vllm_defaults_and_precedence() {
    let r = parse_request(ApiKind::Chat, json!({"messages": []}), CONTEXT).unwrap();
    assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
    assert!(!r.stream && !r.include_usage && r.model.is_none());

    let r = parse_request(
        ApiKind::Chat,
        json!({"messages": [], "max_tokens": 9, "max_completion_tokens": 4, "stream": true,
               "stream_options": {"include_usage": true}, "n": 1, "model": "m"}),
        CONTEXT,
    )
    .unwrap();
    assert_eq!(r.max_tokens, 4);
    assert!(r.stream && r.include_usage);
    assert_eq!(r.model.as_deref(), Some("m"));

    // Completions know no max_completion_tokens.
    let r = parse_request(
        ApiKind::Completions,
        json!({"prompt": "x", "max_completion_tokens": 4}),
        CONTEXT,
    )
    .unwrap();
    assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);

    for (body, param) in [
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"max_tokens": 1.5}), "max_tokens"),
        (json!({"max_tokens": 10_000_000}), "max_tokens"),
        (json!({"n": 3}), "n"),
        (json!({"model": 3}), "model"),
        (
            json!({"stream": true, "stream_options": 1}),
            "stream_options",
        ),
    ] {
        let e = parse_request(ApiKind::Completions, body.clone(), CONTEXT).unwrap_err();
        assert_eq!(e.status, 400, "{body}");
        assert_eq!(e.param.as_deref(), Some(param), "{body}");
    }
}

#[test]
fn kv_transfer_params_accept_vllm_shapes() {
    let fields = |v: serde_json::Value| match v {
        serde_json::Value::Object(m) => m,
        _ => unreachable!(),
    };
    // The prefill leg as our filter and vLLM's proxy send it.
    let leg = legs::read(
        Engine::Vllm,
        WorkerRole::Decode,
        &fields(json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
               "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}})),
    )
    .unwrap();
    assert_eq!(leg, Some(LegRequest::Prefill { room: None }));

    // A prefill response's params, including newer vLLM's per-group block lists and extra fields.
    let leg = legs::read(
        Engine::Vllm,
        WorkerRole::Decode,
        &fields(
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_block_ids": [[1, 2]],
               "remote_engine_id": "p", "remote_request_id": "r", "remote_host": "10.0.0.1",
               "remote_port": 8100, "tp_size": 4, "something_new": 1}}),
        ),
    )
    .unwrap();
    let Some(LegRequest::Decode(KvSource::Hold(Ok(target)))) = leg else {
        panic!("{leg:?}");
    };
    assert_eq!(target.url, "http://10.0.0.1:8100/switchyard/kv/pull");
    assert_eq!(target.hold_id, "r");
}

#[test]
fn prefill_params_round_trip_into_a_pull_target() {
    let id = hold_id("prefill-0", 0xabc, 17);
    let params = prefill_response_params("prefill-0", id.clone(), &[3, 4], "::1", 9000);
    let as_json = serde_json::to_value(&params).unwrap();
    for field in [
        "do_remote_prefill",
        "do_remote_decode",
        "remote_engine_id",
        "remote_block_ids",
        "remote_request_id",
        "remote_host",
        "remote_port",
        "tp_size",
    ] {
        assert!(
            as_json.get(field).is_some(),
            "{field} missing from {as_json}"
        );
    }
    let target = pull_target(&params).unwrap();
    assert_eq!(target.url, "http://[::1]:9000/switchyard/kv/pull");
    assert_eq!(parse_hold_id(&target.hold_id, "prefill-0", 0xabc), Some(17));
    // A hold id of another worker or of an earlier start of this one is not ours.
    assert_eq!(parse_hold_id(&target.hold_id, "prefill-1", 0xabc), None);
    assert_eq!(parse_hold_id(&target.hold_id, "prefill-0", 0xabd), None);
    assert_eq!(parse_hold_id("garbage", "prefill-0", 0xabc), None);

    let mut missing = params.clone();
    missing.remote_port = None;
    assert_eq!(pull_target(&missing), Err(PullFailure::InvalidParams));
}

#[tokio::test]
async fn the_speed_up_divides_wall_clock_waits() {
    let clock = EngineClock::new(SpeedUp::new(10.0).unwrap());
    assert_eq!(
        clock.real_duration(100.0),
        std::time::Duration::from_millis(10)
    );
    assert_eq!(clock.real_duration(-5.0), std::time::Duration::ZERO);
    let slow = EngineClock::new(SpeedUp::new(0.5).unwrap());
    assert_eq!(
        slow.real_duration(100.0),
        std::time::Duration::from_millis(200)
    );
    // Engine time runs ahead of wall time by the factor.
    assert!(
        clock.instant_at(1_000.0) - clock.instant_at(0.0) == std::time::Duration::from_millis(100)
    );
}
