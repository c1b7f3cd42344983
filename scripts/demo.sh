#!/usr/bin/env bash
# README command 1: the main job (a local federation on loopback running a trace workload).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec target/debug/meridian demo "$@"
