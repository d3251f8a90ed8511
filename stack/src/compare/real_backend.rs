//! The real stack's backend of the comparison harness: for every planned run, a fresh stack
//! (cold workers, empty KV caches, a new control plane), the workload replayed through Envoy
//! with the load generator's client, the stack stopped.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use switchyard_engine::PerfPreset;
use switchyard_loadgen::client::{replay, ClientConfig};
use switchyard_loadgen::compare::output::run_dir;
use switchyard_loadgen::compare::table::fail_open_note;
use switchyard_loadgen::compare::{Backend, PlannedRun, RunDetail, RunResult};
use switchyard_loadgen::report::{build_report, RunMeta};
use tokio::time::Instant;

use super::cpu::{self, cpu_summary, CpuSnapshot, CpuUsage};
use super::workload::PreparedWorkload;
use super::{CompareConfig, CompareError};
use crate::paths::Artifacts;
use crate::stack::{Component, StackBuilder};

/// Average cores of other work above which a run gets a note.
const OTHER_WORK_NOTE_CORES: f64 = 0.25;

/// Starts a stack per run from `artifacts`, as `config` sets it, and replays `prepared`.
#[derive(Debug)]
pub struct RealBackend<'a> {
    /// The comparison's settings.
    pub config: &'a CompareConfig,
    /// The binaries and model the stacks run.
    pub artifacts: &'a Artifacts,
    /// The workload and request bodies.
    pub prepared: &'a PreparedWorkload,
    /// The workers' performance preset (for the GPU count).
    pub preset: PerfPreset,
}

/// What a real run has beyond the common result.
#[derive(Debug, Clone, Serialize)]
pub struct RealDetail {
    /// CPU time of each stack process, the client and other work during the replay.
    pub cpu: CpuUsage,
    /// Where its records, report and stack logs are.
    pub dir: PathBuf,
}

/// The stack writes its own logs into `dir/stack`; nothing else to add.
impl RunDetail for RealDetail {}

impl Backend for RealBackend<'_> {
    type Detail = RealDetail;
    type Error = CompareError;

    /// One run: start a stack for the plan's mode, replay, stop the stack, report.
    async fn run(&mut self, plan: &PlannedRun) -> Result<RunResult<RealDetail>, CompareError> {
        let (config, prepared) = (self.config, self.prepared);
        let dir = run_dir(&config.out, &plan.label);
        let split = plan.split;
        switchyard_support::errln!(
            "{}: starting a stack ({} agg, {} prefill, {} decode workers)",
            plan.label,
            split.agg,
            split.prefill,
            split.decode
        );
        let (router_json, _) = config.router()?;
        let builder = StackBuilder::new()
            .agg_workers(split.agg)
            .prefill_workers(split.prefill)
            .decode_workers(split.decode)
            .serving_mode(plan.mode)
            .speed_up(config.speed_up)
            .profile(config.profile)
            .route_timeout_ms(config.route_timeout_ms)
            .artifacts(self.artifacts.clone())
            .run_dir(dir.join("stack"))
            .conditional_disagg_config(router_json.to_string());
        let mut stack = builder
            .start()
            .await
            .map_err(|source| CompareError::Stack {
                label: plan.label.clone(),
                source: Box::new(source),
            })?;
        let client = ClientConfig {
            endpoint: stack.gateway_url(),
            // The workers run `speed_up` times faster than modelled: so must the arrivals.
            arrival_scale: plan.arrival_scale.on_wall_clock(config.speed_up),
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
        switchyard_support::errln!(
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
            mode: Some(plan.mode.as_str().to_string()),
            workload: prepared.workload.name.clone(),
            endpoint: gateway,
            gpus: workers * self.preset.gpus_per_worker(),
            arrival_scale: plan.arrival_scale,
            load_level: Some(plan.load_level),
            seed: config.seed,
            planned_requests: prepared.workload.requests.len(),
            malformed_trace_lines: prepared.malformed_trace_lines,
            offered_rps: prepared.workload.offered_rps(plan.arrival_scale),
            speed_up: config.speed_up,
            interrupted: None,
        };
        let report = build_report(meta, &outcome.records, outcome.not_sent, config.slo);
        notes.extend(fail_open_note(&report));
        if let Some(cores) = cpu.other_cores().filter(|&c| c > OTHER_WORK_NOTE_CORES) {
            notes.push(format!(
                "other work on the machine used {cores:.2} cores on average during this run \
                 (the stack shared the machine; its timings are noisier)"
            ));
        }
        switchyard_support::errln!(
            "{}: {} sent, {} ok, {} failed, {} not sent in {:.1} s wall",
            plan.label,
            report.requests.sent,
            report.requests.ok,
            report.requests.failed,
            report.requests.not_sent,
            wall_s
        );
        for note in &notes {
            switchyard_support::errln!("{}: {note}", plan.label);
        }
        switchyard_support::errln!(
            "{}: CPU during the replay: {}",
            plan.label,
            cpu_summary(&cpu)
        );
        Ok(RunResult {
            run: plan.clone(),
            report,
            records: outcome.records,
            wall_s,
            notes,
            detail: RealDetail { cpu, dir },
        })
    }
}
