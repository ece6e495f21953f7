# outbox-host tasks. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
BIN := $(TARGET_DIR)/debug/outbox-host
WASM_TARGET_DIR := $(TARGET_DIR)/wasm-plugins
DEMO := -c examples/outbox.yaml

.PHONY: help run test plugins build lint fmt verify-migrations toolchain bench sink-component soak soak-short dist

help: ## List the tasks
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

toolchain: ## Install the pinned toolchain's wasm32-wasip2 target (rustup reads rust-toolchain.toml)
	@rustup target add wasm32-wasip2 >/dev/null

plugins: toolchain ## Build the sink plugins into target/plugins/ (fake_sink.wasm, tencent_im_sink.wasm, webhook_sink.wasm, relay.wasm)
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
	@mkdir -p target/plugins
	@cp $(addprefix $(WASM_TARGET_DIR)/wasm32-wasip2/release/,fake_sink.wasm tencent_im_sink.wasm webhook_sink.wasm relay.wasm) target/plugins/
	@ls -l target/plugins/*.wasm

sink-component: build ## Check that `cargo component build` makes a sink the host loads (needs cargo-component)
	@if ! cargo component --version >/dev/null 2>&1; then \
	  echo "cargo-component is not installed; install it with: cargo install cargo-component --locked (about 12 minutes)"; \
	  echo "then run 'make sink-component' again. (cargo build --release --target wasm32-wasip2 needs nothing more.)"; \
	  exit 0; \
	fi; \
	set -e; dir=$(TARGET_DIR)/sink-component; rm -rf $$dir; \
	$(BIN) new-sink component-check --dir $$dir; \
	(cd $$dir && env -u CARGO_TARGET_DIR cargo component build --release); \
	$(BIN) try-sink --plugin $$dir/target/wasm32-wasip1/release/component_check.wasm \
	  --set url=https://example.com/events --allow-host example.com \
	  -t RoomHeatChanged -r room-1 -b '{"heat":1}' --dry-run --reply 202

build: ## Build the outbox-host binary
	cargo build -p outbox-host --bin outbox-host

run: plugins build ## Start the host on SQLite with the fake sink, after enqueueing a few demo events
	$(BIN) $(DEMO) enqueue -t RoomUserJoined -r room-1 -b '{"user_id":"u-1","nickname":"Ada"}'
	$(BIN) $(DEMO) enqueue -t RoomGiftSent -r room-1 -b '{"sender_user_id":"u-1","receiver_user_id":"u-2","gift_id":"rose","gift_count":3,"total_value":30}' -n 3
	$(BIN) $(DEMO) enqueue -t RoomHeatChanged -r room-1 -b '{"heat":1200}'
	$(BIN) $(DEMO) status
	@echo "--- delivering; Ctrl-C drains and stops (run 'make run' again or '$(BIN) $(DEMO) enqueue ...' for more)"
	$(BIN) $(DEMO) run

test: toolchain ## Run the whole test suite (starts PostgreSQL and MariaDB, installs Chromium, faketime and tansu, a Kafka-protocol broker, when needed)
	scripts/ensure-chromium.sh
	scripts/ensure-faketime.sh
	scripts/ensure-kafka.sh >/dev/null
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo test --manifest-path plugins/Cargo.toml
	source scripts/test-databases.sh && cargo test --workspace

bench: plugins ## Benchmark on release builds: SQLite, plus PostgreSQL and MariaDB when reachable (BENCH_ARGS=--help)
	scripts/ensure-kafka.sh >/dev/null
	cargo build --release -p outbox-host -p outbox-bench
	{ source scripts/test-databases.sh || true; } && $(TARGET_DIR)/release/outbox-bench --json target/bench/latest.json $(BENCH_ARGS)

soak: plugins ## The soak: 4 hosts, 2 then 3 sinks, 100,000 events on PostgreSQL and MariaDB under kills, a cut, a reload, a purge and a replay (SOAK_ARGS=--help); the kill storm, five runs per server (STORM_RUNS=N); then 500 fault-harness schedules per database (FAULT_SCHEDULES=N)
	cargo build --release -p outbox-host -p outbox-bench
	source scripts/test-databases.sh && $(TARGET_DIR)/release/outbox-soak $(SOAK_ARGS)
	source scripts/test-databases.sh && $(TARGET_DIR)/release/outbox-soak --storm --runs $(or $(STORM_RUNS),5)
	source scripts/test-databases.sh && OUTBOX_FAULT_SCHEDULES=$(or $(FAULT_SCHEDULES),500) cargo test -p outbox-host --test e2e -- faults --nocapture

soak-short: plugins ## The soak's short version, on the debug build, one kill storm per server, then 200 fault-harness schedules per database (what CI runs)
	cargo build -p outbox-host -p outbox-bench --bin outbox-host --bin outbox-soak
	source scripts/test-databases.sh && $(TARGET_DIR)/debug/outbox-soak --events 6000 --rate 600 --rooms 200 --drain-seconds 300 $(SOAK_ARGS)
	source scripts/test-databases.sh && $(TARGET_DIR)/debug/outbox-soak --storm --runs 1 --drain-seconds 300
	source scripts/test-databases.sh && OUTBOX_FAULT_SCHEDULES=$(or $(FAULT_SCHEDULES),200) cargo test -p outbox-host --test e2e -- faults --nocapture

dist: plugins ## Pack a release tarball into dist/: the release binary, the three sinks, examples, deploy/ (with a systemd unit), docs
	cargo build --release -p outbox-host --bin outbox-host
	scripts/dist.sh

lint: toolchain ## cargo fmt --check and clippy with warnings as errors (host and plugins)
	cargo fmt --all -- --check
	cargo fmt --all --manifest-path plugins/Cargo.toml -- --check
	cargo fmt --manifest-path plugins/template/Cargo.toml -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo clippy --manifest-path plugins/Cargo.toml --all-targets -- -D warnings

fmt: ## Format the code
	cargo fmt --all
	cargo fmt --all --manifest-path plugins/Cargo.toml
	cargo fmt --manifest-path plugins/template/Cargo.toml

verify-migrations: ## Check that migrations/{sqlite,postgres,mysql} have the same versions
	cargo test -p outbox-host --lib store::migrate
