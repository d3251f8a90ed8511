//! The real stack's comparison page and JSON document; the harness's output module
//! ([`switchyard_loadgen::compare::output`]) writes them with the plots and the runs' files.
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

use serde::Serialize;
use switchyard_engine::SpeedUp;
use switchyard_loadgen::compare::output::write_comparison as write_files;
use switchyard_loadgen::compare::table::comparison_tables;
use switchyard_loadgen::{ArrivalScale, LoadLevel};

use super::cross_check::cross_check_markdown;
use super::gateway_cost::gateway_summary;
use super::result::StackComparison;
use super::{CompareConfig, CompareError, WorkloadSpec};
use crate::paths::Profile;

/// The settings of a comparison, as recorded next to its results.
#[derive(Debug, Serialize)]
struct Settings<'a> {
    workload: &'a WorkloadSpec,
    seed: u64,
    max_requests: Option<usize>,
    workers: u32,
    prefill_ratio: f64,
    modes: Vec<&'static str>,
    load_levels: &'a [LoadLevel],
    speed_up: SpeedUp,
    arrival_scale: ArrivalScale,
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
        speed_up: config.speed_up,
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
pub fn comparison_markdown(config: &CompareConfig, c: &StackComparison) -> String {
    let mut out = String::from("# Serving modes on the local stack (simulated workers)\n\n");
    let split = c
        .runs
        .iter()
        .find(|r| r.run.split.prefill > 0)
        .map(|r| r.run.split);
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
        config.speed_up, config.speed_up
    );
    let _ = writeln!(
        out,
        "- arrivals: planned times × {} ÷ load level (offered-load levels {}); router config: \
         {}; route call timeout {} ms (wall)",
        config.arrival_scale,
        config
            .load_levels
            .iter()
            .map(|l| format!("{l}×"))
            .collect::<Vec<_>>()
            .join(", "),
        config
            .conditional_disagg_config
            .as_deref()
            .unwrap_or("default"),
        config.route_timeout_ms
    );
    let walls: Vec<String> = c
        .runs
        .iter()
        .map(|r| format!("{} {:.0} s", r.run.label, r.wall_s))
        .collect();
    let _ = writeln!(out, "- wall time of each replay: {}\n", walls.join(", "));
    out.push_str(&comparison_tables(&c.reports()));
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
                .map(move |n| format!("- {}: {n}", r.run.label))
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
/// [`CompareError::Output`].
pub fn write_comparison(config: &CompareConfig, c: &StackComparison) -> Result<(), CompareError> {
    let doc = serde_json::json!({
        "settings": settings(config),
        "comparison": c,
    });
    write_files(
        &config.out,
        &comparison_markdown(config, c),
        &doc,
        &c.reports(),
    )?;
    Ok(())
}
