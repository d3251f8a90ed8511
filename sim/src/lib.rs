//! Switchyard's simulated workers and load generator.
//!
//! Nobody needs GPUs to run, test or benchmark Switchyard: a simulated worker is a real HTTP
//! server that behaves like a vLLM worker (OpenAI API, prefix caching, KV events, the
//! `kv_transfer_params` handoff) with iteration times from a GB200 performance model
//! (`docs/sim-model.md`). **Everything here is simulated: no model runs, generated text is
//! filler, and KV "transfers" only wait the modelled time.**
//!
//! # Layout
//! - [`engine`]: the pure, clock-driven engine core (batching, paged KV cache, timing model).
//! - [`vtime`]: a discrete-event driver that advances engine cores in virtual time.
//! - [`worker`]: the real-time worker (HTTP API, NATS publishing, the KV handoff).
//! - [`replay`]: virtual-time replay of a workload through engine cores with the control
//!   plane's own routing code in the loop (the three serving modes, threshold sweeps).
//! - [`cli`]: flag parsing shared by the binaries (exit 64 on bad flags).
//! - [`loadgen`]: workloads (Mooncake traces, synthetic agentic sessions), the streaming
//!   client that replays them against any OpenAI endpoint, and the report.
#![deny(missing_docs)]

pub mod cli;
pub mod engine;
pub mod loadgen;
pub mod replay;
pub mod vtime;
pub mod worker;
