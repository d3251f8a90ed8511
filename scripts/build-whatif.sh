#!/usr/bin/env bash
# Builds the status page's what-if module into <target>/whatif/ (CARGO_TARGET_DIR, else
# target/): the policy's code (switchyard-whatif) for wasm32-unknown-unknown in the `wasm`
# profile, then its JS glue for the browser (switchyard_whatif.js + switchyard_whatif_bg.wasm).
# The control plane serves that directory with --whatif-dir; the local stack passes it when
# it exists. Needs scripts/setup-whatif.sh once. About 25 s from nothing on 2 cores, a few
# seconds after a change.
#
# Extra arguments go to cargo build (scripts/test.sh sets clippy-driver as the workspace
# wrapper, so this build is also the crate's wasm lint).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

generator="$root/.cache/whatif-bindgen/bin/switchyard-whatif-bindgen"
if [[ ! -x $generator ]]; then
  echo "build-whatif: $generator is missing" >&2
  echo "build-whatif: how to fix: run scripts/setup-whatif.sh" >&2
  exit 1
fi

target=${CARGO_TARGET_DIR:-$root/target}
cargo build -p switchyard-whatif --target wasm32-unknown-unknown --profile wasm --locked "$@"

# Generated beside the final directory and swapped in whole, so that the directory a control
# plane serves never holds the glue of one build beside the wasm of another.
out="$target/whatif"
rm -rf "$out.new"
"$generator" "$target/wasm32-unknown-unknown/wasm/switchyard_whatif.wasm" "$out.new"
rm -rf "$out.old"
if [[ -d $out ]]; then mv "$out" "$out.old"; fi
mv "$out.new" "$out"
rm -rf "$out.old"
echo "build-whatif: $(du -sh "$out" | cut -f1) in $out"
