//! Running the comparison: for every planned run, a fresh stack (cold workers, empty KV
//! caches, a new control plane), the workload replayed through Envoy, the stack stopped.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use switchyard_engine::PerfPreset;
use switchyard_loadgen::client::{replay, ClientConfig};
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::report::{build_report, RunMeta, RunReport};
use switchyard_replay::GatewayModel;
use tokio::time::Instant;

use super::cpu::{self, CpuSnapshot, CpuUsage};
use super::cross_check::{cross_check_rows, virtual_reports, CrossCheckRow};
use super::gateway_cost::{control_plane_route_threads, gateway_model, machine_cpus, measure};
use super::plan::{plan_runs, RunPlan};
use super::table::fail_open_note;
use super::workload::{prepare, PreparedWorkload};
use super::{output, CompareConfig, CompareError};
use crate::paths::Artifacts;
use crate::stack::{Component, StackBuilder};

/// Average cores of other work above which a run gets a note.
const OTHER_WORK_NOTE_CORES: f64 = 0.25;

/// One run's results.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRunOutcome {
    /// What was run.
    pub plan: RunPlan,
    /// The load generator's report, in modelled time.
    pub report: RunReport,
    /// One record per request sent (measured wall times, not converted).
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    /// Wall seconds of the replay (start of sending to the last response).
    pub wall_s: f64,
    /// Problems seen around the run (a process of the stack that exited, ...).
    pub notes: Vec<String>,
    /// CPU time of each stack process, the client and other work during the replay.
    pub cpu: CpuUsage,
    /// Where its records, report and stack logs are.
    pub dir: PathBuf,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Every run, in plan order.
    pub runs: Vec<ModeRunOutcome>,
    /// The virtual-time reports of the same runs (with `--cross-check`).
    pub virtual_runs: Vec<RunReport>,
    /// Real/virtual ratios per run (with `--cross-check`).
    pub cross_check: Vec<CrossCheckRow>,
    /// The gateway cost the virtual runs modelled, measured on this machine (with
    /// `--cross-check`).
    pub gateway_model: Option<GatewayModel>,
    /// Workload name and size.
    pub workload: String,
    /// Requests per run.
    pub requests: usize,
    /// Malformed trace lines skipped.
    pub malformed_trace_lines: usize,
    /// The workers' performance preset.
    pub preset: String,
    /// GPUs per worker under that preset.
    pub gpus_per_worker: u32,
}

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
pub async fn run_comparison(config: &CompareConfig) -> Result<Comparison, CompareError> {
    let plans = plan_runs(config)?;
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
    eprintln!(
        "{}: {} requests per run; {} runs of {} workers ({} GPUs each, preset {}), workers {}x \
         faster than modelled; results in {}",
        prepared.workload.name,
        prepared.workload.requests.len(),
        plans.len(),
        config.workers,
        preset.gpus_per_worker(),
        preset.name(),
        config.time_scale,
        config.out.display()
    );
    let mut runs = Vec::new();
    for plan in plans {
        let outcome = run_one(config, &artifacts, &prepared, preset, plan).await?;
        output::write_run(&outcome)?;
        runs.push(outcome);
    }
    let (virtual_runs, cross_check, gateway_model) = if config.cross_check {
        let measured = measure(&prepared, &artifacts.model_dir)?;
        let gateway = gateway_model(
            measured,
            config.time_scale,
            machine_cpus(),
            control_plane_route_threads(),
            config.route_timeout_ms,
        );
        eprintln!(
            "cross-check: measured {:.3} µs per prompt token to render a body, {:.2} µs per \
             tokenization (wall); virtual replays: {}",
            measured.body_ms_per_token * 1e3,
            measured.tokenize_ms_per_token * 1e3,
            output::gateway_summary(&gateway)
        );
        // Every run's virtual gateway gets the machine's cores. Taking off the average CPU
        // other work used during the run (`cpu::CpuUsage::other_cores`) was tried and is not
        // supported by the data: a run with 1.56 cores of other work had an agg TTFT p50 as
        // usual (563 ms) while the reduced virtual gateway failed 45 requests open
        // (docs/benchmarks.md); bursty tokenization threads get their share back from the
        // scheduler. The CPU figures are reported per run instead.
        let virtual_runs = virtual_reports(config, &prepared, preset, &runs, gateway)?;
        let real: Vec<(&RunReport, &[RequestRecord])> = runs
            .iter()
            .map(|r| (&r.report, r.records.as_slice()))
            .collect();
        let virt: Vec<(&RunReport, &[RequestRecord])> = virtual_runs
            .iter()
            .map(|(report, records)| (report, records.as_slice()))
            .collect();
        let rows = cross_check_rows(&real, &virt);
        let reports = virtual_runs.into_iter().map(|(report, _)| report).collect();
        (reports, rows, Some(gateway))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let comparison = Comparison {
        runs,
        virtual_runs,
        cross_check,
        gateway_model,
        workload: prepared.workload.name.clone(),
        requests: prepared.workload.requests.len(),
        malformed_trace_lines: prepared.malformed_trace_lines,
        preset: preset.name().to_string(),
        gpus_per_worker: preset.gpus_per_worker(),
    };
    output::write_comparison(config, &comparison)?;
    Ok(comparison)
}

/// One run: start a stack for the plan's mode, replay, stop the stack, report.
async fn run_one(
    config: &CompareConfig,
    artifacts: &Artifacts,
    prepared: &PreparedWorkload,
    preset: PerfPreset,
    plan: RunPlan,
) -> Result<ModeRunOutcome, CompareError> {
    let dir = config.out.join("runs").join(&plan.label);
    let split = plan.split;
    eprintln!(
        "{}: starting a stack ({} agg, {} prefill, {} decode workers)",
        plan.label, split.agg, split.prefill, split.decode
    );
    let mut builder = StackBuilder::new()
        .agg_workers(split.agg)
        .prefill_workers(split.prefill)
        .decode_workers(split.decode)
        .serving_mode(plan.serving_mode())
        .time_scale(plan.worker_time_scale)
        .profile(config.profile)
        .route_timeout_ms(config.route_timeout_ms)
        .artifacts(artifacts.clone())
        .run_dir(dir.join("stack"));
    if let Some(json) = &config.conditional_disagg_config {
        builder = builder.conditional_disagg_config(json.clone());
    }
    let mut stack = builder
        .start()
        .await
        .map_err(|source| CompareError::Stack {
            label: plan.label.clone(),
            source: Box::new(source),
        })?;
    let client = ClientConfig {
        endpoint: stack.gateway_url(),
        time_scale: plan.client_time_scale,
        max_concurrency: None,
        max_duration: Some(Duration::from_secs_f64(config.max_run_s)),
        drain: Duration::from_secs_f64(config.drain_s),
        request_timeout: Some(Duration::from_secs_f64(config.request_timeout_s)),
        api_key: None,
        run_tag: plan
            .label
            .replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
        framing: prepared.framing.clone(),
        progress: config.progress,
    };
    eprintln!(
        "{}: replaying {} requests through {}",
        plan.label,
        prepared.workload.requests.len(),
        stack.gateway_url()
    );
    let snapshot = || CpuSnapshot {
        machine_busy_ms: cpu::machine_busy_ms(),
        processes_ms: [
            Component::Nats,
            Component::ControlPlane,
            Component::Workers,
            Component::PrefillWorkers,
            Component::Envoy,
        ]
        .map(|c| (c.name(), stack.pid(c).and_then(cpu::process_ms)))
        .into_iter()
        .chain([(cpu::CLIENT, cpu::own_ms())])
        .collect(),
    };
    let cpu_before = snapshot();
    let started = Instant::now();
    let replayed = replay(prepared.workload.clone(), prepared.builder.clone(), client).await;
    let wall_s = started.elapsed().as_secs_f64();
    let cpu = CpuUsage::between(&cpu_before, &snapshot(), wall_s * 1e3);
    let mut notes = Vec::new();
    if let Err(e) = stack.check_running() {
        notes.push(format!("a stack process exited during the run: {e}"));
    }
    let gateway = stack.gateway_url();
    // Stopping waits for each process (blocking); keep it off the runtime's workers.
    let _ = tokio::task::spawn_blocking(move || stack.shutdown()).await;
    let outcome = replayed.map_err(|e| CompareError::Client {
        label: plan.label.clone(),
        message: e.to_string(),
    })?;
    let workers = u32::try_from(split.total()).unwrap_or(u32::MAX);
    let meta = RunMeta {
        label: plan.label.clone(),
        mode: Some(plan.mode.to_string()),
        workload: prepared.workload.name.clone(),
        endpoint: gateway,
        gpus: workers * preset.gpus_per_worker(),
        time_scale: plan.arrival_multiplier,
        seed: config.seed,
        planned_requests: prepared.workload.requests.len(),
        malformed_trace_lines: prepared.malformed_trace_lines,
        offered_rps: prepared.workload.offered_rps(plan.arrival_multiplier),
        sim_speedup: plan.worker_time_scale,
    };
    let report = build_report(meta, &outcome.records, outcome.not_sent, config.slo);
    notes.extend(fail_open_note(&report));
    if let Some(cores) = cpu.other_cores().filter(|&c| c > OTHER_WORK_NOTE_CORES) {
        notes.push(format!(
            "other work on the machine used {cores:.2} cores on average during this run \
             (the stack shared the machine; its timings are noisier)"
        ));
    }
    eprintln!(
        "{}: {} sent, {} ok, {} failed, {} not sent in {:.1} s wall",
        plan.label,
        report.requests.sent,
        report.requests.ok,
        report.requests.failed,
        report.requests.not_sent,
        wall_s
    );
    for note in &notes {
        eprintln!("{}: {note}", plan.label);
    }
    eprintln!(
        "{}: CPU during the replay: {}",
        plan.label,
        output::cpu_summary(&cpu)
    );
    Ok(ModeRunOutcome {
        plan,
        report,
        records: outcome.records,
        wall_s,
        notes,
        cpu,
        dir,
    })
}
