//! The comparison as markdown (pure), the same for every front end: a headline table with one
//! row per run (what each mode costs and what it buys at each offered load), then the
//! details (E2E, interactivity tail, goodput share, routes, errors).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::markdown::{num, pct};
use crate::report::{RunMeta, RunReport};
use crate::stats::Summary;

fn triple(s: &Summary, digits: usize) -> String {
    format!(
        "{} / {} / {}",
        num(s.p50, digits),
        num(s.p90, digits),
        num(s.p99, digits)
    )
}

fn counts(map: &BTreeMap<String, usize>) -> String {
    if map.is_empty() {
        return "–".to_string();
    }
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The offered load of a run: its load level (> 1 = more load than planned) and the rate
/// that makes, e.g. `1.5× (12.30 req/s)`.
pub fn offered_load(m: &RunMeta) -> String {
    match (m.load_level, m.offered_rps) {
        (Some(level), Some(rps)) => format!("{level}× ({rps:.2} req/s)"),
        (Some(level), None) => format!("{level}×"),
        (None, Some(rps)) => format!("{rps:.2} req/s"),
        (None, None) => "–".to_string(),
    }
}

/// One row per run, in the order given: mode, offered load, outcomes, latency percentiles,
/// throughput and goodput.
pub fn headline_table(runs: &[RunReport]) -> String {
    let mut out = String::from(
        "| run | mode | offered load | ok / sent (failed, not sent) | TTFT p50 / p90 / p99 (ms) \
         | ITL p50 / p90 / p99 (ms) | tok/s/user p50 | tok/s/GPU in+out | out tok/s/GPU \
         | goodput req/s | bypass |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let c = &r.requests;
        let t = &r.throughput;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} / {} ({}, {}) | {} | {} | {} | {:.1} | {:.1} | {:.2} | {} |",
            r.meta.label,
            r.meta.mode.as_deref().unwrap_or("–"),
            offered_load(&r.meta),
            c.ok,
            c.sent,
            c.failed,
            c.not_sent,
            triple(&r.ttft_ms, 0),
            triple(&r.itl_ms, 1),
            num(r.interactivity.p50, 1),
            t.total_tokens_per_s_per_gpu,
            t.output_tokens_per_s_per_gpu,
            r.goodput.requests_per_s,
            pct(r.routes.bypass_share),
        );
    }
    out
}

/// The headline table, the details per run and what goodput counted.
pub fn comparison_tables(runs: &[RunReport]) -> String {
    let mut out = headline_table(runs);
    out.push_str(
        "\n| run | E2E p50 / p90 / p99 (ms) | tok/s/user p50 / p90 / p99 | goodput share \
         | routes | route reasons | cached prompt share | errors |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let i = &r.interactivity;
        let _ = writeln!(
            out,
            "| {} | {} | {} / {} / {} | {} | {} | {} | {} | {} |",
            r.meta.label,
            triple(&r.e2e_ms, 0),
            num(i.p50, 1),
            num(i.p90, 1),
            num(i.p99, 1),
            pct(Some(r.goodput.share)),
            counts(&r.routes.modes),
            counts(&r.routes.reasons),
            pct(r.tokens.cached_share),
            counts(&r.errors),
        );
    }
    out.push_str(&objectives_note(runs));
    out.push_str(&interrupted_note(runs));
    out
}

/// A warning naming the runs stopped before their end: they measured only the requests that
/// finished early (the long ones were cut), so they do not compare with whole runs.
fn interrupted_note(runs: &[RunReport]) -> String {
    let stopped: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let stop = r.meta.interrupted?;
            Some(format!(
                "{} (after {:.1} s, {} cut)",
                r.meta.label, stop.after_s, stop.cut
            ))
        })
        .collect();
    if stopped.is_empty() {
        return String::new();
    }
    format!(
        "
**Interrupted runs**: {}. Each measured only the requests that finished before it \
         was stopped; it does not compare with whole runs.\n",
        stopped.join(", ")
    )
}

/// What the goodput columns count: one line when every run was scored against the same
/// objectives; otherwise each run's, and a warning, since goodput scored against different
/// objectives does not compare.
fn objectives_note(runs: &[RunReport]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let shared = first.goodput.slo.describe();
    if runs.iter().all(|r| r.goodput.slo.describe() == shared) {
        return format!("\nGoodput counts successful requests with {shared} (– = no objective).\n");
    }
    let each: Vec<String> = runs
        .iter()
        .map(|r| format!("{}: {}", r.meta.label, r.goodput.slo.describe()))
        .collect();
    format!(
        "\n**These runs were scored against different objectives; their goodput does not \
         compare.** Goodput counts successful requests within each run's own: {} (– = no \
         objective).\n",
        each.join("; ")
    )
}

/// Share of sent requests that failed open (no verdict in time) above which a run's note
/// warns that the serving mode was mostly not applied.
pub const FAIL_OPEN_WARNING_SHARE: f64 = 0.10;

/// A warning when more than [`FAIL_OPEN_WARNING_SHARE`] of a run's requests were forwarded
/// without a verdict: those were served as plain decode/agg requests, so the run says little
/// about its serving mode.
pub fn fail_open_note(r: &RunReport) -> Option<String> {
    let failed_open = r.routes.modes.get("fail-open").copied().unwrap_or(0);
    let sent = r.requests.sent;
    (sent > 0 && failed_open as f64 / sent as f64 > FAIL_OPEN_WARNING_SHARE).then(|| {
        format!(
            "{failed_open} of {sent} requests failed open (no route verdict in time; reasons \
             {}): they were served without the {} policy, so this run mostly measures \
             fail-open routing",
            counts(&r.routes.reasons),
            r.meta.mode.as_deref().unwrap_or("serving")
        )
    })
}

