//! The whole comparison on the real stack: every planned run through the harness with the
//! real backend (each run's files written as it finishes), the cross-check in virtual time
//! when asked, then the page, JSON and plots.

use switchyard_engine::PerfPreset;
use switchyard_loadgen::compare::{run_comparison as run_harness, HarnessError};

use super::cross_check::{cross_check_rows, side, virtual_runs, Side};
use super::gateway_cost::{
    control_plane_route_threads, gateway_model, gateway_summary, machine_cpus, measure,
};
use super::output::write_comparison;
use super::real_backend::RealBackend;
use super::result::StackComparison;
use super::workload::prepare;
use super::{CompareConfig, CompareError};
use crate::paths::Artifacts;

/// The workers' performance preset: `SWITCHYARD_PERF_PRESET` as the simulated workers read
/// it, else their default.
///
/// # Errors
/// [`CompareError::InvalidSetting`] if the variable names no preset.
pub fn worker_preset() -> Result<PerfPreset, CompareError> {
    match std::env::var("SWITCHYARD_PERF_PRESET") {
        Ok(name) if !name.is_empty() => name
            .parse()
            .map_err(|e| CompareError::InvalidSetting(format!("SWITCHYARD_PERF_PRESET: {e}"))),
        _ => Ok(PerfPreset::Gb200Fp8Tep4),
    }
}

/// Runs every planned run in order, writes each run's files as it finishes, then the
/// comparison (tables, JSON, plots) into `config.out`.
///
/// # Errors
/// [`CompareError`] for bad settings, a missing artifact, a workload or tokenizer problem, a
/// stack that does not start, or results that cannot be written. Failed requests are not
/// errors: they are counted in the reports.
pub async fn run_comparison(config: &CompareConfig) -> Result<StackComparison, CompareError> {
    let plans = config.validate()?;
    let preset = worker_preset()?;
    let artifacts = Artifacts::locate(config.profile).map_err(|source| CompareError::Stack {
        label: "setup".into(),
        source: Box::new(source),
    })?;
    let prepared = prepare(
        &config.workload,
        config.seed,
        config.max_requests,
        &artifacts.model_dir,
    )?;
    std::fs::create_dir_all(&config.out).map_err(CompareError::io(format!(
        "creating {}",
        config.out.display()
    )))?;
    crate::cleanup::say_on_signal(format!(
        "interrupted: {} holds only the runs that finished (runs/), and no comparison",
        config.out.display()
    ));
    switchyard_support::errln!(
        "{}: {} requests per run; {} runs of {} workers ({} GPUs each, preset {}), workers {}x \
         faster than modelled; results in {}",
        prepared.workload.name,
        prepared.workload.requests.len(),
        plans.len(),
        config.workers,
        preset.gpus_per_worker(),
        preset.name(),
        config.speed_up,
        config.out.display()
    );
    let mut backend = RealBackend {
        config,
        artifacts: &artifacts,
        prepared: &prepared,
        preset,
    };
    let runs = run_harness(&config.plan(), &mut backend, Some(&config.out))
        .await
        .map_err(|e| match e {
            // The backend's errors name their run already.
            HarnessError::Backend { source, .. } => source,
            HarnessError::Plan(e) => CompareError::Plan(e),
            HarnessError::Output(e) => CompareError::Output(e),
        })?
        .runs;
    let (virtual_reports, cross_check, gateway_model) = if config.cross_check {
        let measured = measure(&prepared, &artifacts.model_dir)?;
        let gateway = gateway_model(
            measured,
            config.speed_up,
            machine_cpus(),
            control_plane_route_threads(),
            config.route_timeout_ms,
        );
        switchyard_support::errln!(
            "cross-check: measured {:.3} µs per prompt token to render a body, {:.2} µs per \
             tokenization (wall); virtual replays: {}",
            measured.body_ms_per_token * 1e3,
            measured.tokenize_ms_per_token * 1e3,
            gateway_summary(&gateway)
        );
        // Every run's virtual gateway gets the machine's cores. Taking off the average CPU
        // other work used during the run (`cpu::CpuUsage::other_cores`) was tried and is not
        // supported by the data: a run with 1.56 cores of other work had an agg TTFT p50 as
        // usual (563 ms) while the reduced virtual gateway failed 45 requests open
        // (docs/benchmarks.md); bursty tokenization threads get their share back from the
        // scheduler. The CPU figures are reported per run instead.
        let virtual_runs = virtual_runs(config, &prepared, preset, &runs, gateway).await?;
        let real: Vec<Side<'_>> = runs.iter().map(side).collect();
        let virt: Vec<Side<'_>> = virtual_runs.iter().map(side).collect();
        let rows = cross_check_rows(&real, &virt);
        let reports = virtual_runs.into_iter().map(|r| r.report).collect();
        (reports, rows, Some(gateway))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let comparison = StackComparison {
        runs,
        virtual_runs: virtual_reports,
        cross_check,
        gateway_model,
        workload: prepared.workload.name.clone(),
        requests: prepared.workload.requests.len(),
        malformed_trace_lines: prepared.malformed_trace_lines,
        preset: preset.name().to_string(),
        gpus_per_worker: preset.gpus_per_worker(),
    };
    write_comparison(config, &comparison)?;
    crate::cleanup::say_on_signal(format!(
        "interrupted: the comparison in {} was written",
        config.out.display()
    ));
    Ok(comparison)
}
