//! The virtual-time replay crate's integration tests, one module per subject, linked into one test
//! binary (one link instead of one per file).

mod replay_cli;
mod replay_gateway;
mod replay_mooncake;
mod replay_planner;
mod replay_policy_bars;
mod replay_prefill_decodes;
mod replay_scenarios;
mod replay_sessions;
