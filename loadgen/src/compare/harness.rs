//! Every planned run through one backend, in plan order, each written out as it finishes
//! (an interrupted comparison keeps the runs it finished).

use std::path::Path;

use super::backend::Backend;
use super::output::{clear_earlier_comparison, write_run, OutputError};
use super::plan::{ComparisonPlan, PlanError};
use super::result::Comparison;

/// Why a comparison stopped.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError<E: std::error::Error + 'static> {
    /// The plan cannot run.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A run failed.
    #[error("run {label}: {source}")]
    Backend {
        /// The run.
        label: String,
        /// What failed.
        source: E,
    },
    /// A run's files could not be written.
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// Runs every run of `plan` with `backend`, writing each into `out/runs/<label>/` (when
/// `out` is given) as soon as it finishes, after clearing what an earlier comparison left in
/// `out` ([`clear_earlier_comparison`]).
///
/// # Errors
/// [`HarnessError`]: the plan is invalid, a run failed, or its files could not be written.
pub async fn run_comparison<B: Backend>(
    plan: &ComparisonPlan,
    backend: &mut B,
    out: Option<&Path>,
) -> Result<Comparison<B::Detail>, HarnessError<B::Error>> {
    let planned_runs = plan.runs()?;
    if let Some(out) = out {
        clear_earlier_comparison(out, &[])?;
    }
    let mut runs = Vec::new();
    for planned in planned_runs {
        let result = backend
            .run(&planned)
            .await
            .map_err(|source| HarnessError::Backend {
                label: planned.label.clone(),
                source,
            })?;
        if let Some(out) = out {
            write_run(out, &result)?;
        }
        runs.push(result);
    }
    Ok(Comparison { runs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::plan::{PlannedRun, PrefillWorkers};
    use crate::compare::result::RunResult;
    use crate::report::RunReport;
    use crate::{ArrivalScale, LoadLevel};
    use switchyard_protocol::route::ServingMode;

    /// Finishes its first run and fails the next, as an interrupted or broken comparison.
    struct FailsSecond(usize);

    #[derive(Debug, thiserror::Error)]
    #[error("the second run failed")]
    struct Failed;

    impl Backend for FailsSecond {
        type Detail = ();
        type Error = Failed;
        async fn run(&mut self, run: &PlannedRun) -> Result<RunResult<()>, Failed> {
            self.0 += 1;
            if self.0 > 1 {
                return Err(Failed);
            }
            Ok(RunResult {
                run: run.clone(),
                report: RunReport::default(),
                records: Vec::new(),
                wall_s: 0.0,
                notes: Vec::new(),
                detail: (),
            })
        }
    }

    #[test]
    fn a_comparison_that_stops_midway_leaves_no_earlier_page_beside_its_runs() {
        let out = std::env::temp_dir().join(format!("harness-reuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        // An earlier, finished comparison in the same folder.
        std::fs::create_dir_all(out.join("runs/disagg@x2")).unwrap();
        for file in [
            "comparison.md",
            "comparison.json",
            "throughput_vs_interactivity.svg",
        ] {
            std::fs::write(out.join(file), "earlier").unwrap();
        }
        let plan = ComparisonPlan {
            modes: vec![ServingMode::Agg, ServingMode::Conditional],
            load_levels: vec![LoadLevel::PLANNED],
            arrival_scale: ArrivalScale::PLANNED,
            workers: 2,
            prefill: PrefillWorkers::Share(0.5),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let stopped = runtime.block_on(run_comparison(&plan, &mut FailsSecond(0), Some(&out)));
        assert!(matches!(stopped, Err(HarnessError::Backend { .. })));
        let runs: Vec<String> = std::fs::read_dir(out.join("runs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(runs, ["agg@x1"], "only the run that finished");
        for file in [
            "comparison.md",
            "comparison.json",
            "throughput_vs_interactivity.svg",
        ] {
            assert!(!out.join(file).exists(), "the earlier {file} is left");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}
