//! Proptest at scale over everything the control plane reads from outside: route bodies
//! (JSON parse, OpenAI validation, chat-template tokenization, prompt length), NATS worker
//! messages (heartbeats, load reports, KV event batches, other replicas' updates, decoded and applied to a
//! `ControlCore`), pool files (YAML/JSON), and config patches. Nothing may panic; any error is
//! fine. Inputs are mutated seeds (valid documents with bytes flipped, inserted, deleted or
//! repeated) and structured random JSON over each target's own field names, from a fixed seed,
//! so a run is repeatable. A failing input is shrunk, printed, and the run exits 1. Each target
//! also counts the inputs that reached its deepest step (tokenized, applied to the core,
//! loaded as pools, accepted as a config).
//!
//! ```sh
//! cargo run --release -p switchyard-control-plane --example fuzz_inputs -- all 2500000
//! cargo run --release -p switchyard-control-plane --example fuzz_inputs -- route_body 100000 7
//! ```
//! (targets: `route_body`, `nats_messages`, `pool_file`, `config_patch`, `all`; then the
//! cases per target, default 10,000; then the seed, default 1.) The vLLM KV-event decoders
//! have their own targets in `adapters/` (`fuzz/` and the `fuzz_frames` example).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{json, Value};

use switchyard_control_plane::pools::file::Pools;
use switchyard_control_plane::router::{ControlCore, Router};
use switchyard_control_plane::service::tokenizer::{
    load_model_tokenizer, PromptTokenizer, DEFAULT_MODEL_DIR_NAMED_BY,
};
use switchyard_protocol::kv::KvEventBatch;
use switchyard_protocol::openai::{check_prompt_length, generation_params};
use switchyard_protocol::replica::{ReplicaSync, ReplicaUpdate};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::worker::{LoadReport, WorkerHeartbeat};

/// One way of changing a seed's bytes.
#[derive(Debug, Clone, Copy)]
enum Edit {
    Overwrite(usize, u8),
    Insert(usize, u8),
    Delete(usize, usize),
    Repeat(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Overwrite(at, b)),
        (
            any::<usize>(),
            prop::sample::select(&b"{}[]\":,0-9e.\\ \n\x00\xff"[..])
        )
            .prop_map(|(at, b)| Edit::Insert(at, b)),
        (any::<usize>(), 1usize..16).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Repeat(at, n)),
    ]
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = bytes.len().max(1);
        match *e {
            Edit::Overwrite(at, b) if !bytes.is_empty() => bytes[at % len] = b,
            Edit::Insert(at, b) => bytes.insert(at % (bytes.len() + 1), b),
            Edit::Delete(at, n) if !bytes.is_empty() => {
                let start = at % len;
                let end = (start + n).min(bytes.len());
                bytes.drain(start..end);
            }
            Edit::Repeat(at, n) if !bytes.is_empty() => {
                let start = at % len;
                let end = (start + n).min(bytes.len());
                let piece = bytes[start..end].to_vec();
                bytes.splice(end..end, piece);
            }
            _ => {}
        }
    }
    bytes
}

/// Seeds with some bytes edited.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(seeds),
        prop::collection::vec(edit(), 0..8),
    )
        .prop_map(|(seed, edits)| apply(seed, &edits))
}

/// Random JSON whose object keys come from `keys` (the fields the target reads) with leaves at
/// the edges of what they should hold.
fn json_over(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![
            0i64,
            1,
            -1,
            16,
            64,
            2048,
            i64::from(u32::MAX),
            i64::MAX,
            i64::MIN
        ])
        .prop_map(Value::from),
        prop::sample::select(vec![0.0f64, 0.5, 1.0, 1.5, -0.0, 1e300, f64::MIN_POSITIVE])
            .prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "user",
            "assistant",
            "system",
            "tool",
            "decode",
            "prefill",
            "agg",
            "vllm",
            "<|im_start|>",
            "<|im_end|>",
            "<think>",
            "\u{0}",
            "\u{feff}é漢🙂",
            "1e3",
            "yes",
            "isl_bounding",
            "conditional",
            "tcp://127.0.0.1:1",
        ])
        .prop_map(Value::from),
        "[ -~]{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(keys), inner), 0..8).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

fn bytes_of(values: &[Value]) -> Vec<Vec<u8>> {
    values.iter().map(|v| v.to_string().into_bytes()).collect()
}

