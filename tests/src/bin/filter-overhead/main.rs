//! `filter-overhead`: what the Switchyard filter adds to a request, in each `tokenize` mode,
//! measured on a real stack.
//!
//! Per mode (`control_plane`: the filter sends the body and the control plane tokenizes;
//! `filter`: the filter tokenizes in its VM and sends block hashes), one stack: one Envoy
//! (`--concurrency 1`, so one worker thread and one VM) with two listeners to the same single
//! simulated decode worker, the gateway listener with the filter and a plain one without it.
//! For chat prompts of about 8k, 32k, 128k and 240k tokens (1 MB), each **warm** (a 16-message
//! conversation seen before, plus a new question) and **cold** (text never seen), requests
//! alternate between the two listeners (machine noise hits both alike): the client-measured
//! difference is what the gateway adds. Then each listener gets a block of requests alone
//! while the CPU time of Envoy's worker thread (`/proc/<pid>/task/*/stat`, threads named
//! `wrk:*`) is read before and after. Route-call bytes come from the filter's
//! `route_call_bytes_total` stat, the control plane's time from its route histogram, Envoy's
//! RSS from `/proc/<pid>/status` before the first request and after the last. Last, what a
//! cold 128k prompt does to another stream on the same worker thread: a small request's
//! latency alone, and sent while a cold 128k request is being routed.
//!
//! The worker is simulated (a GB200 model run 1000x faster than real time, one output token),
//! so its own time is small and the same for both paths. Bounded: `--requests` per case and
//! listener, `--max-seconds` overall.
//!
//! ```sh
//! cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm
//! cargo build --release --bin switchyard-control-plane --bin switchyard-sim-worker --bin filter-overhead
//! target/release/filter-overhead --release --requests 20
//! ```

mod cases;
mod probes;
mod prompts;
mod stub;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};
use switchyard_e2e::{client, start_stack};
use switchyard_protocol::tokenize::{default_model_dir, ModelTokenizer};
use switchyard_stack::{Component, Profile, SpeedUp, StackBuilder};
use tokio::time::Instant;

use cases::{floor_rows, interference, load_tokenizer, measure, ModeSummary, Row};
use probes::{percentile, rss_mib};
use prompts::{calibrate, chat_of};

/// The `tokenize` modes, in the order they run.
const MODES: [&str; 2] = ["filter", CONTROL_PLANE_MODE];
/// The mode in which the filter sends the body; its stack also measures the floor.
const CONTROL_PLANE_MODE: &str = "control_plane";
/// Prompt sizes in tokens. "1 MB" is a ~240k-token chat, about 1 MB of JSON: the largest
/// agentic turn the issue's gateway-overhead target names.
const SIZES: [(&str, usize); 4] = [
    ("8k", 8_192),
    ("32k", 32_768),
    ("128k", 131_072),
    ("1 MB", 240_000),
];
/// The size whose cold prompt runs beside a small request (what it does to other streams).
const INTERFERING_SIZE: &str = "128k";

