# syntax=docker/dockerfile:1
#
# Floe binaries on Debian 12. Build from the repository root:
#   docker build -t floe .
# The runtime image holds floe (the jobs), floe-catalog and floe-maintenance; the default
# entrypoint is the catalog (compose overrides it for the jobs).

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry, git checkouts and target/ live in BuildKit cache mounts, so rebuilds reuse
# downloaded crates and compiled dependencies. A cache mount is not part of the image, so
# the binaries are copied out of target/ inside the same RUN.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bins \
    && install -D -m 0755 target/release/floe-catalog /out/floe-catalog \
    && install -D -m 0755 target/release/floe /out/floe \
    && install -D -m 0755 target/release/floe-maintenance /out/floe-maintenance

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/floe --create-home floe
COPY --from=builder /out/ /usr/local/bin/
USER floe
WORKDIR /var/lib/floe
EXPOSE 8181
# bash's /dev/tcp keeps curl out of the image; the probe expects the default port 8181.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=5 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8181 && printf 'GET /healthz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["floe-catalog"]
# Listening on a non-loopback address without auth is refused: configure auth
# (FLOE_CATALOG_TOKENS / FLOE_CATALOG_CLIENTS or a --config file) or pass --allow-anonymous.
CMD ["--listen", "0.0.0.0:8181", "--warehouse", "file:///var/lib/floe/warehouse", "--store", "sqlite:///var/lib/floe/catalog.db"]
