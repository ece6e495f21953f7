#!/usr/bin/env bash
# Called by `make test`: the status page is tested in Debian's headless Chromium driven by
# chromedriver. Installs both from Debian's packages when they are missing and this user
# may (root with apt-get); otherwise fails, unless OUTBOX_SKIP_SERVER_TESTS=1 skips the
# browser tests with the server-backed ones.
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium and chromium-driver for the status page test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  exit $?
fi
if [ "${OUTBOX_SKIP_SERVER_TESTS:-}" = 1 ]; then
  echo "note: chromium/chromedriver missing; OUTBOX_SKIP_SERVER_TESTS=1 skips the browser tests" >&2
  exit 0
fi
echo "error: chromium and chromedriver are missing and cannot be installed here (OUTBOX_SKIP_SERVER_TESTS=1 skips the browser tests)" >&2
exit 1
