# syntax=docker/dockerfile:1
# Multi-stage: the Rust toolchain and cmake (Pingora's build needs it) stay in the build stage; the
# runtime image holds two binaries, the proxy and the demo upstream, run as an unprivileged user.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole tree, less what .dockerignore leaves out: Cargo.toml may name targets anywhere (benches/,
# examples/), and cargo will not start when one of their files is missing.
COPY . .
# The registry and target/ are cache mounts, so a rebuild compiles only what changed. They are not
# part of the image: the binaries are copied out in the same step, without their debug info (the
# release profile keeps it for callgrind: 71 MB against 13 MB; symbols stay, for backtraces).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ratelimit-proxy --example demo_upstream \
 && mkdir /out \
 && strip --strip-debug -o /out/ratelimit-proxy target/release/ratelimit-proxy \
 && strip --strip-debug -o /out/demo_upstream target/release/examples/demo_upstream

# The binaries link only glibc and libgcc, both in the slim image; ca-certificates is the system
# trust store that rediss:// and https:// upstreams verify against by default.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 ratelimit \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin ratelimit
COPY --from=build /out/ratelimit-proxy /out/demo_upstream /usr/local/bin/
# Numeric, so an orchestrator can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["ratelimit-proxy"]
CMD ["--config", "/etc/ratelimit-proxy/routes-compose.yaml"]
