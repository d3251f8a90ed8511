//! A plan's outcome as markdown (recommendation, per-mode best, frontiers, every point) and
//! its files: `plan.md`, `plan.json`, and the frontier plots
//! `frontier_throughput.svg` and `frontier_goodput.svg` (the load generator's plot code).

use std::fmt::Write as _;
use std::path::Path;

use switchyard_loadgen::compare::output::remove_stale;
use switchyard_loadgen::compare::plot::{interactivity_vs_throughput_svg, ThroughputKind};
use switchyard_loadgen::report::RunReport;
use switchyard_router::config::ServingMode;

use super::analysis::{PointMetrics, Scored};
use super::execute::PointOutcome;
use super::PlanOutcome;

fn num(x: Option<f64>, digits: usize) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "–".to_string(), |x| format!("{x:.digits$}"))
}

fn point_row(out: &mut String, outcome: &PlanOutcome, s: &Scored) {
    let m = s.metrics;
    let _ = writeln!(
        out,
        "| {} | {}× | {} | {:.3} | {:.4} | {:.1} | {} | {} |",
        s.point.label(outcome.space.workers),
        s.point.load_level,
        num(m.offered_rps, 2),
        m.goodput_rps,
        m.goodput_rps_per_gpu,
        m.tokens_per_s_per_gpu,
        num(m.interactivity_p50, 1),
        num(m.bypass_share.map(|b| b * 100.0), 1),
    );
}

const POINT_HEADER: &str =
    "| deployment | load | offered req/s | goodput req/s | goodput req/s/GPU \
     | tok/s/GPU | tok/s/user p50 | bypass % |\n|---|---|---|---|---|---|---|---|\n";

/// The plan as markdown.
pub fn plan_markdown(outcome: &PlanOutcome) -> String {
    let mut out = String::new();
    let slo = &outcome.slo;
    let _ = writeln!(
        out,
        "# Deployment plan (virtual time, simulated)\n\n{} workers ({} GPUs); SLOs: {}; \
         {} points: {} measured, {} failed, {} not run (the time bound or an interrupt came \
         first).\n",
        outcome.space.workers,
        outcome.gpus,
        slo.describe(),
        outcome.results.len(),
        outcome.measured(),
        outcome.failed(),
        outcome.not_run(),
    );
    let failed = outcome.failed_requests();
    if failed.points > 0 {
        let _ = writeln!(
            out,
            "**{} of {} measured points failed requests** (up to {} of {} sent; their errors \
             are in each point's report.json): failed requests count against goodput. A \
             request that fails at every point asks more KV than a worker holds.\n",
            failed.points,
            outcome.measured(),
            failed.most,
            failed.of,
        );
    }
    match &outcome.recommendation {
        Some(rec) => {
            let p = rec.best.point;
            let thresholds = p.thresholds.map_or_else(
                || p.policy.map_or("–", |k| k.as_str()).to_string(),
                |(t, r)| {
                    format!("isl_bounding, eff_isl_threshold {t}, eff_isl_ratio_threshold {r}")
                },
            );
            let workers = outcome.space.workers;
            let split = match p.mode {
                ServingMode::Agg => format!("{workers} aggregated workers"),
                _ => format!(
                    "{} prefill : {} decode workers",
                    p.prefill_workers,
                    workers - p.prefill_workers
                ),
            };
            let _ = writeln!(
                out,
                "## Recommended\n\n**{}** (mode {}, {split}; policy {}) at load {}×: goodput \
                 {:.3} req/s ({:.4} per GPU), {:.1} tok/s/GPU.\n",
                p.label(workers),
                p.mode.as_str(),
                thresholds,
                p.load_level,
                rec.best.metrics.goodput_rps,
                rec.best.metrics.goodput_rps_per_gpu,
                rec.best.metrics.tokens_per_s_per_gpu,
            );
            for gap in &rec.others {
                let _ = writeln!(
                    out,
                    "- best {}: {:.1} % of the recommendation's goodput",
                    gap.mode.as_str(),
                    gap.goodput_ratio * 100.0
                );
            }
            for mode in &outcome.space.modes {
                if *mode != p.mode && !rec.others.iter().any(|gap| gap.mode == *mode) {
                    let _ = writeln!(out, "- best {}: not measured (no point ran)", mode.as_str());
                }
            }
            if outcome.not_run() > 0 {
                let _ = writeln!(
                    out,
                    "\n**{} of {} points did not run** (the time bound or an interrupt came \
                     first): this is the best of the points that ran, not of the plan.",
                    outcome.not_run(),
                    outcome.results.len()
                );
            }
            out.push('\n');
        }
        None if outcome.measured() == 0 => {
            out.push_str("## Recommended\n\nNothing ran: no recommendation.\n\n")
        }
        None if outcome.nothing_served() => out.push_str(
            "## Recommended\n\nNo request succeeded at any point (the errors are in each \
             point's report.json): prompts or outputs beyond what the workers hold? No \
             deployment of these workers serves this workload.\n\n",
        ),
        None => out.push_str(
            "## Recommended\n\nNo deployment served a request within the SLOs (goodput 0 at \
             every point): no recommendation. Loosen the objectives, add workers or offer less \
             load.\n\n",
        ),
    }
    if outcome.space.slo_cost {
        out.push_str(&policies_section(outcome));
    }
    out.push_str("## Best per mode\n\n");
    out.push_str(POINT_HEADER);
    for s in &outcome.summaries {
        match &s.best {
            Some(best) => point_row(&mut out, outcome, best),
            None => {
                let _ = writeln!(out, "| {} (nothing ran) | | | | | | | |", s.mode.as_str());
            }
        }
    }
    for s in &outcome.summaries {
        let _ = writeln!(
            out,
            "\n## Frontier: {} ({} measured, {} failed or not run)\n",
            s.mode.as_str(),
            s.measured,
            s.missing
        );
        out.push_str(POINT_HEADER);
        for f in &s.frontier {
            point_row(&mut out, outcome, f);
        }
    }
    out.push_str("\n## Every point\n\n");
    out.push_str(POINT_HEADER);
    for (index, r) in outcome.results.iter().enumerate() {
        match (&r.outcome, PointMetrics::of(r)) {
            (_, Some(metrics)) => point_row(
                &mut out,
                outcome,
                &Scored {
                    index,
                    point: r.point,
                    metrics,
                },
            ),
            (PointOutcome::Failed { error }, None) => {
                let _ = writeln!(
                    out,
                    "| {} | {}× | failed: {} | | | | | |",
                    r.point.label(outcome.space.workers),
                    r.point.load_level,
                    error.replace('|', "/")
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "| {} | {}× | not run | | | | | |",
                    r.point.label(outcome.space.workers),
                    r.point.load_level
                );
            }
        }
    }
    out
}

