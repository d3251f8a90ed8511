//! Headless Chromium (Debian's `chromium` package, installed by `scripts/setup.sh`) for the
//! tests of pages: the DOM after the page's scripts ran, and a screenshot. Each run is its own
//! process group, bounded in time and killed whole afterwards (Chromium forks helpers).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long one headless run may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The flags every run gets: headless, no sandbox (the tests run as root), and none of the
/// background connections a closed network refuses.
const BASE_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
];

/// A Chromium binary.
#[derive(Debug, Clone)]
pub struct Chromium {
    program: PathBuf,
}

impl Chromium {
    /// `SWITCHYARD_CHROMIUM`, else `/usr/bin/chromium`.
    ///
    /// # Panics
    /// If there is none, naming the setup script that installs it.
    pub fn locate() -> Chromium {
        let program = std::env::var_os("SWITCHYARD_CHROMIUM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
        assert!(
            program.exists(),
            "no Chromium at {} (set SWITCHYARD_CHROMIUM, or run scripts/setup.sh, which installs Debian's chromium)",
            program.display()
        );
        Chromium { program }
    }

    /// Loads `url`, lets its scripts run for `budget` of virtual time (network waits do not
    /// count), and returns the DOM as HTML.
    ///
    /// # Panics
    /// If Chromium fails or overruns [`RUN_TIMEOUT`].
    pub fn dump_dom(&self, url: &str, budget: Duration, scratch: &Path) -> String {
        let out = scratch.join("dom.html");
        self.run(
            &[
                format!("--virtual-time-budget={}", budget.as_millis()),
                "--dump-dom".into(),
                url.into(),
            ],
            scratch,
            &out,
        );
        std::fs::read_to_string(&out).expect("Chromium's DOM output")
    }

    /// Loads `url` as [`Chromium::dump_dom`] does and saves a `width`×`height` PNG at `png`.
    ///
    /// # Panics
    /// If Chromium fails, overruns [`RUN_TIMEOUT`], or writes no PNG.
    pub fn screenshot(
        &self,
        url: &str,
        budget: Duration,
        size: (u32, u32),
        png: &Path,
        scratch: &Path,
    ) {
        let _ = std::fs::remove_file(png);
        self.run(
            &[
                format!("--virtual-time-budget={}", budget.as_millis()),
                format!("--window-size={},{}", size.0, size.1),
                format!("--screenshot={}", png.display()),
                url.into(),
            ],
            scratch,
            &scratch.join("screenshot.log"),
        );
        let bytes = std::fs::read(png).expect("Chromium wrote the screenshot");
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "not a PNG: {}",
            png.display()
        );
    }

    fn run(&self, args: &[String], scratch: &Path, stdout: &Path) {
        use std::os::unix::process::CommandExt;
        let profile = scratch.join(format!("profile-{}", std::process::id()));
        let log = scratch.join("chromium.log");
        let mut child = Command::new(&self.program)
            .args(BASE_FLAGS)
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.program.display()));
        let leader = child.id();
        // Polled in steps: a bounded number of checks covers the timeout.
        let step = Duration::from_millis(100);
        let mut status = None;
        for _ in 0..RUN_TIMEOUT.as_millis() / step.as_millis() {
            if let Ok(Some(done)) = child.try_wait() {
                status = Some(done);
                break;
            }
            std::thread::sleep(step);
        }
        // Helpers (zygote, renderer, GPU process) may outlive the browser process.
        crate::signal_group(leader, "-KILL");
        let _ = child.wait();
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        match status {
            Some(s) if s.success() => {}
            Some(s) => panic!("Chromium exited with {s}; log:\n{log_text}"),
            None => panic!("Chromium did not finish within {RUN_TIMEOUT:?}; log:\n{log_text}"),
        }
    }
}
