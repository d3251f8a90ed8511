//! Cold vs cached tokenization of a ~32k-token multi-turn chat (the control plane tokenizes
//! every request; agentic sessions resend a growing context every turn).
//!
//! `cargo bench -p switchyard-protocol --features tokenizer --bench tokenize`

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};

/// A conversation of about 32k tokens: a long system prompt and 16 turns of mixed prose and code.
fn long_chat(extra_user_turn: Option<String>) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a meticulous coding agent. ".repeat(300)}),
    ];
    for turn in 0..16 {
        messages.push(json!({"role": "user", "content": format!(
            "Turn {turn}: please refactor this module. {}",
            (0..40).map(|i| format!("fn step_{turn}_{i}(x: u64) -> u64 {{ x.wrapping_mul({i}) ^ 0x5f }} // Schritt {i} ✓\n")).collect::<String>()
        )}));
        messages.push(json!({"role": "assistant", "content": format!(
            "Done with turn {turn}. {}", "The refactor keeps behaviour identical while reducing allocations. ".repeat(25)
        )}));
    }
    if let Some(turn) = extra_user_turn {
        messages.push(json!({"role": "user", "content": turn}));
    }
    json!({"messages": messages})
}

fn bench_tokenize(c: &mut Criterion) {
    let dir = default_model_dir();
    let cold = ModelTokenizer::from_dir_with_cache_bytes(&dir, 0)
        .expect("model dir (run scripts/setup.sh)");
    let warm = ModelTokenizer::from_dir(&dir).expect("model dir");
    let body = long_chat(None);
    let tokens = cold.tokenize_request(ApiKind::Chat, &body).unwrap().len();
    eprintln!("prompt: {tokens} tokens");

    let mut group = c.benchmark_group("chat_32k");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(tokens as u64));
    group.bench_function("render_only", |b| {
        b.iter(|| warm.render_chat(&body).unwrap())
    });
    let rendered = warm.render_chat(&body).unwrap();
    group.bench_function("hf_encode_whole_text", |b| {
        b.iter(|| cold.encode_uncached(&rendered, false).unwrap())
    });
    group.bench_function("cold_no_cache", |b| {
        b.iter(|| cold.tokenize_request(ApiKind::Chat, &body).unwrap())
    });
    warm.tokenize_request(ApiKind::Chat, &body).unwrap();
    group.bench_function("cached_same_prompt", |b| {
        b.iter(|| warm.tokenize_request(ApiKind::Chat, &body).unwrap())
    });
    let turn = AtomicU64::new(0);
    group.bench_function("cached_prefix_new_turn", |b| {
        b.iter_batched(
            || {
                long_chat(Some(format!(
                    "New question #{}: what changed?",
                    turn.fetch_add(1, Ordering::Relaxed)
                )))
            },
            |body| warm.tokenize_request(ApiKind::Chat, &body).unwrap(),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_tokenize);
criterion_main!(benches);
