# tollgate container image.
#
#   docker build -t tollgate .
#   docker run --rm -p 8080:8080 -p 9090:9090 \
#     -v "$PWD/gateway.yaml:/etc/tollgate/gateway.yaml:ro" tollgate
#
# The configuration is read from /etc/tollgate/gateway.yaml (mount yours
# there; the image ships the quick-start file). The proxy listens on
# 0.0.0.0:8080 and the admin listener (/metrics, /healthz, /readyz,
# /admin/top) on 0.0.0.0:9090: the command line overrides the file's
# `listen` and `admin`, which usually name loopback addresses. Reload the
# configuration with `docker kill --signal HUP <container>`. The health
# check is `tollgate health --ready`; compose.yaml runs a fleet with Redis.

# ---- build: the release binary, with the locked dependency set ----
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin tollgate \
    && install -D -m 0755 target/release/tollgate /out/tollgate

# ---- run: a slim Debian with only the binary, as a non-root user ----
FROM debian:bookworm-slim
# CA roots for https upstreams. Not pinned (DL3008): the package follows
# Debian's security updates, and a pinned version disappears from the
# mirrors when it is superseded, which would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tollgate
COPY --from=build /out/tollgate /usr/local/bin/tollgate
COPY gateway.yaml /etc/tollgate/gateway.yaml
USER 10001:10001
EXPOSE 8080 9090
# The image has no curl: the binary asks its own admin listener's /readyz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/tollgate", "health", "--ready"]
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["--config", "/etc/tollgate/gateway.yaml", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:9090", "--log-format", "json"]
