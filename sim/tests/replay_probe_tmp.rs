use switchyard_control_plane::config::ServingMode;
use switchyard_sim::loadgen::trace::{plan_trace, read_trace};
use switchyard_sim::replay::{run_mode, PromptSource, StackSpec};

#[test]
#[allow(clippy::disallowed_methods)]
fn probe() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/mooncake_conversation_trace.jsonl");
    let t0 = std::time::Instant::now();
    let parsed = read_trace(std::path::Path::new(path), 512).unwrap();
    let mut w = plan_trace(&parsed, 512, 0);
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(12031);
    w.truncate(n);
    eprintln!("parsed {:?}", t0.elapsed());
    let src = PromptSource::synthetic(w.content_seed);
    let t = std::time::Instant::now();
    let mut total = 0usize;
    for r in &w.requests { total += src.token_ids(r).len(); }
    eprintln!("tokens only {total} {:?}", t.elapsed());
    for mode in [ServingMode::Agg, ServingMode::Disagg, ServingMode::Conditional] {
        let t = std::time::Instant::now();
        let run = run_mode(&w, &src, StackSpec::new(mode, 8, 2)).unwrap();
        let bypass = run.notes.iter().filter(|n| n.mode == switchyard_protocol::route::RouteMode::Bypass).count();
        eprintln!("{mode:?}: {:?} records {} not_sent {} bypass {bypass} {:?}", t.elapsed(), run.records.len(), run.not_sent, run.counters);
    }
}
