#!/usr/bin/env bash
# Called by `make test`: the lease test runs a host whose clock is a minute ahead under
# libfaketime. Installs Debian's faketime when it is missing and this user may (root with
# apt-get); otherwise that test fails, saying faketime is missing.
if command -v faketime >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing faketime for the clock-skew lease test" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null
  fi
  exit $?
fi
echo "error: faketime is missing and cannot be installed here (apt-get install faketime)" >&2
exit 1
