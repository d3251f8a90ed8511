//! The files a comparison writes, whichever backend ran it.
//!
//! ```text
//! <out>/comparison.md                        the front end's page (setup, tables, notes)
//! <out>/comparison.json                      the front end's settings and every report
//! <out>/throughput_vs_interactivity.svg      in+out tokens/s/GPU vs p50 tokens/s/user
//! <out>/output_throughput_vs_interactivity.svg
//! <out>/runs/<mode>@x<level>/records.jsonl   one line per request sent (as measured)
//! <out>/runs/<mode>@x<level>/report.json     `switchyard-loadgen compare` reads these
//! <out>/runs/<mode>@x<level>/report.md
//! <out>/runs/<mode>@x<level>/...             the backend's own files (RunDetail::files)
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;
use switchyard_protocol::route::ServingMode;

use super::plot::{interactivity_vs_throughput_svg, ThroughputKind};
use super::result::{RunDetail, RunResult};
use crate::markdown::run_markdown;
use crate::record::RequestRecord;
use crate::report::RunReport;

/// A file or folder that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct OutputError {
    /// What was being written.
    pub what: String,
    /// The error.
    pub source: std::io::Error,
}

fn write(path: &Path, text: &str) -> Result<(), OutputError> {
    std::fs::write(path, text).map_err(|source| OutputError {
        what: format!("writing {}", path.display()),
        source,
    })
}

fn create_dir(dir: &Path) -> Result<(), OutputError> {
    std::fs::create_dir_all(dir).map_err(|source| OutputError {
        what: format!("creating {}", dir.display()),
        source,
    })
}

/// Pretty JSON of `value` (a serialization error is written in its place: results are
/// never lost to a report field that does not serialize).
pub fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The folder of run `label` under `out`.
pub fn run_dir(out: &Path, label: &str) -> PathBuf {
    out.join("runs").join(label)
}

/// Writes one run's records, report and the backend's files into its folder.
///
/// # Errors
/// [`OutputError`].
pub fn write_run<D: RunDetail>(out: &Path, result: &RunResult<D>) -> Result<(), OutputError> {
    let dir = run_dir(out, &result.run.label);
    write_run_files(&dir, &result.records, &result.report)?;
    for (name, text) in result.detail.files() {
        write(&dir.join(name), &text)?;
    }
    Ok(())
}

/// Writes a run's `records.jsonl`, `report.json` and `report.md` into `dir` (creating it).
///
/// # Errors
/// [`OutputError`].
pub fn write_run_files(
    dir: &Path,
    records: &[RequestRecord],
    report: &RunReport,
) -> Result<(), OutputError> {
    write_json_lines(dir, "records.jsonl", records)?;
    write(&dir.join("report.json"), &json(report))?;
    write(&dir.join("report.md"), &run_markdown(report))
}

/// Writes `items` as JSON lines to `dir/name` (creating `dir`).
///
/// # Errors
/// [`OutputError`].
pub fn write_json_lines<T: Serialize>(
    dir: &Path,
    name: &str,
    items: &[T],
) -> Result<(), OutputError> {
    create_dir(dir)?;
    write(&dir.join(name), &json_lines(items))
}

/// `items` as JSON lines.
pub fn json_lines<T: Serialize>(items: &[T]) -> String {
    let mut lines = String::new();
    for item in items {
        lines.push_str(&serde_json::to_string(item).unwrap_or_default());
        lines.push('\n');
    }
    lines
}

/// Writes the comparison page, its JSON document and the plots of `reports` into `out`.
/// A plot with nothing to draw is skipped with a message on stderr (and an earlier run's
/// plot of that name removed).
///
/// # Errors
/// [`OutputError`].
pub fn write_comparison<T: Serialize>(
    out: &Path,
    page: &str,
    doc: &T,
    reports: &[RunReport],
) -> Result<(), OutputError> {
    create_dir(out)?;
    write(&out.join("comparison.md"), page)?;
    write(&out.join("comparison.json"), &json(doc))?;
    for (kind, name) in [
        (ThroughputKind::Total, "throughput_vs_interactivity.svg"),
        (
            ThroughputKind::Output,
            "output_throughput_vs_interactivity.svg",
        ),
    ] {
        match interactivity_vs_throughput_svg(reports, kind) {
            Ok(svg) => write(&out.join(name), &svg)?,
            Err(e) => {
                switchyard_support::errln!("no plot {name}: {e}");
                remove_stale(&out.join(name))?;
            }
        }
    }
    Ok(())
}

