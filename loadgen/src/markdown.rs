//! Markdown rendering of one run's report (comparisons: [`crate::compare::table`]).

use std::fmt::Write as _;

use super::report::RunReport;
use super::stats::Summary;
use switchyard_engine::SpeedUp;

/// `x` with `digits` decimals, or `–` when missing or not finite.
pub(crate) fn num(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "–".to_string(),
    }
}

/// A share as a percentage with one decimal, or `–` when missing.
pub(crate) fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{:.1} %", v * 100.0))
}

fn summary_row(out: &mut String, name: &str, s: &Summary, digits: usize) {
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} |",
        num(s.p50, digits),
        num(s.p90, digits),
        num(s.p99, digits),
        num(s.mean, digits),
        s.count
    );
}

/// The report of one run as markdown.
pub fn run_markdown(r: &RunReport) -> String {
    let m = &r.meta;
    let mut out = String::new();
    let _ = writeln!(out, "# Load test: {}\n", m.label);
    let _ = writeln!(
        out,
        "- workload `{}`, seed {}, arrival scale {}, {} planned requests, offered {}",
        m.workload,
        m.seed,
        m.arrival_scale,
        m.planned_requests,
        m.offered_rps.map_or_else(
            || "load – (closed loop, or all at once)".to_string(),
            |rps| format!("{rps:.2} req/s")
        )
    );
    if m.malformed_trace_lines > 0 {
        let _ = writeln!(
            out,
            "- **{} trace line(s) skipped as malformed**: the workload is smaller than the file",
            m.malformed_trace_lines
        );
    }
    let _ = writeln!(
        out,
        "- endpoint `{}`, mode {}, {} GPUs",
        m.endpoint,
        m.mode.as_deref().unwrap_or("–"),
        m.gpus
    );
    if m.speed_up != SpeedUp::REAL {
        let _ = writeln!(
            out,
            "- simulated workers ran {}x faster than the modelled hardware; all times and rates \
             below are in modelled time (measured × {})",
            m.speed_up, m.speed_up
        );
    }
    if let Some(stop) = &m.interrupted {
        let _ = writeln!(
            out,
            "- **interrupted after {:.1} s of real time** ({:.1} s modelled): only the requests \
             that finished are measured; {} in flight were cut (not counted below) and the rest \
             were not sent",
            stop.after_s,
            stop.after_modelled_s(m.speed_up),
            stop.cut
        );
    }
    let c = &r.requests;
    let _ = writeln!(
        out,
        "- requests: {} sent, {} ok, {} failed, {} not sent; window {:.1} s\n",
        c.sent, c.ok, c.failed, c.not_sent, r.window_s
    );
    out.push_str("| metric | p50 | p90 | p99 | mean | n |\n|---|---|---|---|---|---|\n");
    summary_row(&mut out, "TTFT (ms)", &r.ttft_ms, 1);
    summary_row(&mut out, "ITL (ms)", &r.itl_ms, 2);
    summary_row(&mut out, "E2E (ms)", &r.e2e_ms, 1);
    let i = &r.interactivity;
    let _ = writeln!(
        out,
        "| interactivity (tok/s/user) | {} | {} | {} | | |\n",
        num(i.p50, 1),
        num(i.p90, 1),
        num(i.p99, 1)
    );
    let t = &r.throughput;
    out.push_str("| throughput | value |\n|---|---|\n");
    let rows = [
        ("requests/s", t.requests_per_s),
        ("input tokens/s", t.input_tokens_per_s),
        ("output tokens/s", t.output_tokens_per_s),
        ("input+output tokens/s/GPU", t.total_tokens_per_s_per_gpu),
        ("output tokens/s/GPU", t.output_tokens_per_s_per_gpu),
        (
            "goodput (requests/s meeting SLOs)",
            r.goodput.requests_per_s,
        ),
    ];
    for (name, v) in rows {
        let _ = writeln!(out, "| {name} | {v:.2} |");
    }
    let g = &r.goodput;
    let _ = writeln!(
        out,
        "\nSLOs: {}; {} of sent requests met them.\n",
        g.slo.describe(),
        pct(Some(g.share))
    );
    let tok = &r.tokens;
    let _ = writeln!(
        out,
        "Tokens: {} planned content, {} expected by the server, {} reported ({} cached, {}); \
         {} prompt and {} output count mismatches.\n",
        tok.planned_input,
        tok.expected_prompt,
        tok.reported_prompt,
        tok.reported_cached,
        pct(tok.cached_share),
        tok.prompt_count_mismatches,
        tok.output_count_mismatches
    );
    let _ = writeln!(
        out,
        "Routes (bypass share {}):\n",
        pct(r.routes.bypass_share)
    );
    // Two tables: each request counts once by mode and once by reason.
    out.push_str("| route mode | requests |\n|---|---|\n");
    for (k, v) in &r.routes.modes {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    if !r.routes.reasons.is_empty() {
        out.push_str("\n| route reason | requests |\n|---|---|\n");
        for (k, v) in &r.routes.reasons {
            let _ = writeln!(out, "| {k} | {v} |");
        }
    }
    if !r.workers.is_empty() {
        out.push_str("\n| worker | requests |\n|---|---|\n");
        for (k, v) in &r.workers {
            let _ = writeln!(out, "| {k} | {v} |");
        }
    }
    if !r.errors.is_empty() {
        out.push_str("\n| error | requests |\n|---|---|\n");
        for (k, v) in &r.errors {
            let _ = writeln!(out, "| {k} | {v} |");
        }
    }
    out
}
