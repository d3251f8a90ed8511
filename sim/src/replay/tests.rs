//! Unit tests of the replay (integration tests with the Mooncake trace: `sim/tests/replay_*.rs`).