/// The policy comparison (`--slo-cost`), against the router's default thresholds.
pub fn policies_section(outcome: &PlanOutcome) -> String {
    let d = switchyard_router::config::ConditionalDisaggConfig::default();
    let rows = super::policy_rows(outcome, (d.eff_isl_threshold, d.eff_isl_ratio_threshold));
    format!(
        "## Policies, each at its best split\n\nGoodput req/s (point). (a): bar ≥ {:.0} %; (b): \
         bar ≥ {:.0} %, and ≥ {:.0} % where prefix reuse (agg's cached prompt share) is ≥ {:.0} %.\n\n{}\n",
        super::policies::BAR_A * 100.0,
        super::policies::BAR_B_FLOOR * 100.0,
        super::policies::BAR_B_HIGH_REUSE * 100.0,
        super::policies::HIGH_REUSE * 100.0,
        super::policy_markdown(&rows, outcome.space.workers)
    )
}

/// Errors writing a plan's files.
#[derive(Debug, thiserror::Error)]
pub enum WritePlanError {
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The plan could not be serialized.
    #[error("cannot serialize the plan: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `plan.md`, `plan.json` and the frontier plots (when a frontier has a point) to
/// `dir`; returns the markdown.
///
/// # Errors
/// [`WritePlanError`] on I/O or serialization failure.
pub fn write_plan(dir: &Path, outcome: &PlanOutcome) -> Result<String, WritePlanError> {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| WritePlanError::Io {
            path: path.display().to_string(),
            source,
        })
    };
    std::fs::create_dir_all(dir).map_err(|source| WritePlanError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let markdown = plan_markdown(outcome);
    write("plan.md", &markdown)?;
    if outcome.space.slo_cost {
        write("policies.md", &policies_section(outcome))?;
    } else {
        // A reused folder keeps only this plan's files.
        remove_stale(&dir.join("policies.md")).map_err(|e| WritePlanError::Io {
            path: dir.join("policies.md").display().to_string(),
            source: e.source,
        })?;
    }
    write("plan.json", &serde_json::to_string_pretty(outcome)?)?;
    let frontier_reports: Vec<RunReport> = outcome
        .summaries
        .iter()
        .flat_map(|s| &s.frontier)
        .filter_map(|f| outcome.results[f.index].report().cloned())
        .collect();
    for (kind, name) in [
        (ThroughputKind::Total, "frontier_throughput.svg"),
        (ThroughputKind::GoodputPerGpu, "frontier_goodput.svg"),
    ] {
        // No point with an ITL: no plot, the markdown says what ran.
        if let Ok(svg) = interactivity_vs_throughput_svg(&frontier_reports, kind) {
            write(name, &svg)?;
        }
    }
    Ok(markdown)
}