#[cfg(test)]
mod tests {
    use switchyard_engine::SpeedUp;

    use super::*;
    use crate::record::RequestRecord;
    use crate::report::{build_report, Slo};
    use crate::LoadLevel;

    fn record(id: usize, route: &str, error: Option<&str>) -> RequestRecord {
        RequestRecord {
            id,
            sent_ms: id as f64 * 10.0,
            ready_ms: id as f64 * 10.0,
            ttft_ms: Some(100.0),
            e2e_ms: Some(190.0),
            planned_isl: 10,
            expected_prompt_tokens: 18,
            planned_osl: 10,
            prompt_tokens: Some(18),
            completion_tokens: Some(10),
            content_chunks: 10,
            route: Some(route.into()),
            status: Some(if error.is_some() { 503 } else { 200 }),
            error: error.map(str::to_string),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn rows_carry_failures_routes_and_converted_times() {
        let records = vec![
            record(0, "bypass;reason=short", None),
            record(1, "disagg;reason=long", None),
            record(2, "disagg", Some("http 503: overloaded")),
        ];
        let meta = RunMeta {
            label: "conditional@x1".into(),
            mode: Some("conditional".into()),
            gpus: 8,
            speed_up: SpeedUp::new(4.0).unwrap(),
            ..RunMeta::default()
        };
        let report = build_report(meta, &records, 1, Slo::default());
        let md = comparison_tables(&[report]);
        // 2 ok of 3 sent, 1 failed, 1 never sent: nothing dropped.
        assert!(md.contains("| 2 / 3 (1, 1) |"), "{md}");
        // Times are in modelled time: measured 100 ms at 4x speed-up.
        assert!(md.contains("| 400 / 400 / 400 |"), "{md}");
        assert!(md.contains("bypass"), "{md}");
        assert!(md.contains("http 503"), "{md}");
    }

    #[test]
    fn the_goodput_note_names_the_objectives_scored_exactly() {
        let records = vec![record(0, "bypass", None)];
        let run = |label: &str, itl_ms: f64| {
            let meta = RunMeta {
                label: label.into(),
                ..RunMeta::default()
            };
            let slo = Slo {
                ttft_ms: Some(2000.0),
                itl_ms: Some(itl_ms),
            };
            build_report(meta, &records, 0, slo)
        };
        let same = comparison_tables(&[run("a", 14.5), run("b", 14.5)]);
        assert!(
            same.contains("requests with TTFT ≤ 2000 ms, ITL ≤ 14.5 ms (– = no objective)"),
            "not rounded to 14 or 15: {same}"
        );
        let mixed = comparison_tables(&[run("a", 25.0), run("b", 14.5)]);
        assert!(mixed.contains("does not compare"), "{mixed}");
        assert!(
            mixed.contains("a: TTFT ≤ 2000 ms, ITL ≤ 25 ms; b: TTFT ≤ 2000 ms, ITL ≤ 14.5 ms"),
            "{mixed}"
        );
    }

    #[test]
    fn offered_load_says_the_multiplier_and_the_rate() {
        let mut meta = RunMeta {
            load_level: Some(LoadLevel::new(1.5).unwrap()),
            offered_rps: Some(12.3),
            ..RunMeta::default()
        };
        assert_eq!(offered_load(&meta), "1.5× (12.30 req/s)");
        meta.load_level = None;
        assert_eq!(offered_load(&meta), "12.30 req/s");
        meta.offered_rps = None;
        assert_eq!(offered_load(&meta), "–");
    }

    #[test]
    fn runs_that_mostly_failed_open_are_flagged() {
        let meta = RunMeta {
            label: "disagg@x1".into(),
            mode: Some("disagg".into()),
            gpus: 4,
            ..RunMeta::default()
        };
        let mostly_open: Vec<RequestRecord> = (0..10)
            .map(|i| {
                let route = if i < 8 {
                    "fail-open;reason=timeout"
                } else {
                    "disagg"
                };
                record(i, route, None)
            })
            .collect();
        let report = build_report(meta.clone(), &mostly_open, 0, Slo::default());
        let note = fail_open_note(&report).expect("8 of 10 failed open");
        assert!(note.starts_with("8 of 10 requests failed open"), "{note}");
        assert!(note.contains("fail-open:timeout 8"), "{note}");
        // One in ten is at the threshold, not above it.
        let one_open: Vec<RequestRecord> = (0..10)
            .map(|i| record(i, if i == 0 { "fail-open" } else { "disagg" }, None))
            .collect();
        let report = build_report(meta, &one_open, 0, Slo::default());
        assert_eq!(fail_open_note(&report), None);
    }

    #[test]
    fn interrupted_runs_are_named_under_the_tables() {
        let mut stopped = RunReport::default();
        stopped.meta.label = "agg@x1".into();
        stopped.meta.interrupted = Some(crate::report::Interrupted {
            after_s: 12.5,
            cut: 3,
        });
        let whole = RunReport::default();
        let tables = comparison_tables(&[stopped, whole.clone()]);
        assert!(
            tables.contains("**Interrupted runs**: agg@x1 (after 12.5 s, 3 cut)"),
            "{tables}"
        );
        assert!(!comparison_tables(&[whole]).contains("Interrupted"));
    }
}
