#!/usr/bin/env bash
# The `gates` stage of `make test`: the small suite on the fixture, on a
# fresh server (its chat questions asked again through the OpenAI SDK),
# gated against the committed dense reference record (must pass); the
# committed 2-bit record gated against it too (must fail: the gates bite). Records made by `make gate` (scripts/gate_records.py).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/decisio
RECORDS=$ROOT/runs/2026-12-02_gates
CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
MODEL=${DECISIO_MODEL:-$CACHE/models/smollm2-135m-instruct}
ASSETS=${DECISIO_ASSETS:-$CACHE/assets}
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" serve --model "$MODEL" --served-model-name smollm2 --port "$PORT" --state-dir "$WORK/state" \
  >"$WORK/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
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
echo "[gates] ok"
