#!/usr/bin/env bash
# Packs a release: dist/outbox-host-<version>-<arch>-linux.tar.gz holding bin/outbox-host,
# the three sinks and the default relay (sinks/*.wasm), examples/, deploy/ (with the systemd unit), wit/, docs/,
# README.md, CHANGELOG.md, and outbox.yaml (the demo config, its plugin under sinks/).
# `make dist` builds the release binary and the sinks first. PROFILE=debug packs the debug
# build instead, and PLUGINS=DIR takes the sinks from DIR (the test that unpacks a tarball
# uses both, to spare a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${PROFILE:-release}"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
out="${DIST_DIR:-$PWD/dist}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name="outbox-host-${version}-$(uname -m)-linux"
bin="$target_dir/$profile/outbox-host"
plugins="${PLUGINS:-target/plugins}"
for needed in "$bin" "$plugins"/fake_sink.wasm "$plugins"/tencent_im_sink.wasm "$plugins"/webhook_sink.wasm "$plugins"/relay.wasm; do
  [ -f "$needed" ] || { echo "error: $needed is missing (make dist builds it)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
mkdir -p "$root/bin" "$root/sinks"
cp "$bin" "$root/bin/"
cp "$plugins"/fake_sink.wasm "$plugins"/tencent_im_sink.wasm "$plugins"/webhook_sink.wasm "$plugins"/relay.wasm "$root/sinks/"
cp -r examples deploy wit docs "$root/"
cp README.md CHANGELOG.md "$root/"
sed 's#target/plugins/#sinks/#' examples/outbox.yaml > "$root/outbox.yaml"
mkdir -p "$out"
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
