# Multi-stage: the Rust toolchain and cmake stay in the build stage; the runtime image holds two
# binaries and runs them as an unprivileged user.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin ratelimit-proxy --example demo_upstream

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home ratelimit
COPY --from=build /src/target/release/ratelimit-proxy /usr/local/bin/ratelimit-proxy
COPY --from=build /src/target/release/examples/demo_upstream /usr/local/bin/demo_upstream
USER ratelimit
EXPOSE 8080 9090
ENTRYPOINT ["ratelimit-proxy"]
CMD ["--config", "/etc/ratelimit-proxy/routes-compose.yaml"]
