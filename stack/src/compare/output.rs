//! The files a comparison writes.
//!
//! ```text
//! <out>/comparison.md                        setup, tables, cross-check, notes
//! <out>/comparison.json                      settings + every report (+ virtual ones)
//! <out>/throughput_vs_interactivity.svg      in+out tokens/s/GPU vs p50 tokens/s/user
//! <out>/output_throughput_vs_interactivity.svg
//! <out>/runs/<mode>@x<level>/records.jsonl   one line per request sent (wall-clock ms)
//! <out>/runs/<mode>@x<level>/virtual-records.jsonl  the same in virtual time (modelled ms;
//!                                            with --cross-check)
//! <out>/runs/<mode>@x<level>/report.json     `switchyard-loadgen compare` reads these
//! <out>/runs/<mode>@x<level>/report.md
//! <out>/runs/<mode>@x<level>/stack/          the stack's logs and generated config
//! ```

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use switchyard_loadgen::markdown::run_markdown;
use switchyard_loadgen::plot::{interactivity_vs_throughput_svg, ThroughputKind};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::report::RunReport;
use switchyard_replay::GatewayModel;

use super::cpu::CpuUsage;
use super::cross_check::cross_check_markdown;
use super::runner::{Comparison, ModeRunOutcome};
use super::table::comparison_tables;
use super::{CompareConfig, CompareError, WorkloadSpec};
use crate::paths::Profile;

fn write(path: &Path, text: &str) -> Result<(), CompareError> {
    std::fs::write(path, text).map_err(CompareError::io(format!("writing {}", path.display())))
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Writes one run's records and report into its folder.
///
/// # Errors
/// [`CompareError::Io`].
pub fn write_run(run: &ModeRunOutcome) -> Result<(), CompareError> {
    write_records(&run.dir, "records.jsonl", &run.records)?;
    write(&run.dir.join("report.json"), &json(&run.report))?;
    write(&run.dir.join("report.md"), &run_markdown(&run.report))
}

/// Writes `records` as JSON lines to `dir/name` (creating `dir`).
///
/// # Errors
/// [`CompareError::Io`].
pub fn write_records(
    dir: &Path,
    name: &str,
    records: &[RequestRecord],
) -> Result<(), CompareError> {
    std::fs::create_dir_all(dir)
        .map_err(CompareError::io(format!("creating {}", dir.display())))?;
    let mut lines = String::new();
    for r in records {
        lines.push_str(&serde_json::to_string(r).unwrap_or_default());
        lines.push('\n');
    }
    write(&dir.join(name), &lines)
}

/// The settings of a comparison, as recorded next to its results.
#[derive(Debug, Serialize)]
struct Settings<'a> {
    workload: &'a WorkloadSpec,
    seed: u64,
    max_requests: Option<usize>,
    workers: u32,
    prefill_ratio: f64,
    modes: Vec<&'static str>,
    load_levels: &'a [f64],
    time_scale: f64,
    arrival_scale: f64,
    slo_ttft_ms: Option<f64>,
    slo_itl_ms: Option<f64>,
    conditional_disagg_config: Option<&'a str>,
    profile: &'static str,
    route_timeout_ms: u64,
    max_run_s: f64,
    drain_s: f64,
    request_timeout_s: f64,
}

fn settings(config: &CompareConfig) -> Settings<'_> {
    Settings {
        workload: &config.workload,
        seed: config.seed,
        max_requests: config.max_requests,
        workers: config.workers,
        prefill_ratio: config.prefill_ratio,
        modes: config.modes.iter().map(|m| m.as_str()).collect(),
        load_levels: &config.load_levels,
        time_scale: config.time_scale,
        arrival_scale: config.arrival_scale,
        slo_ttft_ms: config.slo.ttft_ms,
        slo_itl_ms: config.slo.itl_ms,
        conditional_disagg_config: config.conditional_disagg_config.as_deref(),
        profile: match config.profile {
            Profile::Debug => "debug",
            Profile::Release => "release",
        },
        route_timeout_ms: config.route_timeout_ms,
        max_run_s: config.max_run_s,
        drain_s: config.drain_s,
        request_timeout_s: config.request_timeout_s,
    }
}

