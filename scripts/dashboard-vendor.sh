#!/usr/bin/env bash
# Refreshes the dashboard's vendored assets from the npm registry: the world's country outlines (world-atlas,
# Natural Earth 1:110m) and the TopoJSON decoder (topojson-client). They are committed in this built form and
# embedded in the broker's binary, so no npm or bundler runs at build time; run this only to change versions.
set -euo pipefail
cd "$(dirname "$0")/.."
out=broker/src/service/dashboard/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent world-atlas@2.0.2 topojson-client@3.1.0 >/dev/null)
tar xzf "$tmp"/world-atlas-2.0.2.tgz -C "$tmp" package/countries-110m.json package/LICENSE
cp "$tmp"/package/countries-110m.json "$out"/
tar xzf "$tmp"/topojson-client-3.1.0.tgz -C "$tmp" package/dist/topojson-client.min.js
cp "$tmp"/package/dist/topojson-client.min.js "$out"/
echo "refreshed $out"