/// Removes a file or folder an earlier run left in a reused output folder (nothing if
/// there is none).
///
/// # Errors
/// [`OutputError`] if it is there and cannot be removed.
pub fn remove_stale(path: &Path) -> Result<(), OutputError> {
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(OutputError {
            what: format!("removing {} (left by an earlier run)", path.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The files a comparison writes into its output folder (besides its run folders and a
/// tool's own extras).
const COMPARISON_OUTPUTS: [&str; 4] = [
    "comparison.md",
    "comparison.json",
    "throughput_vs_interactivity.svg",
    "output_throughput_vs_interactivity.svg",
];

/// Whether `name` is a run folder a comparison writes under `runs/`: `<mode>@x<level>`.
fn is_run_folder(name: &str) -> bool {
    let Some((mode, level)) = name.split_once("@x") else {
        return false;
    };
    let modes = [
        ServingMode::Agg,
        ServingMode::Disagg,
        ServingMode::Conditional,
    ];
    modes.iter().any(|m| m.as_str() == mode)
        && level.parse::<f64>().is_ok_and(|l| l.is_finite() && l > 0.0)
}

/// Removes what an earlier comparison wrote into a reused output folder (its page, JSON,
/// plots and run folders, and the tool's `extras`) before a new one starts: runs are written
/// as they finish and the page at the end, so an interrupted comparison would otherwise leave
/// its finished runs beside an earlier one's page, reading as one finished comparison. Under
/// `runs/` only the run folders a comparison names (`<mode>@x<level>`) go: the folder is also
/// where the documentation keeps load-generator runs and traces, and those stay. Only for a
/// tool that writes every run folder itself: `switchyard-loadgen compare` reads run folders
/// it did not write.
///
/// # Errors
/// [`OutputError`] if something there cannot be removed.
pub fn clear_earlier_comparison(out: &Path, extras: &[&str]) -> Result<(), OutputError> {
    COMPARISON_OUTPUTS
        .iter()
        .chain(extras)
        .try_for_each(|name| remove_stale(&out.join(name)))?;
    let runs = out.join("runs");
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(is_run_folder) {
            remove_stale(&entry.path())?;
        }
    }
    // Gone if nothing else was in it; kept (with what else is there) otherwise.
    let _ = std::fs::remove_dir(&runs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_comparison_is_cleared_and_nothing_else_under_runs() {
        let out = std::env::temp_dir().join(format!("sy-clear-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        for dir in [
            "runs/agg@x1",
            "runs/conditional@x0.5",
            "runs/mine",
            "runs/agg@xmany",
        ] {
            std::fs::create_dir_all(out.join(dir)).unwrap();
        }
        for file in [
            "comparison.md",
            "runs/agg@x1/report.json",
            "runs/mine/notes.txt",
            "runs/agentic-7.jsonl",
            "runs/agg@xmany/report.json",
        ] {
            std::fs::write(out.join(file), "x").unwrap();
        }
        clear_earlier_comparison(&out, &[]).unwrap();
        let left = |p: &str| out.join(p).exists();
        assert!(!left("comparison.md"));
        assert!(!left("runs/agg@x1") && !left("runs/conditional@x0.5"));
        assert!(left("runs/mine/notes.txt") && left("runs/agentic-7.jsonl"));
        assert!(left("runs/agg@xmany"), "not a load level: not a run folder");
        // With only run folders in it, `runs/` goes too.
        std::fs::remove_dir_all(out.join("runs")).unwrap();
        std::fs::create_dir_all(out.join("runs/disagg@x2")).unwrap();
        clear_earlier_comparison(&out, &[]).unwrap();
        assert!(!left("runs"));
        let _ = std::fs::remove_dir_all(&out);
    }
}
