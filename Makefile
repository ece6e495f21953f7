# outbox-host tasks. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
BIN := $(TARGET_DIR)/debug/outbox-host
WASM_TARGET_DIR := $(TARGET_DIR)/wasm-plugins
DEMO := -c examples/outbox.yaml

.PHONY: help run test plugins build lint fmt verify-migrations toolchain bench

help: ## List the tasks
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

toolchain: ## Install the pinned toolchain's wasm32-wasip2 target (rustup reads rust-toolchain.toml)
	@rustup target add wasm32-wasip2 >/dev/null

plugins: toolchain ## Build the sink plugins into target/plugins/ (fake_sink.wasm, tencent_im_sink.wasm)
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
	@mkdir -p target/plugins
	@cp $(WASM_TARGET_DIR)/wasm32-wasip2/release/fake_sink.wasm $(WASM_TARGET_DIR)/wasm32-wasip2/release/tencent_im_sink.wasm target/plugins/
	@ls -l target/plugins/*.wasm

build: ## Build the outbox-host binary
	cargo build -p outbox-host --bin outbox-host

run: plugins build ## Start the host on SQLite with the fake sink, after enqueueing a few demo events
	$(BIN) $(DEMO) enqueue -t RoomUserJoined -r room-1 -b '{"user_id":"u-1","nickname":"Ada"}'
	$(BIN) $(DEMO) enqueue -t RoomGiftSent -r room-1 -b '{"sender_user_id":"u-1","receiver_user_id":"u-2","gift_id":"rose","gift_count":3,"total_value":30}' -n 3
	$(BIN) $(DEMO) enqueue -t RoomHeatChanged -r room-1 -b '{"heat":1200}'
	$(BIN) $(DEMO) status
	@echo "--- delivering; Ctrl-C drains and stops (run 'make run' again or '$(BIN) $(DEMO) enqueue ...' for more)"
	$(BIN) $(DEMO) run

test: toolchain ## Run the whole test suite (starts PostgreSQL and MariaDB, installs Chromium, when needed)
	scripts/ensure-chromium.sh
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo test --manifest-path plugins/Cargo.toml
	source scripts/test-databases.sh && cargo test --workspace

bench: plugins ## Benchmark on release builds: SQLite, plus PostgreSQL and MariaDB when reachable (BENCH_ARGS=--help)
	cargo build --release -p outbox-host -p outbox-bench
	source scripts/test-databases.sh && $(TARGET_DIR)/release/outbox-bench --json target/bench/latest.json $(BENCH_ARGS)

lint: toolchain ## cargo fmt --check and clippy with warnings as errors (host and plugins)
	cargo fmt --all -- --check
	cargo fmt --all --manifest-path plugins/Cargo.toml -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	CARGO_TARGET_DIR=$(WASM_TARGET_DIR) cargo clippy --manifest-path plugins/Cargo.toml --all-targets -- -D warnings

fmt: ## Format the code
	cargo fmt --all
	cargo fmt --all --manifest-path plugins/Cargo.toml

verify-migrations: ## Check that migrations/{sqlite,postgres,mysql} have the same versions
	cargo test -p outbox-host --lib store::migrate
