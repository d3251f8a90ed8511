//! Which runs a comparison makes, and with what workers and scales (pure).
//!
//! Three clocks meet here, and mixing them up is the easiest way to publish wrong numbers:
//! - the workload's planned arrival times (trace timestamps), in modelled time;
//! - the modelled hardware's time, in which every reported number is given;
//! - wall time: the simulated workers run `time_scale` times faster than the modelled
//!   hardware, so the client must send `time_scale` times faster too.
//!
//! A run at load level `L` multiplies the planned arrival times by
//! `arrival_multiplier = arrival_scale / L` (modelled time), and the client by
//! `arrival_multiplier / time_scale` (wall time).

use serde::Serialize;

use super::{CompareConfig, CompareError};
use crate::stack::ServingMode;

/// Worker roles of one mode's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorkerSplit {
    /// Aggregated workers (agg mode only).
    pub agg: usize,
    /// Prefill workers (disagg and conditional).
    pub prefill: usize,
    /// Decode workers (disagg and conditional).
    pub decode: usize,
}

impl WorkerSplit {
    /// All workers, every role.
    pub fn total(&self) -> usize {
        self.agg + self.prefill + self.decode
    }
}

/// The workers of `mode` out of `workers` in all: agg gets them all as agg workers; disagg
/// and conditional get `round(workers × prefill_ratio)` prefill workers, clamped so that
/// both pools have at least one.
///
/// # Errors
/// [`CompareError::InvalidSetting`] without workers, with fewer than two for a split mode,
/// or with a ratio outside (0, 1).
pub fn worker_split(
    mode: ServingMode,
    workers: u32,
    prefill_ratio: f64,
) -> Result<WorkerSplit, CompareError> {
    let bad = |m: String| Err(CompareError::InvalidSetting(m));
    if workers == 0 {
        return bad("--workers must be at least 1".into());
    }
    let n = workers as usize;
    if mode == ServingMode::Agg {
        return Ok(WorkerSplit {
            agg: n,
            prefill: 0,
            decode: 0,
        });
    }
    if !(prefill_ratio > 0.0 && prefill_ratio < 1.0) {
        return bad(format!(
            "--prefill-ratio must be strictly between 0 and 1, got {prefill_ratio}"
        ));
    }
    if n < 2 {
        return bad(format!(
            "{} mode needs at least 2 workers (one prefill, one decode)",
            mode.as_str()
        ));
    }
    let prefill = ((n as f64 * prefill_ratio).round() as usize).clamp(1, n - 1);
    Ok(WorkerSplit {
        agg: 0,
        prefill,
        decode: n - prefill,
    })
}

/// One run of the comparison: a mode at a load level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunPlan {
    /// `<mode>@x<level>`, also the run's folder name.
    pub label: String,
    /// The serving mode (wire name).
    pub mode: &'static str,
    /// Arrival-rate multiplier of this run.
    pub load_level: f64,
    /// Multiplies planned arrival and think times, modelled time (`arrival_scale / level`).
    pub arrival_multiplier: f64,
    /// Multiplies planned arrival and think times, wall time: the client's `time_scale`.
    pub client_time_scale: f64,
    /// The workers' speed-up (their `--time-scale`).
    pub worker_time_scale: f64,
    /// The stack's workers.
    pub split: WorkerSplit,
    #[serde(skip)]
    serving_mode: ServingMode,
}

impl RunPlan {
    /// The stack's serving mode.
    pub fn serving_mode(&self) -> ServingMode {
        self.serving_mode
    }
}

fn positive(name: &str, x: f64) -> Result<(), CompareError> {
    if x > 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(CompareError::InvalidSetting(format!(
            "{name} must be a positive number, got {x}"
        )))
    }
}

