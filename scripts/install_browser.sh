#!/usr/bin/env bash
# Headless Chromium from the distribution's packages, for the browser checks in `make test`.
# Installs only where it can (root with apt-get); otherwise says why, and the browser
# tests skip with that reason. Never downloads a browser build of its own.
set -u
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
reason=""
if [ "$(id -u)" != "0" ]; then
  reason="not root: install Debian's chromium package to run the browser checks"
elif ! command -v apt-get >/dev/null 2>&1; then
  reason="no apt-get: install Chromium to run the browser checks"
else
  echo "installing Debian's chromium for the browser checks"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/tmp/gpuflow-chromium.log 2>&1; then
    reason="apt-get install chromium failed (see /tmp/gpuflow-chromium.log)"
  fi
fi
if [ -n "$reason" ]; then
  echo "browser checks will be skipped: $reason"
fi
exit 0
