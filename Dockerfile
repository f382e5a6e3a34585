# The decisio gateway on Linux (x86_64). Multi-stage: the build stage runs
# the same MLX-for-Linux recipe as `make setup` (scripts/mlx-linux/setup.sh,
# docs/building.md) and a release build; the run stage holds the binary and
# the MLX CPU library it links. Used by docker-compose.yml, where the gateway
# runs `serve --backend vllm` and needs no MLX at run time, but the binary
# links it all the same, so the image can also serve `--backend mlx`.

FROM rust:1-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake libclang-dev python3 python3-pip build-essential \
 && rm -rf /var/lib/apt/lists/*
# Where scripts/mlx-linux/setup.sh puts MLX's wheel; the binary's run-time
# search path points into it, so the run stage keeps the same path.
ENV DECISIO_CACHE=/opt/decisio
WORKDIR /src
COPY . .
RUN bash scripts/mlx-linux/setup.sh \
 && cargo build --release --locked \
 && cp target/release/decisio /usr/local/bin/decisio

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl libgomp1 libopenblas0-pthread libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/decisio/mlx-linux-0.32.2-sys0.7.0/wheel /opt/decisio/mlx-linux-0.32.2-sys0.7.0/wheel
COPY --from=build /usr/local/bin/decisio /usr/local/bin/decisio
RUN useradd --system --create-home decisio \
 && mkdir -p /var/lib/decisio && chown decisio /var/lib/decisio
USER decisio
EXPOSE 8080
ENTRYPOINT ["decisio"]
CMD ["serve", "--help"]
