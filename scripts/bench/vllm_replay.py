"""A replay upstream in the shapes of vLLM's OpenAI server, for benchmarks.

It stands in for a vLLM server only to measure the gateway's own cost
(`decisio serve --backend vllm` in front of it): it answers at once, with a
constant near-zero latency, so that the gateway's added latency and its
tails can be told apart from the upstream's. It answers nothing real: no
model runs, every completion samples the same token and every log-
probability is made up. Never put it in front of users.

It serves what the gateway sends a vLLM 0.33.0 server of a text-only model
(`src/engine/vllm`), in that version's shapes and texts:

- `GET /health`: 200, empty body.
- `GET /v1/models`: one model card with `max_model_len`.
- `GET /metrics`: `vllm:cache_config_info` of 16-token blocks, prefix
  caching on.
- `POST /tokenize`: a token per character (the gateway does not call it;
  served for completeness of the shape).
- `POST /v1/chat/completions`: 400 "<model> is not a multimodal model", as
  a text-only model answers the start-up probe's image.
- `POST /v1/completions` with token-id prompts: `max_tokens` tokens named
  `token_id:N` (`return_tokens_as_token_ids`), with `logprobs`; the
  log-probabilities of `logprob_token_ids` when named, of
  `allowed_token_ids` normalised over them, else a top-`logprobs` list;
  `echo` puts the prompt first; `usage.prompt_tokens_details.cached_tokens`
  counts as vLLM does: the longest run of whole 16-token blocks of the
  prompt seen before, at most the prompt less its last token. More
  `logprobs` than the cap (20) is refused with vLLM's 400 text, so the
  start-up probe takes the same path as against a vLLM server started with
  `--max-logprobs 20`.

The answer shapes and texts are those of
`tests/fixtures/vllm_contract/logprob_token_ids.json`, each traced there
to its file of vLLM 0.33.0. Answers are built once per distinct request
body and then replayed from memory.

usage: vllm_replay.py PORT [--served-model-name NAME] [--max-model-len N]
"""

import argparse
import http.server
import json
import math
import threading

MAX_LOGPROBS = 20
BLOCK = 16
# Stands for the count of cached tokens in a kept answer; filled per call.
CACHED = -7
PLACEHOLDER = b'"cached_tokens": -7'
# Top-k fillers: ids no option letter uses.
FILLER = list(range(1000, 1000 + MAX_LOGPROBS))
METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_hit_alignment_tokens="None",'
    'enable_prefix_caching="True",engine="0",mamba_cache_mode="none"} 1.0\n'
).encode()


