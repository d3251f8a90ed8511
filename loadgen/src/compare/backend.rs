//! What runs one planned run: a fresh deployment (cold workers, empty caches) in the plan's
//! mode and split, the workload replayed at the plan's arrival scale, reported in modelled
//! time.

use super::plan::PlannedRun;
use super::result::{RunDetail, RunResult};

/// One way of running a comparison's runs: the real local stack or virtual time.
// `async fn` without a `Send` bound on its future: the front ends drive the harness on one
// thread (`block_on`), and the real stack's run holds non-`Send` process handles.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// What the backend keeps of a run beyond the common result (route notes and counters in
    /// virtual time, CPU use on the real stack).
    type Detail: RunDetail;
    /// Why a run could not start or finish. Failed *requests* are not errors: they are
    /// counted in the report.
    type Error: std::error::Error + 'static;

    /// Runs `run` from a fresh deployment and reports it.
    async fn run(&mut self, run: &PlannedRun) -> Result<RunResult<Self::Detail>, Self::Error>;
}
