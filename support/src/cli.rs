//! Command-line plumbing the Switchyard binaries share: parse flags with clap, but exit 64
//! (`EX_USAGE` from sysexits.h) on bad flags rather than clap's 2, and 0 after `--help` or
//! `--version`, so that scripts can tell a usage error from a failed run.

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
