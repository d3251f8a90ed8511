#!/usr/bin/env bash
# Installs what the status page's what-if needs to build (scripts/build-whatif.sh),
# idempotently (quick when done):
#   - the wasm32-unknown-unknown Rust target (the browser's wasm)
#   - switchyard-whatif-bindgen (whatif/bindgen/: wasm-bindgen's generator, pinned by its own
#     Cargo.lock) in .cache/whatif-bindgen. It generates for exactly the wasm-bindgen version
#     in the workspace's Cargo.lock: glue of another version does not work with the module.
# The first install compiles the generator and its 42 crates: 1 to 2 minutes on 2 cores
# (measured 60 s with the crates downloading on a quiet machine, 95 s with the crates
# downloaded and another build running).
# Afterwards nothing here needs the network.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

fail() {
  echo "setup-whatif: $1" >&2
  echo "setup-whatif: how to fix: $2" >&2
  exit 1
}

# The version of a package in a Cargo.lock.
locked_version() {
  awk -v name="$2" '$0 == "name = \"" name "\"" { getline; gsub(/[^0-9.]/, ""); print; exit }' "$1"
}
version=$(locked_version Cargo.lock wasm-bindgen)
generator=$(locked_version whatif/bindgen/Cargo.lock wasm-bindgen-cli-support)
[[ -n $version ]] || fail "no wasm-bindgen in Cargo.lock" \
  "check that whatif/Cargo.toml depends on wasm-bindgen and Cargo.lock is up to date"
[[ $version == "$generator" ]] || fail \
  "the what-if is built with wasm-bindgen $version but whatif/bindgen generates for $generator" \
  "pin the same version in whatif/Cargo.toml and whatif/bindgen/Cargo.toml, then update both locks"

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "setup-whatif: adding Rust target wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown || fail "could not add the wasm32-unknown-unknown target" \
    "run 'rustup target add wasm32-unknown-unknown' with network access to the Rust dist server"
fi

# The generator's own version (whatif/bindgen/Cargo.toml): bumped when it changes, so that an
# installed older build is replaced.
tool_version=$(awk -F'"' '/^version = / { print $2; exit }' whatif/bindgen/Cargo.toml)
prefix="$root/.cache/whatif-bindgen"
bin="$prefix/bin/switchyard-whatif-bindgen"
wanted="switchyard-whatif-bindgen $tool_version (wasm-bindgen $version)"
if [[ -x $bin && $("$bin" --version 2>/dev/null) == "$wanted" ]]; then
  exit 0
fi
echo "setup-whatif: installing switchyard-whatif-bindgen (wasm-bindgen $version) into .cache/whatif-bindgen (compiles from source; about 2 minutes)"
# Built in .cache (not in the repository's tree, not in the workspace's target directory,
# whose lock a build running beside this one may hold), without the lint wrapper meant for
# our workspace crates. --force: a generator of another version is replaced.
CARGO_TARGET_DIR="$prefix/target" env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS \
  cargo install --path whatif/bindgen --locked --force --root "$prefix" --quiet \
  || fail "cargo could not install whatif/bindgen" "check access to crates.io"
rm -rf "$prefix/target" # 150 MB of intermediate files; only the binary is used
"$bin" --version
