//! Every planned run through one backend, in plan order, each written out as it finishes
//! (an interrupted comparison keeps the runs it finished).

use std::path::Path;

use super::backend::Backend;
use super::output::{write_run, OutputError};
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
/// `out` is given) as soon as it finishes.
///
/// # Errors
/// [`HarnessError`]: the plan is invalid, a run failed, or its files could not be written.
pub async fn run_comparison<B: Backend>(
    plan: &ComparisonPlan,
    backend: &mut B,
    out: Option<&Path>,
) -> Result<Comparison<B::Detail>, HarnessError<B::Error>> {
    let mut runs = Vec::new();
    for planned in plan.runs()? {
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
