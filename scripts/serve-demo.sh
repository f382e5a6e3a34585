#!/usr/bin/env bash
# `make serve`: starts decisio on the default model, waits until it is
# healthy, shows a real answer, then keeps serving until interrupted.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${1:-8000}
MODEL=${DECISIO_MODEL:-${DECISIO_CACHE:-$HOME/.cache/decisio}/models/smollm2-135m-instruct}
"$ROOT/target/release/decisio" serve --model "$MODEL" --served-model-name smollm2 --port "$PORT" &
PID=$!
trap 'kill $PID 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $PID 2>/dev/null || { echo "decisio exited before it was ready" >&2; exit 1; }
  sleep 0.2
done
echo
echo "$ curl http://127.0.0.1:$PORT/v1/chat/completions -d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], \"max_tokens\": 24, \"temperature\": 0}'"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 24, "temperature": 0}'
echo
echo
echo "decisio is serving smollm2 on http://127.0.0.1:$PORT/v1 (Ctrl-C stops it)"
wait $PID
