#!/usr/bin/env bash
# Sets up a fresh machine and runs every check and test Switchyard has:
# formatting, clippy (native and wasm), the wasm filter and the status page's what-if
# builds, unit, property and
# end-to-end tests (real nats-server and Envoy, started and stopped by the tests; the status
# page in headless Chromium), and last
# the real-vLLM test (vLLM's CPU build, installed by scripts/setup-vllm.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Each step prints how long it took, so CI logs show where the time goes.
step_name=""
step_start=$SECONDS
step_done() {
  local status=$?
  if [[ -n $step_name ]]; then
    echo "-- $step_name: $((SECONDS - step_start)) s"
  fi
  return $status
}
step() {
  step_done
  step_name=$*
  step_start=$SECONDS
  echo
  echo "== $*"
}
trap step_done EXIT

step "setup (wasm target, Envoy, nats-server, tokenizer)"
./scripts/setup.sh
# shellcheck disable=SC1091
source .cache/env.sh

step "setup (headless Chromium for the status page's test)"
./scripts/setup-chromium.sh

step "setup (the status page's what-if: wasm32-unknown-unknown, the JS glue generator)"
# Cold, this compiles the generator (whatif/bindgen) once: 1 to 2 minutes on 2 cores.
./scripts/setup-whatif.sh

step "setup (vLLM CPU build and its tiny model)"
# Not beside the build: measured so, pip's unpacking and bytecode compiling slowed the build
# by more than the install takes alone.
./scripts/setup-vllm.sh
# shellcheck disable=SC1091
source .cache/vllm-env.sh

step "rustfmt"
cargo fmt --all --check

step "unsafe code stays in its one audited item"
# The workspace denies `unsafe_code`; the KV index's prefetch hint is the one allowed item
# (kv-index/src/prefetch.rs). A second opt-out fails here, so it gets reviewed.
allowed=$(grep -rn --include='*.rs' --exclude-dir=target --exclude-dir=.venv \
  --exclude-dir=.cache --exclude-dir=results 'allow(unsafe_code)' . | sed 's|^\./||' || true)
if [[ $(grep -c . <<<"$allowed") -ne 1 || $allowed != kv-index/src/prefetch.rs:* ]]; then
  echo "expected exactly one allow(unsafe_code), in kv-index/src/prefetch.rs; found:" >&2
  echo "$allowed" >&2
  exit 1
fi

step "crate arrows (docs/architecture.md)"
python3 scripts/check-architecture.py

step "clippy (wasm32-wasip1 filter)"
cargo clippy -p switchyard-filter --target wasm32-wasip1 --locked -- -D warnings

step "build the filter (wasm32-wasip1)"
cargo build -p switchyard-filter --target wasm32-wasip1 --profile wasm --locked

step "Istio manifests: YAML, route timeouts and proxyVersion, their Envoy fragments validated by Envoy"
# docs/istio.md: the manifests are not applied to a mesh here; this checks what can be
# checked without one (envoy/istio/validate_fragments.py says what).
target_dir=${CARGO_TARGET_DIR:-target}
.venv/bin/python envoy/istio/validate_fragments.py . \
  "$target_dir/wasm32-wasip1/wasm/switchyard_filter.wasm" > "$target_dir/istio-bootstrap.json"
"$SWITCHYARD_ENVOY" --mode validate --use-dynamic-base-id -c "$target_dir/istio-bootstrap.json"

step "build and clippy (native): the binaries the end-to-end tests start, the tests, the benches"
# One compilation serves clippy and the tests: clippy-driver, as Cargo's workspace wrapper,
# compiles the workspace's own crates and lints them as it goes (dependencies go to rustc
# alone), with `-D warnings` passed the way `cargo clippy -- -D warnings` passes it. A
# separate `cargo clippy` pass would type-check every crate and dependency a second time
# (3 minutes on 2 cores). The tests below run with the same settings, so nothing rebuilds.
# Incremental state only costs time in a build that starts from nothing.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
export CLIPPY_ARGS="-Dwarnings__CLIPPY_HACKERY__"
export CARGO_INCREMENTAL=0
# The same selection (--workspace, tests and examples) as the `cargo test` runs below: Cargo
# resolves dependency features per invocation, and a selection without the tests (or with
# `-p`) builds ~40 crates a second time with other features.
cargo build --workspace --bins --tests --examples --locked
# Benches build in the dev profile only to be linted; they are run by hand (docs/benchmarks.md).
cargo build --workspace --benches --profile dev --locked

step "build and clippy the status page's what-if (wasm32-unknown-unknown)"
# With the clippy-driver wrapper still set, this build is also the crate's lint for the
# browser target (its wasm-bindgen exports only exist there). About 25 s cold.
./scripts/build-whatif.sh

step "tests"
# cargo-nextest (on the Rust machine image) runs every binary's tests side by side, grouped
# and capped by .config/nextest.toml: about half the time of one binary after another. It
# builds with the same selection as above, so nothing rebuilds. Without it, cargo test runs
# the same tests one binary at a time.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked
  cargo test --workspace --doc --locked
else
  echo "cargo-nextest not found: running the tests with cargo test, one binary at a time"
  cargo test --workspace --locked
fi

step "real vLLM: a prefill/decode pair over NIXL behind the gateway (after the rest: idle NIXL engines busy-poll both cores)"
cargo test --workspace --test e2e_vllm --locked -- --ignored
