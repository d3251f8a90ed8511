//! Command-line plumbing the Switchyard binaries share: parse flags with clap, but exit 64
//! (`EX_USAGE` from sysexits.h) on bad flags rather than clap's 2, and 0 after `--help` or
//! `--version`, so that scripts can tell a usage error from a failed run.

use std::io::Write as _;
use std::process::ExitCode;

/// `EX_USAGE`: the command was used incorrectly (bad flags, invalid config).
pub const EXIT_USAGE: u8 = 64;

/// The parsed flags, or, after printing clap's message, the code to exit with.
pub fn parse_args<C: clap::Parser>() -> Result<C, ExitCode> {
    C::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EXIT_USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// The log filter directives for `rust_log` (the `RUST_LOG` value, if set): it, or `info`,
/// then `<target>=off` for each of `quiet` it does not name. A library that logs every retry
/// stays quiet under `RUST_LOG=info` or `debug` as under the default, since the binary says
/// each of those states once itself; naming the target (`RUST_LOG=info,async_nats=debug`)
/// brings its lines back.
pub fn log_filter(rust_log: Option<&str>, quiet: &[&str]) -> String {
    let given = rust_log.map(str::trim).filter(|s| !s.is_empty());
    let mut directives = given.unwrap_or("info").to_string();
    for target in quiet {
        let named = given.is_some_and(|g| {
            g.split(',')
                .any(|d| d.trim().split(['=', '[']).next() == Some(*target))
        });
        if !named {
            directives.push_str(&format!(",{target}=off"));
        }
    }
    directives
}

/// Prints like `println!`, but a reader that went away (`| head`) is not a panic: the
/// binaries print their tables after writing their files, and the run's exit code must not
/// become 101 and a backtrace because nobody read the rest. Other write errors are said once
/// on stderr per line; the run goes on either way.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::cli::write_stdout_line(::std::format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_stdout_line(::std::format_args!($($arg)*))
    };
}

/// The body of [`outln!`]: one line to stdout, a closed pipe ignored.
pub fn write_stdout_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            write_stderr_line(format_args!("cannot write to stdout: {e}"));
        }
    }
}

/// Prints like `eprintln!`, but a stderr that cannot be written (`2>&1 | head`) is not a
/// panic: progress lines are for a reader, and `eprintln!`'s panic could not be printed
/// either, so the process aborted mid-run, its stack's children left to their process group's
/// cleanup. There is nobody to tell about the failed write: it is dropped.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::write_stderr_line(::std::format_args!($($arg)*))
    };
}

/// The body of [`errln!`]: one line to stderr, any error dropped.
pub fn write_stderr_line(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Longest duration a time flag takes, in seconds: a year, far past any run, and well within
/// what `std::time::Duration` holds (converting a larger or infinite float panics).
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// A duration flag in seconds (clap value parser): a finite number from 0 to
/// [`MAX_SECONDS`].
///
/// # Errors
/// The message clap prints beside the flag.
pub fn seconds(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if (0.0..=MAX_SECONDS).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text} is not between 0 and {MAX_SECONDS} seconds"))
    }
}

/// A duration flag in seconds above 0 (see [`seconds`]).
///
/// # Errors
/// The message clap prints beside the flag.
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    match seconds(text)? {
        0.0 => Err("must be above 0 seconds".into()),
        value => Ok(value),
    }
}

/// A latency objective in milliseconds (clap value parser): finite and above 0.
///
/// # Errors
/// The message clap prints beside the flag.
pub fn objective_ms(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of milliseconds"))?;
    if value.is_finite() && value > 0.0 && value <= MAX_SECONDS * 1e3 {
        Ok(value)
    } else {
        Err(format!("{text} is not a positive number of milliseconds"))
    }
}

/// An error and its causes on one line, `outer: cause: root`, leaving out a cause whose text
/// the line already holds: many errors print their source in their own message, and an
/// alternate-format chain would then say it twice (`No such file (os error 2): No such file
/// (os error 2)`).
pub fn error_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noisy_targets_stay_off_unless_rust_log_names_them() {
        let quiet = ["async_nats", "warp::server"];
        assert_eq!(
            log_filter(None, &quiet),
            "info,async_nats=off,warp::server=off"
        );
        assert_eq!(
            log_filter(Some(" "), &quiet),
            "info,async_nats=off,warp::server=off"
        );
        assert_eq!(
            log_filter(Some("debug"), &quiet),
            "debug,async_nats=off,warp::server=off"
        );
        assert_eq!(
            log_filter(Some("info,async_nats=debug"), &quiet),
            "info,async_nats=debug,warp::server=off"
        );
        // A target only sharing a prefix is not named.
        assert_eq!(
            log_filter(Some("warp=debug,async_nats_x=info"), &quiet),
            "warp=debug,async_nats_x=info,async_nats=off,warp::server=off"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read trace t.jsonl: {source}")]
    struct Read {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("planning")]
    struct Planning(#[source] Read);

    #[test]
    fn an_error_line_says_each_cause_once() {
        let missing = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let read = Read { source: missing() };
        assert_eq!(
            error_line(&read),
            format!("cannot read trace t.jsonl: {}", missing())
        );
        assert_eq!(
            error_line(&Planning(Read { source: missing() })),
            format!("planning: cannot read trace t.jsonl: {}", missing())
        );
    }

    #[test]
    fn time_flags_take_finite_bounded_numbers_only() {
        assert_eq!(seconds("0"), Ok(0.0));
        assert_eq!(seconds("60.5"), Ok(60.5));
        for bad in ["-1", "inf", "NaN", "1e300", "x", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert!(positive_seconds("0").is_err());
        assert_eq!(positive_seconds("0.25"), Ok(0.25));
        assert_eq!(objective_ms("2000"), Ok(2000.0));
        for bad in ["0", "-5", "nan", "inf"] {
            assert!(objective_ms(bad).is_err(), "{bad}");
        }
        // Every accepted value converts without panicking.
        let _ = std::time::Duration::from_secs_f64(seconds(&MAX_SECONDS.to_string()).unwrap());
    }
}
