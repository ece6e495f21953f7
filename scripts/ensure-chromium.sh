#!/usr/bin/env bash
# Called by `make test`: the status page is tested in Debian's headless Chromium driven by
# chromedriver. Installs both from Debian's packages when they are missing and this user
# may (root with apt-get); otherwise the browser test says it is skipped.
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium and chromium-driver for the status page test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  exit $?
fi
if [ "${OUTBOX_REQUIRE_BROWSER_TESTS:-}" = 1 ]; then
  echo "error: chromium and chromedriver are missing and cannot be installed here" >&2
  exit 1
fi
echo "note: chromium/chromedriver missing; the browser test will be skipped" >&2
