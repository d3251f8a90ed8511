#!/usr/bin/env bash
# Sets up a fresh machine and runs every check and test Switchyard has:
# formatting, clippy (native and wasm), the wasm filter build, unit, property and
# end-to-end tests (real nats-server and Envoy, started and stopped by the tests).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

./scripts/setup.sh
# shellcheck disable=SC1091
source .cache/env.sh

step() { echo; echo "== $*"; }

step "rustfmt"
cargo fmt --all --check

step "clippy (native)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "clippy (wasm32-wasip1 filter)"
cargo clippy -p switchyard-filter --target wasm32-wasip1 --locked -- -D warnings

step "build the filter (wasm32-wasip1) and the binaries the end-to-end tests start"
cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm --locked
cargo build --workspace --bins --locked

step "tests"
cargo test --workspace --locked
