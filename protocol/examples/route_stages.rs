//! Where a route call's prompt work goes, stage by stage, for 8k / 32k / 128k-token chats:
//! JSON parse of the body, chat-template rendering, tokenization (cold, and warm with the
//! earlier turns in the segment cache), block hashing. Prints a table of median times.
//!
//! `cargo run --release -p switchyard-protocol --features tokenizer --example route_stages`

// The control plane's allocator, so the figures are the service's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use serde_json::{json, Value};
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed};
use switchyard_protocol::route::ApiKind;
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};

fn words(tag: &str, n: usize) -> String {
    let vocab = [
        "the",
        "router",
        "keeps",
        "each",
        "session",
        "near",
        "its",
        "cache",
        "while",
        "long",
        "prompts",
        "prefill",
        "elsewhere",
        "tool",
        "call",
        "result",
    ];
    (0..n)
        .map(|i| {
            if i % 16 == 0 {
                format!("{tag}-{i}")
            } else {
                vocab[(i * 5 + tag.len()) % vocab.len()].to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(tag: &str, turns: usize, words_per_msg: usize, question: &str) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": words(&format!("{tag}-sys"), words_per_msg)})];
    for t in 0..turns {
        messages
            .push(json!({"role": "user", "content": words(&format!("{tag}-u{t}"), words_per_msg)}));
        messages.push(
            json!({"role": "assistant", "content": words(&format!("{tag}-a{t}"), words_per_msg)}),
        );
    }
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": "qwen3", "messages": messages})
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// A benchmark reads the wall clock; nothing here is logic under test.
#[allow(clippy::disallowed_methods)]
fn time<T>(n: usize, mut f: impl FnMut(usize) -> T) -> f64 {
    let mut samples = Vec::new();
    for i in 0..n {
        let start = std::time::Instant::now();
        std::hint::black_box(f(i));
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    median(samples)
}

fn main() {
    let tok = ModelTokenizer::from_dir(&default_model_dir()).expect("model dir");
    let bs = BlockSize::try_new(16).unwrap();
    // The very first prompt a fresh process tokenizes pays one-time costs (the thread pool,
    // the regex engines' lazily built automata, the BPE word cache): a 128k-token cold prompt.
    let first = chat("first", 32, 1275, "q");
    let first_ms = time(1, |_| tok.tokenize_request(ApiKind::Chat, &first).unwrap());
    let again = chat("again", 32, 1275, "q");
    let again_ms = time(1, |_| tok.tokenize_request(ApiKind::Chat, &again).unwrap());
    println!("first cold 128k prompt of the process: {first_ms:.1} ms; the next cold one: {again_ms:.1} ms\n");
    println!("| prompt | body KB | parse ms | render ms | tokenize warm ms | tokenize cold ms | single-message growing ms | hash ms |");
    for (label, words_per_msg) in [("8k", 80usize), ("32k", 320), ("128k", 1275)] {
        let turns = 32; // 64 turns
        let body = chat("conv", turns, words_per_msg, "q0");
        let text = body.to_string();
        let parse = time(20, |_| serde_json::from_str::<Value>(&text).unwrap());
        let render = time(10, |_| tok.render_chat(&body).unwrap());
        tok.tokenize_request(ApiKind::Chat, &body).unwrap();
        let warm_bodies: Vec<Value> = (0..10)
            .map(|i| chat("conv", turns, words_per_msg, &format!("new question {i}")))
            .collect();
        let warm = time(10, |i| {
            tok.tokenize_request(ApiKind::Chat, &warm_bodies[i])
                .unwrap()
        });
        let cold_bodies: Vec<Value> = (0..3)
            .map(|i| chat(&format!("cold{i}x"), turns, words_per_msg, "q"))
            .collect();
        let cold = time(3, |i| {
            tok.tokenize_request(ApiKind::Chat, &cold_bodies[i])
                .unwrap()
        });
        // One long user message that grows each turn (trace replays).
        let base = words("grow", words_per_msg * 65);
        let seed = json!({"model": "qwen3", "messages": [{"role": "user", "content": base}]});
        tok.tokenize_request(ApiKind::Chat, &seed).unwrap();
        let grow_bodies: Vec<Value> = (0..3)
            .map(|i| json!({"model": "qwen3", "messages": [{"role": "user", "content": format!("{base} more words {i}")}]}))
            .collect();
        let grow = time(3, |i| {
            tok.tokenize_request(ApiKind::Chat, &grow_bodies[i])
                .unwrap()
        });
        let ids = tok.tokenize_request(ApiKind::Chat, &body).unwrap();
        let hash = time(20, |_| sequence_hashes(&ids, bs, HashSeed::default()));
        println!(
            "| {label} ({} tokens) | {} | {parse:.2} | {render:.2} | {warm:.2} | {cold:.1} | {grow:.1} | {hash:.3} |",
            ids.len(),
            text.len() / 1024
        );
    }
}
