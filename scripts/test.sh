#!/usr/bin/env bash
# `make test`: sets everything up, then runs every test, timing each stage.
#
# Stages: layers (the floors of src/: no import circle, no import up a
# floor, no file over 700 lines: scripts/check_layers.py), setup (scripts/setup.sh), reference (the Python reference figures,
# computed once per input: scripts/reference/cache.py), rust (the test
# binaries built and run side by side: scripts/test_binaries.py), targets
# (the compile checks of macOS and aarch64 Linux: scripts/check-targets.sh), e2e (the
# OpenAI SDK tests, and tests/tools: the scripts' own tests; run beside a
# server that holds the default state folder and port 8000, as `make serve`
# does, so that every server a test or benchmark starts must take a state
# folder and a port of its own), gates (the
# small suite on the fixture gated against the committed reference record:
# scripts/ci_gates.sh). At the end, pass or fail, it prints each stage's time;
# with DECISIO_STAGE_TIMES=FILE it also writes them there as JSON (and the
# Rust binaries' own figures beside it), for scripts/ci_time.py.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export DECISIO_CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
PYTHON=$DECISIO_CACHE/venv/bin/python
TIMES=${DECISIO_STAGE_TIMES:-}
STAGES=()
SECONDS_OF=()
STATUS=()
failed=0

stage() {
  local name=$1; shift
  local t0 t1 rc
  echo "[test] stage $name"
  t0=$(date +%s.%N)
  "$@"
  rc=$?
  t1=$(date +%s.%N)
  STAGES+=("$name")
  SECONDS_OF+=("$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")")
  STATUS+=("$rc")
  [ "$rc" = 0 ] || failed=1
  return "$rc"
}

report() {
  local total=0 i json="" sep=""
  echo
  echo "[test] time of each stage:"
  for i in "${!STAGES[@]}"; do
    printf '  %-10s %8.1f s  %s\n' "${STAGES[$i]}" "${SECONDS_OF[$i]}" \
      "$([ "${STATUS[$i]}" = 0 ] && echo ok || echo "FAILED (${STATUS[$i]})")"
    total=$(awk "BEGIN{printf \"%.1f\", $total + ${SECONDS_OF[$i]}}")
    json+="$sep{\"stage\": \"${STAGES[$i]}\", \"seconds\": ${SECONDS_OF[$i]}, \"exit\": ${STATUS[$i]}}"
    sep=", "
  done
  printf '  %-10s %8.1f s\n' total "$total"
  if [ -n "$TIMES" ]; then
    mkdir -p "$(dirname "$TIMES")"
    echo "{\"stages\": [$json], \"total_s\": $total}" > "$TIMES"
  fi
}

# A server as `make serve` starts it (scripts/serve-demo.sh, less its
# demonstration): the default state folder, port 8000. Skipped, saying so,
# when port 8000 is taken; the stage then runs beside whatever holds it.
HOLDER=""
HOLDER_LOG=""
hold_defaults() {
  local model=${DECISIO_MODEL:-$DECISIO_CACHE/models/smollm2-135m-instruct}
  if ! python3 -c 'import socket; socket.socket().bind(("127.0.0.1", 8000))' 2>/dev/null; then
    echo "[test] port 8000 is taken on this machine: the e2e stage runs without a server of its own on the defaults"
    return 0
  fi
  HOLDER_LOG=$(mktemp)
  "$ROOT/target/release/decisio" serve --model "$model" --served-model-name smollm2 --port 8000 \
    >"$HOLDER_LOG" 2>&1 &
  HOLDER=$!
  for _ in $(seq 1 600); do
    if curl -sf http://127.0.0.1:8000/health >/dev/null; then
      echo "[test] a server holds the default state folder and port 8000 (pid $HOLDER), as \`make serve\` would, during the e2e stage"
      return 0
    fi
    if ! kill -0 "$HOLDER" 2>/dev/null; then
      echo "[test] the server on the defaults exited before it was ready; the e2e stage runs without it:"
      tail -n 5 "$HOLDER_LOG"
      HOLDER=""
      return 0
    fi
    sleep 0.2
  done
  echo "[test] the server on the defaults was not ready within 120 s; the e2e stage runs without it"
  release_defaults
}
release_defaults() {
  if [ -n "$HOLDER" ]; then
    kill "$HOLDER" 2>/dev/null
    wait "$HOLDER" 2>/dev/null
    echo "[test] the server on the defaults (pid $HOLDER) stopped"
    HOLDER=""
  fi
  [ -n "$HOLDER_LOG" ] && rm -f "$HOLDER_LOG"
  HOLDER_LOG=""
}
trap 'release_defaults; report' EXIT

stage layers python3 scripts/check_layers.py
stage setup bash scripts/setup.sh || exit 1
stage reference make --no-print-directory reference-cached || exit 1
rust_json=()
[ -n "$TIMES" ] && rust_json=(--json "${TIMES%.json}.rust.json")
stage rust python3 scripts/test_binaries.py "${rust_json[@]}"
stage targets bash scripts/check-targets.sh
hold_defaults
stage e2e "$PYTHON" -m pytest -q -p no:cacheprovider --durations=12 tests/e2e tests/tools
release_defaults
stage gates bash scripts/ci_gates.sh
exit $failed