/// Every run of `config`, load levels outer and modes inner (so an interrupted comparison
/// has all modes of the first level).
///
/// # Errors
/// [`CompareError::InvalidSetting`] for no modes or levels, a repeated mode, scales that
/// are not positive, bad worker counts or caps.
pub fn plan_runs(config: &CompareConfig) -> Result<Vec<RunPlan>, CompareError> {
    if config.modes.is_empty() {
        return Err(CompareError::InvalidSetting("no modes to run".into()));
    }
    if config.load_levels.is_empty() {
        return Err(CompareError::InvalidSetting("no load levels".into()));
    }
    for (i, m) in config.modes.iter().enumerate() {
        if config.modes[..i].contains(m) {
            return Err(CompareError::InvalidSetting(format!(
                "mode {} given twice",
                m.as_str()
            )));
        }
    }
    positive("--time-scale", config.time_scale)?;
    positive("--arrival-scale", config.arrival_scale)?;
    positive("--max-run-s", config.max_run_s)?;
    positive("--request-timeout-s", config.request_timeout_s)?;
    if !(config.drain_s >= 0.0 && config.drain_s.is_finite()) {
        return Err(CompareError::InvalidSetting(format!(
            "--drain-s must be >= 0, got {}",
            config.drain_s
        )));
    }
    if config.max_requests == Some(0) {
        return Err(CompareError::InvalidSetting(
            "--max-requests must be at least 1".into(),
        ));
    }
    for (i, &level) in config.load_levels.iter().enumerate() {
        positive("every --load-levels value", level)?;
        if config.load_levels[..i].contains(&level) {
            // Two runs would share one label and one run folder.
            return Err(CompareError::InvalidSetting(format!(
                "load level {level} given twice"
            )));
        }
    }
    let mut runs = Vec::new();
    for &level in &config.load_levels {
        for &mode in &config.modes {
            let split = worker_split(mode, config.workers, config.prefill_ratio)?;
            let arrival_multiplier = config.arrival_scale / level;
            runs.push(RunPlan {
                label: format!("{}@x{level}", mode.as_str()),
                mode: mode.as_str(),
                load_level: level,
                arrival_multiplier,
                client_time_scale: arrival_multiplier / config.time_scale,
                worker_time_scale: config.time_scale,
                split,
                serving_mode: mode,
            });
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::compare::WorkloadSpec;

    fn config() -> CompareConfig {
        CompareConfig::new(
            WorkloadSpec::Trace {
                path: PathBuf::from("t.jsonl"),
                block_tokens: 512,
            },
            PathBuf::from("out"),
        )
    }

    #[test]
    fn every_mode_gets_the_same_number_of_workers() {
        for workers in 2..=9 {
            let agg = worker_split(ServingMode::Agg, workers, 0.25).unwrap();
            let disagg = worker_split(ServingMode::Disagg, workers, 0.25).unwrap();
            let cond = worker_split(ServingMode::Conditional, workers, 0.25).unwrap();
            assert_eq!(agg.total(), workers as usize);
            assert_eq!(disagg, cond);
            assert_eq!(disagg.total(), workers as usize);
            assert!(disagg.prefill >= 1 && disagg.decode >= 1, "{disagg:?}");
        }
        let split = worker_split(ServingMode::Disagg, 8, 0.25).unwrap();
        assert_eq!((split.prefill, split.decode), (2, 6));
        // A ratio that rounds to every worker still leaves one decode worker.
        let split = worker_split(ServingMode::Conditional, 4, 0.9).unwrap();
        assert_eq!((split.prefill, split.decode), (3, 1));
    }

    #[test]
    fn splits_that_cannot_work_are_refused() {
        assert!(worker_split(ServingMode::Agg, 0, 0.25).is_err());
        assert!(worker_split(ServingMode::Disagg, 1, 0.25).is_err());
        assert!(worker_split(ServingMode::Conditional, 4, 0.0).is_err());
        assert!(worker_split(ServingMode::Conditional, 4, 1.0).is_err());
        assert!(worker_split(ServingMode::Agg, 1, 0.0).is_ok());
    }

    #[test]
    fn levels_scale_arrivals_in_modelled_and_wall_time() {
        let mut c = config();
        c.time_scale = 4.0;
        c.arrival_scale = 0.5;
        c.load_levels = vec![1.0, 2.0];
        let runs = plan_runs(&c).unwrap();
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "agg@x1",
                "disagg@x1",
                "conditional@x1",
                "agg@x2",
                "disagg@x2",
                "conditional@x2"
            ]
        );
        // Level 2 doubles the rate: arrival times half of level 1's.
        assert_eq!(runs[0].arrival_multiplier, 0.5);
        assert_eq!(runs[3].arrival_multiplier, 0.25);
        // Workers 4x faster: the client sends 4x faster still.
        assert_eq!(runs[3].client_time_scale, 0.0625);
        assert_eq!(runs[3].serving_mode(), ServingMode::Agg);
    }

    #[test]
    fn bad_settings_are_named() {
        type Breaks = fn(&mut CompareConfig);
        let cases: Vec<(Breaks, &str)> = vec![
            (|c| c.modes.clear(), "no modes"),
            (|c| c.load_levels = vec![1.0, 0.0], "--load-levels"),
            (|c| c.time_scale = -1.0, "--time-scale"),
            (|c| c.arrival_scale = f64::NAN, "--arrival-scale"),
            (|c| c.max_requests = Some(0), "--max-requests"),
            (
                |c| c.modes = vec![ServingMode::Agg, ServingMode::Agg],
                "twice",
            ),
            (|c| c.workers = 1, "at least 2 workers"),
            (|c| c.load_levels = vec![0.5, 1.0, 1.0], "given twice"),
        ];
        for (break_it, needle) in cases {
            let mut c = config();
            break_it(&mut c);
            let message = plan_runs(&c).unwrap_err().to_string();
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }
}
