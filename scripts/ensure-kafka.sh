#!/usr/bin/env bash
# Called by `make test` and `make bench`: the Kafka relay is tested against tansu, a
# Kafka-protocol broker written in Rust (decision 0211), which each test starts on a port
# and a SQLite file of its own. Installs it from crates.io with cargo when it is missing
# (about 12 minutes on two cores, once: it is kept in ~/.cache/tansu); prints its path.
set -euo pipefail
version=0.6.0
root="${TANSU_ROOT:-${HOME:-/root}/.cache/tansu}"
binary="$root/bin/tansu"
if [ -x "$binary" ] && [ "$(cat "$root/version" 2>/dev/null)" = "$version" ]; then
  echo "$binary"
  exit 0
fi
echo "installing tansu $version (a Kafka-protocol broker) into $root for the Kafka relay tests" >&2
mkdir -p "$root"
# Outside the project: its toolchain file and target directory are not tansu's.
cd "$root"
CARGO_TARGET_DIR="$root/target" cargo install --quiet --locked "tansu@$version" \
  --no-default-features --features dynostore,libsql --root "$root" >&2
echo "$version" > "$root/version"
echo "$binary"
