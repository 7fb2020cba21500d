# syntax=docker/dockerfile:1
#
# Omni infrastructure provider for Proxmox VE: a release build in a Rust builder, then a runtime image
# holding only the binary and CA certificates, running as a non-root user.
#
#   docker build -t omni-infra-provider-proxmox .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/omni-infra-provider-proxmox .
#
# The entrypoint is the binary, so the official provider's lines work unchanged:
#   docker run -v ./config.yaml:/config.yaml:ro IMAGE \
#     --config-file /config.yaml --omni-api-endpoint https://omni.example --omni-service-account-key KEY
#
# Multi-arch: nothing here names an architecture. Each platform is built natively in its own builder
# stage (buildx with QEMU or a native runner), so no cross toolchain is needed.
#
# Runtime dependencies, checked with `ldd` / `readelf -d` on the built binary (x86_64, glibc):
#   NEEDED libgcc_s.so.1, libm.so.6, libc.so.6, ld-linux-x86-64.so.2; highest symbol version GLIBC_2.34.
# TLS is rustls with the ring provider (no OpenSSL, no libssl/libcrypto); protobuf code is generated at
# build time with protox (no protoc). gcr.io/distroless/cc-debian12 ships exactly glibc 2.36, libgcc_s
# and libm, plus /etc/ssl/certs/ca-certificates.crt (read for the system trust store beside the built-in
# web PKI roots; private CAs go in `caFile` / `--omni-ca-file`). The builder is Debian 12 too, so the
# glibc the binary is linked against is the one the runtime image has.

ARG RUST_VERSION=1

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# Only what the build reads (see .dockerignore): manifests, build script, protos, schema, icon, code.
# `testkit` is the workspace's test crate: Cargo reads its manifest, the image never builds it.
COPY Cargo.toml Cargo.lock build.rs ./
COPY testkit ./testkit
COPY proto ./proto
COPY schema ./schema
COPY assets ./assets
COPY src ./src
# Cache mounts keep the registry and the target directory between builds; the binary is copied out
# of the cached target directory because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin omni-infra-provider-proxmox \
    && install -D -m 0755 target/release/omni-infra-provider-proxmox /out/omni-infra-provider-proxmox

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="omni-infra-provider-proxmox" \
      org.opencontainers.image.description="Omni infrastructure provider for Proxmox VE: turns Omni MachineRequests into Talos VMs" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=builder /out/omni-infra-provider-proxmox /omni-infra-provider-proxmox
# distroless `nonroot`: uid/gid 65532, no shell, no package manager.
USER 65532:65532
ENTRYPOINT ["/omni-infra-provider-proxmox"]
