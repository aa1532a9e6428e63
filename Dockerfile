# The `spillway` binary alone, on a small glibc base, as a non-root user.
#
#   docker build -t spillway:0.1.0 .
#   docker run --rm -p 8080:8080 -v "$PWD/examples:/etc/spillway:ro" spillway:0.1.0 \
#     serve --config /etc/spillway/spillway.yaml --listen 0.0.0.0:8080
#
# The binary links glibc (libc, libm, libgcc_s), so a static base (scratch, distroless/static) or a
# musl one (Alpine) cannot run it: distroless/cc has exactly those libraries and nothing else (no
# shell, no package manager). Build and publish: docs/deploy.md.

# The toolchain the workspace declares (rust-version); the dependencies come from Cargo.lock.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cached between builds when BuildKit is on (the registry and the target directory); the binary
# is copied out of the cache mount so that the next stage can take it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spillway \
    && cp target/release/spillway /usr/local/bin/spillway

# Debian 12 as the build stage, so the glibc the binary was linked against is the one it runs on.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/spillway /usr/local/bin/spillway
# distroless's `nonroot`, the uid and gid deploy/kubernetes runs the pods as.
USER 65532:65532
# The manifests' ports: the public listener (`listen`), the endpoint picker's gRPC
# (`endpoint_picker.listen`) and the admin API with /metrics (`admin.listen`).
EXPOSE 8080 9002 9090
ENTRYPOINT ["/usr/local/bin/spillway"]
# The ConfigMap is mounted at /etc/spillway; a container without it needs its own file there.
CMD ["serve", "--config", "/etc/spillway/spillway.yaml"]
