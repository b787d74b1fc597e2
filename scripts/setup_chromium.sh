#!/usr/bin/env bash
# Installs Debian's Chromium (headless use only: the dashboard's browser test) and prints the
# path of its executable. Idempotent: an installed one costs no network access.
#
#   scripts/setup_chromium.sh   # prints e.g. /usr/bin/chromium; exit 1 when it cannot install
set -euo pipefail

find_chromium() {
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if find_chromium; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup_chromium: chromium is not installed and apt-get as root is not available" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq chromium >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1 || true
  if ! apt-get install -y -qq chromium >/dev/null 2>&1; then
    echo "setup_chromium: apt-get install chromium failed (no network to the Debian mirror?)" >&2
    exit 1
  fi
fi
find_chromium
