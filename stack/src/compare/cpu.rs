//! Where a run's CPU time went: each stack process, this process (the load generator's client),
//! and everything else on the machine, from `/proc` before and after the replay.
//!
//! The cross-check's virtual gateway model takes its costs from a microbenchmark of the
//! tokenizer ([`super::gateway_cost`]); this is the in-run check of that model: the control
//! plane's and the workers' CPU time per prompt token as the stack actually spent it, what
//! Envoy and the client spent besides, and how much of the machine other work (other users'
//! builds and tests) took while it ran. Linux only; elsewhere, or if a process is gone, the
//! fields are `None`.

use std::path::Path;

use serde::Serialize;

/// Clock ticks per second of `/proc` CPU times (`USER_HZ`, 100 on every Linux build that
/// matters here).
const TICKS_PER_S: f64 = 100.0;

/// Name of this process (the load generator's client) in [`CpuSnapshot::processes_ms`].
pub const CLIENT: &str = "client";

/// CPU times at one instant, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuSnapshot {
    /// Busy time of the whole machine (all cores: user, nice, system, irq, softirq, steal).
    pub machine_busy_ms: Option<f64>,
    /// Each stack process by its component name, then this process ([`CLIENT`]).
    pub processes_ms: Vec<(&'static str, Option<f64>)>,
}

/// A run's CPU use: the difference of two snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    /// Wall ms between the snapshots.
    pub wall_ms: f64,
    /// Busy ms of the whole machine.
    pub machine_busy_ms: Option<f64>,
    /// CPU ms per process, named as in [`CpuSnapshot::processes_ms`].
    pub processes: Vec<(String, Option<f64>)>,
    /// Machine busy ms not spent by the stack or the client (other work on the machine).
    pub other_ms: Option<f64>,
}

impl CpuUsage {
    /// From snapshots `before` and `after`, `wall_ms` apart.
    pub fn between(before: &CpuSnapshot, after: &CpuSnapshot, wall_ms: f64) -> CpuUsage {
        let diff = |a: Option<f64>, b: Option<f64>| Some(b? - a?).filter(|d| *d >= 0.0);
        // Paired by name: a process missing from either snapshot has no figure.
        let processes: Vec<(String, Option<f64>)> = after
            .processes_ms
            .iter()
            .map(|&(name, b)| {
                let a = before.processes_ms.iter().find(|p| p.0 == name);
                (name.to_string(), diff(a.and_then(|p| p.1), b))
            })
            .collect();
        let machine = diff(before.machine_busy_ms, after.machine_busy_ms);
        let ours: f64 = processes.iter().filter_map(|p| p.1).sum();
        CpuUsage {
            wall_ms,
            machine_busy_ms: machine,
            other_ms: machine.map(|m| (m - ours).max(0.0)),
            processes,
        }
    }

    /// CPU ms of the process named `name`.
    pub fn process_ms(&self, name: &str) -> Option<f64> {
        self.processes.iter().find(|p| p.0 == name)?.1
    }

    /// Average cores other work used during the run.
    pub fn other_cores(&self) -> Option<f64> {
        (self.wall_ms > 0.0).then_some(self.other_ms? / self.wall_ms)
    }
}

/// Busy ms of the machine from `/proc/stat`'s first line.
pub fn machine_busy_ms() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine_busy_ticks(text.lines().next()?).map(|t| t * 1e3 / TICKS_PER_S)
}

/// CPU ms (user + system) of process `pid` so far.
pub fn process_ms(pid: u32) -> Option<f64> {
    let text =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    parse_process_ticks(&text).map(|t| t * 1e3 / TICKS_PER_S)
}

/// CPU ms of this process so far.
pub fn own_ms() -> Option<f64> {
    process_ms(std::process::id())
}

/// `cpu  user nice system idle iowait irq softirq steal ...` → busy ticks (all but idle and
/// iowait).
fn parse_machine_busy_ticks(line: &str) -> Option<f64> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<f64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 8 {
        return None;
    }
    Some(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

/// `/proc/<pid>/stat` → utime + stime ticks (fields 14 and 15; the command name in
/// parentheses may contain spaces, so fields are counted after its closing parenthesis).
fn parse_process_ticks(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) is index 11 and stime (15) index 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A run's CPU use in one line: ms per process and other work, as average cores.
pub fn cpu_summary(cpu: &CpuUsage) -> String {
    let cores = |ms: Option<f64>| {
        ms.map_or_else(
            || "–".to_string(),
            |ms| format!("{:.0} ms ({:.2} cores)", ms, ms / cpu.wall_ms.max(1.0)),
        )
    };
    let mut parts: Vec<String> = cpu
        .processes
        .iter()
        .map(|(name, ms)| format!("{name} {}", cores(*ms)))
        .collect();
    parts.push(format!("other work {}", cores(cpu.other_ms)));
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_lines() {
        let line = "cpu  100 5 50 1000 20 3 2 1 0 0";
        assert_eq!(parse_machine_busy_ticks(line), Some(161.0));
        assert_eq!(parse_machine_busy_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
        let stat = "1234 (my proc) name) S 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 4 0 100";
        assert_eq!(parse_process_ticks(stat), Some(290.0));
        assert_eq!(parse_process_ticks("garbage"), None);
    }

    /// The stack's processes and the client, as the runner names them.
    fn named(ms: [Option<f64>; 6]) -> Vec<(&'static str, Option<f64>)> {
        [
            "nats-server",
            "control-plane",
            "sim-workers",
            "sim-prefill-workers",
            "envoy",
            CLIENT,
        ]
        .into_iter()
        .zip(ms)
        .collect()
    }

    #[test]
    fn usage_is_the_difference_and_other_work_the_rest() {
        let before = CpuSnapshot {
            machine_busy_ms: Some(1_000.0),
            processes_ms: named([
                Some(0.0),
                Some(100.0),
                Some(50.0),
                None,
                Some(10.0),
                Some(5.0),
            ]),
        };
        let after = CpuSnapshot {
            machine_busy_ms: Some(3_000.0),
            processes_ms: named([
                Some(10.0),
                Some(600.0),
                Some(450.0),
                None,
                Some(60.0),
                Some(105.0),
            ]),
        };
        let u = CpuUsage::between(&before, &after, 2_000.0);
        assert_eq!(u.process_ms("control-plane"), Some(500.0));
        assert_eq!(u.process_ms("sim-prefill-workers"), None);
        assert_eq!(u.machine_busy_ms, Some(2_000.0));
        // 2000 busy − (10 + 500 + 400 + 50 + 100) of ours.
        assert_eq!(u.other_ms, Some(940.0));
        assert_eq!(u.other_cores(), Some(0.47));
        assert!(own_ms().is_some_and(|ms| ms >= 0.0));
    }
}