class Replay:
    def __init__(self, model, max_model_len):
        self.model = model
        self.max_model_len = max_model_len
        self.cache = {}
        self.blocks = set()
        self.lock = threading.Lock()
        self.models = json.dumps({"object": "list", "data": [{
            "id": model, "object": "model", "created": 1764547200, "owned_by": "vllm",
            "root": model, "parent": None, "max_model_len": max_model_len,
            "permission": [{
                "id": "modelperm-0", "object": "model_permission", "created": 1764547200,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}]}]}).encode()

    def error(self, status, message, kind, param=None):
        return status, json.dumps({"error": {"message": message, "type": kind,
                                             "param": param, "code": status}}).encode()

    def completion(self, req):
        if req.get("model") != self.model:
            return self.error(404, f"The model `{req.get('model')}` does not exist. "
                                   f"Valid aliases: {self.model}.", "NotFoundError", "model")
        prompt = req.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return self.error(400, "the replay upstream serves token-id prompts only",
                              "BadRequestError", "prompt")
        n = int(req.get("max_tokens") or 0)
        k = req.get("logprobs")
        if k is not None and k > MAX_LOGPROBS:
            return self.error(400, f"Requested sample logprobs of {k}, which is greater than "
                                   f"max allowed: {MAX_LOGPROBS} (parameter=logprobs, value={k})",
                              "BadRequestError", "logprobs")
        if len(prompt) > self.max_model_len:
            return self.error(
                400, f"This model's maximum context length is {self.max_model_len} tokens. "
                     f"However, your prompt contains {len(prompt)} input tokens, which exceeds "
                     "this limit even without any output tokens. Please reduce the length of "
                     f"the input prompt. (parameter=input_tokens, value={len(prompt)})",
                     "BadRequestError", "input_tokens")
        named = req.get("logprob_token_ids")
        allowed = req.get("allowed_token_ids")
        if named:
            token = named[0]
            top = {f"token_id:{t}": -1.0 - 0.25 * i for i, t in enumerate(named)}
        elif allowed:
            token = allowed[0]
            lp = -math.log(len(allowed))
            top = {f"token_id:{t}": lp for t in allowed}
        else:
            token = 13
            top = {f"token_id:{t}": -0.5 - 0.25 * i
                   for i, t in enumerate([token] + FILLER[:max(0, (k or 0) - 1)])}
        lp_token = top[f"token_id:{token}"]
        tokens, token_lps, tops = [], [], []
        if req.get("echo"):
            for i, t in enumerate(prompt):
                tokens.append(f"token_id:{t}")
                token_lps.append(None if i == 0 else -2.0)
                tops.append(None if i == 0 else {f"token_id:{t}": -2.0})
        for _ in range(n):
            tokens.append(f"token_id:{token}")
            token_lps.append(lp_token)
            tops.append(top)
        logprobs = None
        if k is not None:
            logprobs = {"text_offset": list(range(len(tokens))), "token_logprobs": token_lps,
                        "tokens": tokens, "top_logprobs": tops}
        body = {
            "id": "cmpl-replay", "object": "text_completion", "created": 1764547201,
            "model": self.model,
            "choices": [{"index": 0, "text": "", "logprobs": logprobs,
                         "finish_reason": "length", "stop_reason": None, "token_ids": None,
                         "prompt_logprobs": None, "prompt_token_ids": None,
                         "routed_experts": None, "weight_versions": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n,
                      "completion_tokens": n,
                      "prompt_tokens_details": {"cached_tokens": CACHED,
                                                "created_cache_tokens": None,
                                                "multimodal_tokens": None},
                      "completion_tokens_details": None},
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        return 200, json.dumps(body).encode()

    def cached(self, prompt, skip):
        """What vLLM reports cached of a prompt: the whole blocks found, at most
        the prompt less its last token; none for prompt log-probabilities
        (`skip`: `skip_reading_prefix_cache`). The prompt's blocks are kept."""
        keys = [tuple(prompt[:end]) for end in range(BLOCK, len(prompt) + 1, BLOCK)]
        with self.lock:
            hit = 0
            if not skip:
                for key in keys[:(len(prompt) - 1) // BLOCK]:
                    if key not in self.blocks:
                        break
                    hit += BLOCK
            if len(self.blocks) < 100_000:
                self.blocks.update(keys)
        return hit

    def tokenize(self, req):
        ids = [ord(c) % 49152 for c in req.get("prompt", "")]
        return 200, json.dumps({"count": len(ids), "max_model_len": self.max_model_len,
                                "tokens": ids, "token_strs": None}).encode()

    def answer(self, path, raw):
        key = (path, raw)
        kept = self.cache.get(key)
        if kept is None:
            kept = self.build(path, raw)
        (status, body), prompt, skip = kept
        if PLACEHOLDER in body:
            body = body.replace(PLACEHOLDER, f'"cached_tokens": {self.cached(prompt, skip)}'
                                .encode())
        return status, body

    def build(self, path, raw):
        try:
            req = json.loads(raw)
        except ValueError:
            return self.error(400, "the body is not JSON", "BadRequestError"), [], True
        prompt = req.get("prompt") if isinstance(req.get("prompt"), list) else []
        skip = bool(req.get("echo")) and req.get("logprobs") is not None
        if path == "/v1/completions":
            out = self.completion(req)
        elif path == "/v1/chat/completions":
            out = self.error(400, f"{self.model} is not a multimodal model", "BadRequestError")
        elif path == "/tokenize":
            out = self.tokenize(req)
        else:
            out = self.error(404, f"no route {path}", "NotFoundError")
        kept = (out, prompt, skip)
        with self.lock:
            if len(self.cache) < 10_000:
                self.cache[(path, raw)] = kept
        return kept


def handler(replay):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def send(self, status, body, kind="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self.send(200, b"")
            elif self.path == "/v1/models":
                self.send(200, replay.models)
            elif self.path == "/metrics":
                self.send(200, METRICS, "text/plain; version=0.0.4")
            else:
                self.send(*replay.error(404, f"no route {self.path}", "NotFoundError"))

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send(*replay.answer(self.path, raw))

        def log_message(self, *args):
            pass

    return Handler


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--served-model-name", default="smollm2")
    ap.add_argument("--max-model-len", type=int, default=8192)
    a = ap.parse_args()
    server = Server(("127.0.0.1", a.port), handler(Replay(a.served_model_name, a.max_model_len)))
    server.serve_forever()


if __name__ == "__main__":
    main()
