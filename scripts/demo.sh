#!/usr/bin/env bash
# README command 1: the main job (a local federation on loopback running a trace workload), with real site
# backends: `meridian-sandbox` starts a Slurm cluster of its own and the EC2 API emulator, the demo's federation
# (configs/demo/federation-sandbox.toml) runs one owned site through Slurm and bursts to an EC2 region, and the
# sandbox reports the Slurm jobs and EC2 calls it saw when it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
sandbox=$(mktemp -d "${TMPDIR:-/tmp}/meridian-sandbox-XXXXXX")
target/debug/meridian-sandbox "$sandbox/run" &
sandbox_pid=$!
stop_sandbox() {
  if kill -0 "$sandbox_pid" 2>/dev/null; then
    kill -TERM "$sandbox_pid" 2>/dev/null || true
    wait "$sandbox_pid" || true
  fi
  rm -rf "$sandbox"
}
trap stop_sandbox EXIT
for _ in $(seq 1 600); do
  [ -f "$sandbox/run/env" ] && break
  kill -0 "$sandbox_pid" 2>/dev/null || break
  sleep 0.1
done
if [ ! -f "$sandbox/run/env" ]; then
  # Slurm's daemons need root (and Debian's packages); without them the demo runs its plain federation.
  echo "the sandbox (Slurm cluster, EC2 emulator) did not start; running the demo's plain federation instead" >&2
  stop_sandbox
  trap - EXIT
  exec target/debug/meridian demo "$@"
fi
set -a
# shellcheck disable=SC1091
. "$sandbox/run/env"
set +a
status=0
target/debug/meridian demo --federation configs/demo/federation-sandbox.toml "$@" || status=$?
stop_sandbox
trap - EXIT
exit "$status"
