#!/usr/bin/env bash
# README command 2: formatting, lints and every test, e2e included (real nats-server and binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The pure core on its own: a feature or dependency the broker turns on must not be what makes it build.
cargo check -p meridian-core --quiet
cargo test --workspace 2>&1