/// Command-line settings (hand-parsed: a few flags do not need clap here).
struct Args {
    requests: usize,
    max_seconds: u64,
    release: bool,
    modes: Vec<&'static str>,
    /// Whether the `control_plane` stack ends with the floor's warm cases.
    floor: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        requests: 20,
        max_seconds: 1_800,
        release: false,
        modes: MODES.to_vec(),
        floor: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--requests" => args.requests = it.next().context("--requests N")?.parse()?,
            "--max-seconds" => args.max_seconds = it.next().context("--max-seconds S")?.parse()?,
            "--release" => args.release = true,
            "--no-floor" => args.floor = false,
            "--tokenize" => {
                let mode = it.next().context("--tokenize control_plane|filter|both")?;
                args.modes = match mode.as_str() {
                    "both" => MODES.to_vec(),
                    other => vec![*MODES
                        .iter()
                        .find(|m| **m == other)
                        .with_context(|| format!("--tokenize {other}: not a mode"))?],
                };
            }
            "-h" | "--help" => {
                println!(
                    "filter-overhead [--requests N (20)] [--max-seconds S (1800)] [--release] [--tokenize control_plane|filter|both (both)] [--no-floor]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if args.requests < 10 {
        bail!("--requests must be at least 10 (percentiles of fewer mean nothing)");
    }
    Ok(args)
}

async fn run_mode(
    args: &Args,
    mode: &'static str,
    sizes: &[(&'static str, usize, usize)],
    deadline: Instant,
    rows: &mut Vec<Row>,
) -> anyhow::Result<ModeSummary> {
    let profile = if args.release {
        Profile::Release
    } else {
        Profile::Debug
    };
    let mut stack = start_stack(
        StackBuilder::new()
            .decode_workers(1)
            .profile(profile)
            .speed_up(SpeedUp::new(1000.0).expect("a positive speed-up"))
            .envoy_concurrency(1)
            // Cold tokenization of a 128k prompt is hundreds of milliseconds on a busy
            // machine; the bench measures routed requests, not fail-open ones.
            .route_timeout_ms(5_000)
            // A cold "1 MB" chat (text never seen) is ~267k tokens, past the simulated
            // model's 262,144: the bench measures the gateway, not the context limit.
            .max_model_len(1 << 19)
            .filter_setting("tokenize", mode)
            .plain_listener(0),
    )
    .await;
    let http = client();
    let pid = stack.pid(Component::Envoy).context("envoy runs")?;
    let rss_start_mib = rss_mib(pid);
    let tokenizer_load = if mode == "filter" {
        let first = chat_of(2_000, "load", 0).to_string().into_bytes();
        Some(load_tokenizer(&stack, &http, &first).await?)
    } else {
        None
    };
    for &(size, bytes, isl) in sizes {
        eprintln!("{mode}: {size} warm...");
        let salt = format!("warm{size}");
        let warm = |i: usize| chat_of(bytes, &salt, i).to_string().into_bytes();
        let case = format!("{size} warm");
        rows.push(
            measure(
                &stack,
                &http,
                mode,
                case,
                isl,
                warm,
                args.requests,
                deadline,
            )
            .await?,
        );
        eprintln!("{mode}: {size} cold...");
        let cold = |i: usize| {
            chat_of(bytes, &format!("cold{mode}{size}n{i}"), 0)
                .to_string()
                .into_bytes()
        };
        let case = format!("{size} cold");
        rows.push(
            measure(
                &stack,
                &http,
                mode,
                case,
                isl,
                cold,
                args.requests,
                deadline,
            )
            .await?,
        );
    }
    eprintln!("{mode}: a small request beside a cold 128k one...");
    let big_bytes = sizes
        .iter()
        .find(|s| s.0 == INTERFERING_SIZE)
        .map_or(0, |s| s.1);
    let (small_alone_ms, small_contended_ms) = interference(&stack, &http, mode, big_bytes).await?;
    let rss_end_mib = rss_mib(pid);
    if mode == CONTROL_PLANE_MODE && args.floor {
        eprintln!("{mode}: the floor, a control plane that does no prompt work...");
        floor_rows(&mut stack, &http, sizes, args.requests, deadline, rows).await?;
    }
    let run_dir: &Path = stack.run_dir();
    eprintln!("{mode}: logs in {}", run_dir.display());
    Ok(ModeSummary {
        mode,
        rss_start_mib,
        rss_end_mib,
        tokenizer_load,
        small_alone_ms,
        small_contended_ms,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let tokenizer = ModelTokenizer::from_dir(&default_model_dir())?;
    let mut sizes = Vec::new();
    for (name, tokens) in SIZES {
        let (bytes, isl) = calibrate(&tokenizer, tokens)?;
        eprintln!("{name}: {bytes} bytes of messages, {isl} tokens");
        sizes.push((name, bytes, isl));
    }
    drop(tokenizer);
    let mut rows = Vec::new();
    let mut summaries = Vec::new();
    for &mode in &args.modes {
        summaries.push(run_mode(&args, mode, &sizes, deadline, &mut rows).await?);
    }
    println!(
        "| mode | prompt | ISL | pairs | plain p50 ms | gateway p50 ms | added p50 ms | plain p99 ms | gateway p99 ms | added p99 ms | control plane ms/route | worker CPU/req plain ms | worker CPU/req gateway ms | route-call bytes/req | not routed | body fallbacks |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let (p50p, p50f) = (
            percentile(&row.plain, 50.0),
            percentile(&row.filtered, 50.0),
        );
        let (p99p, p99f) = (
            percentile(&row.plain, 99.0),
            percentile(&row.filtered, 99.0),
        );
        println!(
            "| {} | {} | {} | {} | {p50p:.2} | {p50f:.2} | {:.2} | {p99p:.2} | {p99f:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} |",
            row.mode,
            row.case,
            row.isl,
            row.plain.len(),
            p50f - p50p,
            p99f - p99p,
            row.control_plane_ms,
            row.cpu_plain_ms,
            row.cpu_filtered_ms,
            row.route_call_bytes,
            row.not_routed,
            row.body_fallbacks,
        );
    }
    println!();
    println!(
        "| mode | Envoy RSS before MiB | Envoy RSS after MiB | tokenizer load s (worker CPU s) | small request alone p50 / max ms | small request beside a cold 128k p50 / max ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for s in &summaries {
        let load = s.tokenizer_load.map_or("-".to_string(), |(wall, cpu)| {
            format!("{wall:.2} ({cpu:.2})")
        });
        let max = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.0} | {:.0} | {load} | {:.2} / {:.2} | {:.2} / {:.2} |",
            s.mode,
            s.rss_start_mib,
            s.rss_end_mib,
            percentile(&s.small_alone_ms, 50.0),
            max(&s.small_alone_ms),
            percentile(&s.small_contended_ms, 50.0),
            max(&s.small_contended_ms),
        );
    }
    Ok(())
}
