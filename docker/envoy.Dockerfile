# Envoy 1.40 with the kvroute filter at /etc/envoy/kvroute_filter.wasm (the path
# docker/envoy.yaml loads). The bootstrap itself is mounted by docker-compose.yml.
#
#   docker build -f docker/envoy.Dockerfile -t kvroute-envoy:dev .
FROM rust:1-bookworm AS wasm
RUN rustup target add wasm32-wasip1
WORKDIR /src
COPY . .
RUN ./wasm-build.sh

FROM envoyproxy/envoy:v1.40-latest
COPY --from=wasm /src/target/wasm32-wasip1/release/kvroute_filter.wasm /etc/envoy/kvroute_filter.wasm
