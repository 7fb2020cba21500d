# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: test lint check setup build image-check demo sandbox bench soak chaos audit

# Everything the tests need (fakepve in .venv), then every test of the workspace (the provider and
# testkit, its test crate). A test that needs fakepve and cannot find it fails.
test: setup
	cargo test --workspace --lib --bins --tests --locked

setup:
	scripts/setup-test-env.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

check: lint test

# Advisory: Cargo.lock against the RustSec database (docs/security.md); never fails for lack of network.
audit:
	scripts/audit.sh

build:
	cargo build --release --locked

# The release binary the image ships, run in a root file system holding only what the image's base
# holds, as its non-root user (tests/runtime_image.rs; `make test` runs it on the debug binary).
image-check: setup build
	PROVIDER_BINARY=target/release/omni-infra-provider-proxmox cargo test --locked --test runtime_image

# The provider doing its job against a fake 3-node Proxmox and an in-memory Omni (debug build: it
# reuses what `make test` compiled).
demo: setup
	cargo build --bins --examples --locked
	target/debug/examples/demo

# A fake 4-node Proxmox VE cluster and an in-memory Omni to try the commands on, with
# examples/config.yaml pointed at it in tmp/sandbox; runs until Ctrl-C.
sandbox: setup
	cargo build --bins --examples --locked
	target/debug/examples/sandbox tmp/sandbox

# Benchmark report against the design targets (release build).
bench: setup
	cargo build --release --bins --examples --locked
	target/release/examples/bench

# Churn soak: SOAK_MACHINES (50) machines created and torn down in a loop for SOAK_SECS (600)
# seconds; fails if memory or file descriptors grew, requests slowed down, or anything was left.
soak: setup
	cargo build --release --bins --examples --locked
	target/release/examples/soak

# Chaos runs (docs/chaos.md): machines provisioned and torn down while a seeded schedule kills the
# provider and breaks Proxmox and Omni; three seeds in a row with one provider, then two with two
# replicas whose leader is killed and cut off; or `make chaos SEED=N [REPLICAS=2]` to replay one.
chaos: setup
	cargo build --release --bins --examples --locked
	$(if $(SEED),target/release/examples/chaos --seed $(SEED) $(if $(REPLICAS),--replicas $(REPLICAS)),target/release/examples/chaos --runs 3 && target/release/examples/chaos --runs 2 --replicas 2)