/// What one target does with one input; `Err` only for a broken invariant (a panic is caught
/// by proptest and reported the same way).
type Check = Box<dyn Fn(&[u8]) -> Result<(), TestCaseError>>;

struct Target {
    name: &'static str,
    inputs: BoxedStrategy<Vec<u8>>,
    check: Check,
    /// Inputs that got through parsing to the deepest step (tokenized, applied, loaded), so a
    /// run shows how far its inputs reach, not only that nothing panicked.
    deep: Arc<AtomicU64>,
}

const ROUTE_KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "name",
    "tool_calls",
    "tools",
    "function",
    "arguments",
    "type",
    "text",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "temperature",
    "chat_template_kwargs",
    "enable_thinking",
    "add_generation_prompt",
    "continue_final_message",
    "reasoning_content",
    "tool_call_id",
];

fn route_body(tokenizer: Arc<dyn PromptTokenizer>) -> Target {
    let seeds = vec![
        json!({"model": "qwen3", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}),
        json!({"model": "qwen3", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": "42"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
        json!({"model": "qwen3", "prompt": "Once upon a time", "max_tokens": "5", "n": 1}),
        json!({"model": "qwen3", "prompt": [1, 2, 3], "max_tokens": 1e3}),
    ];
    let inputs = prop_oneof![
        3 => mutated(bytes_of(&seeds)),
        2 => json_over(ROUTE_KEYS).prop_map(|v| v.to_string().into_bytes()),
    ]
    .boxed();
    let deep = Arc::new(AtomicU64::new(0));
    let reached = Arc::clone(&deep);
    let check = move |bytes: &[u8]| {
        // The control plane's order (api/route.rs): JSON, object, engine checks, tokens, length.
        for api in [ApiKind::Chat, ApiKind::Completions] {
            let Ok(json) = serde_json::from_slice::<Value>(bytes) else {
                continue;
            };
            let Some(object) = json.as_object() else {
                continue;
            };
            if generation_params(api, object, 32_768).is_err() {
                continue;
            }
            if let Ok(tokens) = tokenizer.tokenize(api, &json) {
                reached.fetch_add(1, Ordering::Relaxed);
                let _ = check_prompt_length(tokens.len(), 32_768);
            }
        }
        Ok(())
    };
    Target {
        name: "route_body",
        inputs,
        check: Box::new(check),
        deep,
    }
}

const NATS_KEYS: &[&str] = &[
    "v",
    "worker",
    "worker_id",
    "instance_id",
    "address",
    "role",
    "model",
    "block_size",
    "kv_capacity_blocks",
    "interval_ms",
    "sent_at_ms",
    "signature",
    "seq",
    "resync",
    "events",
    "type",
    "parent",
    "blocks",
    "seq_hash",
    "block_id",
    "block_ids",
    "running",
    "waiting",
    "kv_used_blocks",
    "kv_total_blocks",
    "queued_prefill_tokens",
    "replica",
    "sent_at_unix_ms",
    "update",
    "kind",
    "request_id",
    "decode",
    "prefill",
    "prefill_tokens",
    "blocks",
    "tail_blocks",
    "events",
    "event",
];

/// A heartbeat as a simulated worker sends it (docs/protocol.md).
fn seed_heartbeat() -> Value {
    json!({"v": 1, "worker": {"worker_id": "decode-0", "instance_id": 7, "role": "decode",
        "address": "127.0.0.1:9001", "model": "qwen3", "block_size": 64,
        "kv_capacity_blocks": 1000}, "interval_ms": 200, "sent_at_ms": 1})
}

fn nats_messages() -> Target {
    let heartbeat = seed_heartbeat();
    let load = json!({"v": 1, "worker_id": "decode-0", "running": 3, "waiting": 1,
        "kv_used_blocks": 10, "kv_total_blocks": 1000, "queued_prefill_tokens": 4096});
    let kv = json!({"v": 1, "worker_id": "decode-0", "instance_id": 7, "seq": 1, "events": [
        {"type": "stored", "parent": null, "block_size": 64,
         "blocks": [{"seq_hash": 11, "block_id": 1}, {"seq_hash": 12, "block_id": 2}]},
        {"type": "stored", "parent": 12, "block_size": 64, "blocks": [{"seq_hash": 13, "block_id": 3}]},
        {"type": "removed", "block_ids": [2]},
        {"type": "cleared"}]});
    // What another control-plane replica publishes (switchyard.replicas.sync).
    let routed = json!({"v": 1, "replica": "cp-1", "sent_at_unix_ms": 5, "update": {
        "kind": "routed", "request_id": "r-1",
        "decode": {"worker_id": "decode-0", "prefill_tokens": 64, "blocks": [11, 12], "tail_blocks": 1},
        "prefill": {"worker_id": "decode-0", "prefill_tokens": 0, "blocks": [11], "tail_blocks": 0}}});
    let lifecycle = json!({"v": 1, "replica": "cp-1", "sent_at_unix_ms": 5, "update": {
        "kind": "lifecycle", "events": [{"event": "first_token", "request_id": "r-1"},
            {"event": "done", "request_id": "r-1", "ok": true}]}});
    let inputs = prop_oneof![
        3 => mutated(bytes_of(&[heartbeat, load, kv, routed, lifecycle])),
        2 => json_over(NATS_KEYS).prop_map(|v| v.to_string().into_bytes()),
    ]
    .boxed();
    let deep = Arc::new(AtomicU64::new(0));
    let reached = Arc::clone(&deep);
    let check = move |bytes: &[u8]| {
        // As the consumer does: decode each kind, then hand it to the control core, which holds
        // a worker registered from the seed heartbeat so batches and reports reach real state.
        let mut core = ControlCore::new(Router::new(), 3);
        let seed: WorkerHeartbeat = serde_json::from_value(seed_heartbeat())
            .map_err(|e| TestCaseError::fail(format!("seed heartbeat: {e}")))?;
        core.heartbeat(&seed, 0);
        let mut applied = false;
        if let Ok(hb) = serde_json::from_slice::<WorkerHeartbeat>(bytes) {
            core.heartbeat(&hb, 10);
            applied = true;
        }
        if let Ok(report) = serde_json::from_slice::<LoadReport>(bytes) {
            core.load(&report, 20);
            applied = true;
        }
        if let Ok(batch) = serde_json::from_slice::<KvEventBatch>(bytes) {
            core.kv_batch(&batch, 30);
            let _ = core.tick(40);
            applied = true;
        }
        if let Ok(sync) = serde_json::from_slice::<ReplicaSync>(bytes) {
            match sync.update {
                ReplicaUpdate::Routed {
                    request_id,
                    decode,
                    prefill,
                } => {
                    let _ = core.peer_route(&request_id, &decode, prefill.as_ref(), 50);
                }
                ReplicaUpdate::Lifecycle { events } => {
                    for event in &events {
                        core.lifecycle(event, 50);
                    }
                }
            }
            let _ = core.tick(60);
            applied = true;
        }
        reached.fetch_add(u64::from(applied), Ordering::Relaxed);
        Ok(())
    };
    Target {
        name: "nats_messages",
        inputs,
        check: Box::new(check),
        deep,
    }
}

const POOL_KEYS: &[&str] = &[
    "models",
    "name",
    "block_size",
    "model_dir",
    "workers",
    "id",
    "role",
    "address",
    "engine",
    "kv_events",
    "kv_events_listen",
    "kv_replay",
    "health",
    "interval_ms",
    "timeout_ms",
    "unhealthy_after",
    "metrics",
    "max_model_len",
];

fn pool_file() -> Target {
    let yaml = "health: { interval_ms: 200, timeout_ms: 200, unhealthy_after: 2 }\nmetrics: { interval_ms: 200 }\nmodels:\n  - name: qwen3\n    block_size: 64\n    workers:\n      - id: decode-0\n        role: decode\n        address: 127.0.0.1:8000\n        engine: vllm\n        kv_events: tcp://127.0.0.1:5557\n        kv_replay: tcp://127.0.0.1:5558\n      - id: prefill-0\n        role: prefill\n        address: 127.0.0.1:8001\n        engine: vllm\n        kv_events_listen: tcp://127.0.0.1:5559\n";
    let as_json = json!({"models": [{"name": "qwen3", "block_size": 64, "workers": [
        {"id": "decode-0", "role": "decode", "address": "127.0.0.1:8000", "engine": "vllm",
         "kv_events": "tcp://127.0.0.1:5557"}]}]});
    let inputs = prop_oneof![
        3 => mutated(vec![yaml.as_bytes().to_vec(), as_json.to_string().into_bytes()]),
        2 => json_over(POOL_KEYS).prop_map(|v| v.to_string().into_bytes()),
    ]
    .boxed();
    let deep = Arc::new(AtomicU64::new(0));
    let reached = Arc::clone(&deep);
    let check = move |bytes: &[u8]| {
        if let Ok(text) = std::str::from_utf8(bytes) {
            for name in ["pools.yaml", "pools.json"] {
                let loaded = Pools::parse(text, Path::new(name)).is_ok();
                reached.fetch_add(u64::from(loaded), Ordering::Relaxed);
            }
        }
        Ok(())
    };
    Target {
        name: "pool_file",
        inputs,
        check: Box::new(check),
        deep,
    }
}

const CONFIG_KEYS: &[&str] = &[
    "serving_mode",
    "policy",
    "eff_isl_threshold",
    "eff_isl_ratio_threshold",
    "prefill_busy_threshold",
    "prefill_queue_budget_tokens",
    "decode_busy_threshold",
    "selection",
    "overlap_weight",
    "decode_blocks_weight",
    "decode_prefill_weight",
    "prefill_queue_weight",
    "prefill_overlap_weight",
    "prefill_blocks_weight",
    "temperature",
    "load",
    "prefill_timeout_ms",
    "request_timeout_ms",
    "kv_prediction_ms",
    "report_grace_ms",
    "stale_in_flight_ms",
    "handoff_timeout_ms",
];

fn config_patch() -> Target {
    let seeds = vec![
        json!({"policy": "isl_or_load", "decode_busy_threshold": 0.9}),
        json!({"eff_isl_threshold": 1024, "eff_isl_ratio_threshold": 0.5, "serving_mode": "agg"}),
        json!({"selection": {"temperature": 0.0}, "load": {"kv_prediction_ms": 0}}),
        json!({"decode_busy_threshold": null, "prefill_queue_budget_tokens": 65536}),
    ];
    let inputs = prop_oneof![
        3 => mutated(bytes_of(&seeds)),
        2 => json_over(CONFIG_KEYS).prop_map(|v| v.to_string().into_bytes()),
    ]
    .boxed();
    let deep = Arc::new(AtomicU64::new(0));
    let reached = Arc::clone(&deep);
    let check = move |bytes: &[u8]| {
        let Ok(patch) = serde_json::from_slice::<Value>(bytes) else {
            return Ok(());
        };
        let base = switchyard_control_plane::config::RouterConfig::default();
        if let Ok(next) = base.apply_json_patch(&patch) {
            reached.fetch_add(1, Ordering::Relaxed);
            // What PUT /v1/config accepts must be a config the router takes.
            let mut router = Router::new();
            router
                .set_config(next)
                .map_err(|e| TestCaseError::fail(format!("accepted patch refused: {e}")))?;
        }
        Ok(())
    };
    Target {
        name: "config_patch",
        inputs,
        check: Box::new(check),
        deep,
    }
}

fn model_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.cache/models/qwen3"
            ))
        })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("all");
    let cases: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let tokenizer = match load_model_tokenizer(&model_dir(), DEFAULT_MODEL_DIR_NAMED_BY) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e} (run scripts/setup.sh, or set SWITCHYARD_MODEL_DIR)");
            return ExitCode::from(64);
        }
    };
    let targets = [
        route_body(tokenizer),
        nats_messages(),
        pool_file(),
        config_patch(),
    ];
    if which != "all" && !targets.iter().any(|t| t.name == which) {
        eprintln!("error: unknown target {which:?}: route_body, nats_messages, pool_file, config_patch or all");
        return ExitCode::from(64);
    }
    let mut total = 0u64;
    for target in targets.iter().filter(|t| which == "all" || t.name == which) {
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        seed_bytes[8..8 + target.name.len().min(24)]
            .copy_from_slice(&target.name.as_bytes()[..target.name.len().min(24)]);
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 10_000,
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        );
        // Time is only reported, never asserted: the wall clock is read here on purpose.
        #[allow(clippy::disallowed_methods)]
        let started = std::time::Instant::now();
        let result = runner.run(&target.inputs, |input| (target.check)(&input));
        let elapsed = started.elapsed();
        match result {
            Ok(()) => {
                total += u64::from(cases);
                println!(
                    "{:<14} {cases:>10} inputs  0 panics  {:>10} reached the deepest step  {:>7.1} s",
                    target.name,
                    target.deep.load(Ordering::Relaxed),
                    elapsed.as_secs_f64()
                );
            }
            Err(e) => {
                println!("{:<14} FAILED: {e}", target.name);
                return ExitCode::FAILURE;
            }
        }
    }
    println!("total          {total:>10} inputs  0 panics (seed {seed})");
    ExitCode::SUCCESS
}
