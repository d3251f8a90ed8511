#!/usr/bin/env bash
# Installs headless Chromium for the tests of pages (the control plane's status page):
# Debian's `chromium` package, idempotently (quick when present). Needs root and apt-get on a
# fresh machine; elsewhere set SWITCHYARD_CHROMIUM to a Chromium binary. Not needed by the
# demo, only by scripts/test.sh.
set -euo pipefail

if [[ -n ${SWITCHYARD_CHROMIUM:-} && -x ${SWITCHYARD_CHROMIUM} ]]; then
  exit 0
fi
if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-chromium: /usr/bin/chromium is missing" >&2
  echo "setup-chromium: how to fix: apt-get install chromium (as root, Debian), or set SWITCHYARD_CHROMIUM to a Chromium binary" >&2
  exit 1
fi
echo "setup-chromium: installing Debian's chromium"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
/usr/bin/chromium --version
