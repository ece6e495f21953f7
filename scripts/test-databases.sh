#!/usr/bin/env bash
# Sourced by `make test`: makes sure the local PostgreSQL and MariaDB servers run, clears
# schemas and databases left by earlier test runs (those created over 6 hours ago, so that a
# run still going beside this one keeps its own), and exports TEST_POSTGRES_URL and
# TEST_MYSQL_URL for the server-backed suites. A server that cannot be started is an error,
# unless OUTBOX_SKIP_SERVER_TESTS=1 (a laptop without them), which skips those tests.

: "${TEST_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432/test}"
: "${TEST_MYSQL_URL:=mysql://root@127.0.0.1:3306/test}"

outbox_db_missing() {
  if [ "${OUTBOX_SKIP_SERVER_TESTS:-}" = 1 ]; then
    echo "note: $1 is not available; OUTBOX_SKIP_SERVER_TESTS=1 skips its tests" >&2
    return 0
  fi
  echo "error: $1 is not available and could not be started (OUTBOX_SKIP_SERVER_TESTS=1 skips its tests)" >&2
  return 1
}

outbox_wait() { # tries "$@" for up to 30 seconds
  for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}

# A SQL condition on the name column $1 (the same in PostgreSQL and MariaDB): a test's
# database, schema, role or user created over outbox_stale_after seconds ago, or named before
# names carried their creation time (tests/src/db.rs names them). 6 hours: longer than any
# run of the tests or the soak.
outbox_stale_after=21600
outbox_stale() {
  local created="SUBSTRING($1 FROM 10 FOR 10)"
  echo "$1 LIKE 'outbox\\_t\\_%' AND ($1 NOT LIKE 'outbox\\_t\\_1_________\\_%' OR $created < '$(( $(date +%s) - outbox_stale_after ))')"
}

outbox_postgres() {
  command -v psql >/dev/null || return 1
  local ready=(psql "$TEST_POSTGRES_URL" -Atqc 'SELECT 1')
  if ! "${ready[@]}" >/dev/null 2>&1 && command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >/dev/null 2>&1 || true
  fi
  outbox_wait "${ready[@]}" || return 1
  # Schemas of earlier runs (each test makes one named outbox_t_<unix seconds>_<random>).
  psql "$TEST_POSTGRES_URL" -Atqc "SELECT 'DROP SCHEMA ' || nspname || ' CASCADE;' FROM pg_namespace WHERE $(outbox_stale nspname)" \
    | PGOPTIONS='-c client_min_messages=warning' psql "$TEST_POSTGRES_URL" -q >/dev/null
  # Roles of the privilege tests (outbox_t_..._app).
  psql "$TEST_POSTGRES_URL" -Atqc "SELECT 'DROP OWNED BY ' || rolname || '; DROP ROLE ' || rolname || ';' FROM pg_roles WHERE $(outbox_stale rolname)" \
    | PGOPTIONS='-c client_min_messages=warning' psql "$TEST_POSTGRES_URL" -q >/dev/null
}

outbox_mysql() {
  command -v mariadb >/dev/null || command -v mysql >/dev/null || return 1
  local client; client=$(command -v mariadb || command -v mysql)
  local ready=("$client" -h 127.0.0.1 -P 3306 -uroot -e 'SELECT 1')
  if ! "${ready[@]}" >/dev/null 2>&1 && [ -x /usr/sbin/mariadbd ]; then
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >/dev/null 2>&1 || true
  fi
  outbox_wait "${ready[@]}" || return 1
  "$client" -h 127.0.0.1 -uroot -N -e "SELECT CONCAT('DROP DATABASE ', schema_name, ';') FROM information_schema.schemata WHERE $(outbox_stale schema_name)" \
    | "$client" -h 127.0.0.1 -uroot
  # Users of the privilege tests.
  "$client" -h 127.0.0.1 -uroot -N -e "SELECT CONCAT('DROP USER ', QUOTE(user), '@', QUOTE(host), ';') FROM mysql.user WHERE $(outbox_stale user)" \
    | "$client" -h 127.0.0.1 -uroot
}

if outbox_postgres; then export TEST_POSTGRES_URL; else unset TEST_POSTGRES_URL; outbox_db_missing PostgreSQL || return 1 2>/dev/null || exit 1; fi
if outbox_mysql; then export TEST_MYSQL_URL; else unset TEST_MYSQL_URL; outbox_db_missing MariaDB/MySQL || return 1 2>/dev/null || exit 1; fi