/// The comparison's markdown: setup, tables, cross-check, notes.
pub fn comparison_markdown(config: &CompareConfig, c: &Comparison) -> String {
    let mut out = String::from("# Serving modes on the local stack (simulated workers)\n\n");
    let split = c
        .runs
        .iter()
        .find(|r| r.plan.split.prefill > 0)
        .map(|r| r.plan.split);
    let _ = writeln!(
        out,
        "- workload `{}`: {} requests per run ({} malformed trace lines skipped), seed {}",
        c.workload, c.requests, c.malformed_trace_lines, config.seed
    );
    let _ = writeln!(
        out,
        "- {} workers per mode, {} GPUs each (preset {}): agg = {} agg workers{}",
        config.workers,
        c.gpus_per_worker,
        c.preset,
        config.workers,
        split.map_or_else(String::new, |s| format!(
            "; disagg and conditional = {} prefill + {} decode",
            s.prefill, s.decode
        ))
    );
    let _ = writeln!(
        out,
        "- the simulated workers ran {}x faster than the modelled hardware; every time and rate \
         below is in modelled time (measured × {})",
        config.time_scale, config.time_scale
    );
    let _ = writeln!(
        out,
        "- arrivals: planned times × {} ÷ load level (levels {:?}); router config: {}; \
         route call timeout {} ms (wall)",
        config.arrival_scale,
        config.load_levels,
        config
            .conditional_disagg_config
            .as_deref()
            .unwrap_or("default"),
        config.route_timeout_ms
    );
    let walls: Vec<String> = c
        .runs
        .iter()
        .map(|r| format!("{} {:.0} s", r.plan.label, r.wall_s))
        .collect();
    let _ = writeln!(out, "- wall time of each replay: {}\n", walls.join(", "));
    let reports: Vec<RunReport> = c.runs.iter().map(|r| r.report.clone()).collect();
    out.push_str(&comparison_tables(&reports));
    if !c.cross_check.is_empty() {
        out.push_str("\n## Cross-check: the same runs in virtual time\n\n");
        if let Some(g) = &c.gateway_model {
            out.push_str(&format!(
                "Virtual runs model the gateway in front of the engines: {} (measured on this \
                 machine; `docs/benchmarks.md`).\n\n",
                gateway_summary(g)
            ));
        }
        out.push_str(&cross_check_markdown(&c.cross_check));
        out.push_str("\nVirtual-time runs:\n\n");
        out.push_str(&comparison_tables(&c.virtual_runs));
    }
    let notes: Vec<String> = c
        .runs
        .iter()
        .flat_map(|r| {
            r.notes
                .iter()
                .map(move |n| format!("- {}: {n}", r.plan.label))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Notes\n\n{}", notes.join("\n"));
    }
    out
}

/// Writes the comparison's markdown, JSON and plots into `config.out`.
///
/// # Errors
/// [`CompareError::Io`].
pub fn write_comparison(config: &CompareConfig, c: &Comparison) -> Result<(), CompareError> {
    let out = &config.out;
    write(&out.join("comparison.md"), &comparison_markdown(config, c))?;
    let doc = serde_json::json!({
        "settings": settings(config),
        "comparison": c,
    });
    write(&out.join("comparison.json"), &json(&doc))?;
    let reports: Vec<RunReport> = c.runs.iter().map(|r| r.report.clone()).collect();
    for (kind, name) in [
        (ThroughputKind::Total, "throughput_vs_interactivity.svg"),
        (
            ThroughputKind::Output,
            "output_throughput_vs_interactivity.svg",
        ),
    ] {
        match interactivity_vs_throughput_svg(&reports, kind) {
            Ok(svg) => write(&out.join(name), &svg)?,
            Err(e) => eprintln!("no plot {name}: {e}"),
        }
    }
    Ok(())
}

/// The gateway model in one line, for the log and `comparison.md`.
pub fn gateway_summary(g: &GatewayModel) -> String {
    let threads = match g.route_threads {
        0 => "unbounded".to_string(),
        n => n.to_string(),
    };
    let timeout = g
        .route_timeout_ms
        .map_or_else(|| "none".to_string(), |t| format!("{t:.0} ms"));
    format!(
        "body rendering {:.5} modelled ms per prompt token, route tokenization {:.4} ms per \
         token on {threads} control-plane \
         threads (FIFO), route timeout {timeout} (fail-open), worker tokenization {:.4} ms per \
         token, decode-leg tokenization {:.4} ms per token, all processor-shared over {:.0} cores",
        g.body_ms_per_prompt_token,
        g.route_ms_per_prompt_token,
        g.worker_ms_per_prompt_token,
        g.decode_leg_ms_per_prompt_token,
        g.cpus
    )
}

/// A run's CPU use in one line: ms per process and other work, as average cores.
pub fn cpu_summary(cpu: &CpuUsage) -> String {
    let cores = |ms: Option<f64>| {
        ms.map_or_else(
            || "–".to_string(),
            |ms| format!("{:.0} ms ({:.2} cores)", ms, ms / cpu.wall_ms.max(1.0)),
        )
    };
    let mut parts: Vec<String> = cpu
        .processes
        .iter()
        .map(|(name, ms)| format!("{name} {}", cores(*ms)))
        .collect();
    parts.push(format!("other work {}", cores(cpu.other_ms)));
    parts.join(", ")
}
