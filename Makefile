# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: test lint check setup build

# Everything the tests need (fakepve in .venv), then every test. fakepve is required here, so a missing
# fake fails the run instead of silently skipping the end-to-end tests.
test: setup
	REQUIRE_FAKEPVE=1 cargo test --all-targets --locked

setup:
	scripts/setup-test-env.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets --locked -- -D warnings

check: lint test

build:
	cargo build --release --locked
