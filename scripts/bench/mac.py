"""Benchmark for a Mac: decisio against mlx_lm.server (mlx-lm 0.32.2) on the
same MLX conversion of each base, in the cases the reference pages quote.

Usage: scripts/bench/mac.sh [--models NAME=FOLDER_OR_REPO ...] [--reps 5] [--quick]
       (the same as $DECISIO_CACHE/venv/bin/python scripts/bench/mac.py ...;
       `make bench-mac` runs it with the defaults)

For each model both servers serve the same MLX folder (or Hugging Face
repository, downloaded first into the Hugging Face cache) on 127.0.0.1:
  (a) one question on a NEW state of about --state-tokens tokens (text no
      server has seen: each state is built from its own MMLU rows);
  (b) a new question on that state sent again: a prefix-cache hit;
  (c) --questions new questions sharing that state (seen before), per
      question: decisio answers them in one POST /v1/decide; mlx_lm.server
      gets one chat completion per question, in sequence, its prompt cache
      reusing the shared state prefix;
  (d) peak memory of a fresh server process after one question on a state
      of about 8k, 16k and 32k tokens (--memory-tokens); a length over the
      model's context (`max_position_embeddings`) is skipped and the reason
      recorded.
decisio answers through POST /v1/decide. mlx_lm.server answers the same
prompt (one user message `{state}\\n\\n{question block}`, thinking off where
the chat template has the switch) as a chat completion with `max_tokens` 1,
`logprobs` true and `top_logprobs` 10. Times are the client's wall time of
the whole HTTP request; each case is timed --reps times on distinct states
and questions (medians reported), each timed request after a one-second
pause. Both servers run at once and alternate (A B, then B A), unless two
copies of the weights would not fit in memory: then one runs after the
other on the same requests (--in-turn forces it).

Memory: the peak resident set size of the server process (VmHWM on Linux;
on macOS `ps -o rss` sampled every 0.1 s, which misses Metal buffers) and
MLX's own peak (decisio's gauge decisio_mlx_memory_bytes{kind="peak"} from
/metrics; for mlx_lm.server, mlx.core.get_peak_memory() read by a thread
started in its process before the server's module runs). On a Mac the MLX
peak is the figure that counts the Metal buffers.

Defaults: on macOS the three bases' MLX conversions (docs/running.md); on
other systems the fixture's dense copy (mlx-lm's dequantized copy of the
4-bit fixture, scripts/bench/first_token.py: MLX's CPU quantized kernels
take mlx_lm.server minutes per 1,000-token prompt, while decisio expands
quantized weights at load on the CPU, so the dense folder is the one that
compares the two servers on the same kernels). The device measured (MLX's
default device, as decisio logs it at start and as mlx.core reports it in
this Python) goes to stdout and to the record. Writes OUT/summary.md and
OUT/results.json (every raw time); OUT defaults to runs/<today>_mac-bench.
"""

import argparse
import datetime
import http.client
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import common

# The tokenizers' notices (no PyTorch; a state longer than the model's
# context, which is what the memory case is about) are not this benchmark's.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

IS_MAC = platform.system() == "Darwin"
BASES = [
    ("qwen3.6-35b-a3b", "mlx-community/Qwen3.6-35B-A3B-6bit"),
    ("gemma-4-12b", "mlx-community/gemma-4-12B-it-6bit"),
    ("gemma-4-31b", "mlx-community/gemma-4-31b-it-6bit"),
]
FULL = {"state_tokens": 1000, "memory_tokens": "8192,16384,32768", "questions": 100, "reps": 5}
QUICK = {"state_tokens": 200, "memory_tokens": "512,16384", "questions": 5, "reps": 2}
LISTENING = re.compile(r"listening on http://([0-9.]+):([0-9]+)")
DEVICE_LINE = re.compile(r"MLX computes on the (\w+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Room left beside a memory state for the question, the template and the answer.
QUESTION_ROOM = 64
MIB = 1 << 20

# Started with `python -c` in place of `python -m mlx_lm.server`: a thread
# writes MLX's peak and active memory to a file five times a second, then
# the server's module runs as it would with -m.
PEAK_WATCH = """
import json, os, runpy, sys, threading, time
import mlx.core as mx
path = os.environ["MAC_BENCH_PEAK_FILE"]
def watch():
    while True:
        with open(path + ".tmp", "w") as f:
            json.dump({"peak": mx.get_peak_memory(), "active": mx.get_active_memory()}, f)
        os.replace(path + ".tmp", path)
        time.sleep(0.2)
threading.Thread(target=watch, daemon=True).start()
sys.argv = ["mlx_lm.server", *sys.argv[1:]]
runpy.run_module("mlx_lm.server", run_name="__main__", alter_sys=True)
"""


T0 = time.time()


def say(line):
    t = int(time.time() - T0)
    print(f"[{t // 60:02d}:{t % 60:02d}] {line}", flush=True)


# ---------------------------------------------------------------- paths ---

def shown(path):
    """A path as the record writes it: relative to the repository, or under
    $DECISIO_CACHE, $TMPDIR or ~, never this machine's absolute path."""
    p = str(path)
    for base, name in ((common.ROOT, None), (common.CACHE, "$DECISIO_CACHE"),
                       (pathlib.Path(tempfile.gettempdir()), "$TMPDIR"),
                       (pathlib.Path.home(), "~")):
        b = str(base).rstrip("/")
        if p == b:
            return name or "."
        if p.startswith(b + "/"):
            rest = p[len(b) + 1:]
            return rest if name is None else f"{name}/{rest}"
    return p


def shown_arg(arg):
    """A command-line argument as the record writes it: paths as `shown`
    writes them, quoted for a shell where needed ($VARIABLES left to expand)."""
    key, eq, value = arg.partition("=")
    if arg.startswith("/"):
        arg = shown(arg)
    elif eq and value.startswith("/"):
        arg = f"{key}={shown(value)}"
    if re.fullmatch(r"[A-Za-z0-9_./=,:~$+-]+", arg):
        return arg
    return '"' + re.sub(r'(["\\`])', r"\\\1", arg) + '"'


def default_bin():
    if os.environ.get("DECISIO_BIN"):
        return pathlib.Path(os.environ["DECISIO_BIN"])
    return common.DECISIO


# -------------------------------------------------------------- machine ---

def chip():
    if IS_MAC:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                             capture_output=True, text=True)
        return out.stdout.strip() or platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def memory_bytes():
    if IS_MAC:
        out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True)
        return int(out.stdout.strip() or 0)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def mlx_in_venv():
    """MLX's default device and versions, as the Python that runs
    mlx_lm.server sees them."""
    code = ("import json, platform, mlx.core as mx, mlx_lm, transformers\n"
            "info = {}\n"
            "try:\n    info = {k: v for k, v in mx.device_info().items() if isinstance(v, (str, int))}\n"
            "except Exception:\n    pass\n"
            "print(json.dumps({'default_device': str(mx.default_device()),\n"
            "  'metal_available': bool(mx.metal.is_available()), 'device_info': info,\n"
            "  'mlx': mx.__version__, 'mlx_lm': mlx_lm.__version__,\n"
            "  'transformers': transformers.__version__,\n"
            "  'platform': platform.platform(), 'processor': platform.processor()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def git_commit():
    out = subprocess.run(["git", "-C", str(common.ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


# --------------------------------------------------------------- models ---

def default_models():
    if IS_MAC:
        return [f"{name}={repo}" for name, repo in BASES]
    from first_token import dense_copy
    return [f"smollm2-135m-dense={dense_copy()}"]


def resolve(spec):
    """`name=FOLDER_OR_REPO` -> (name, what the servers are given, local folder)."""
    name, _, source = spec.partition("=")
    if not source:
        name, source = pathlib.PurePath(spec).name, spec
    if pathlib.Path(source).expanduser().is_dir():
        folder = pathlib.Path(source).expanduser().resolve()
        return name, str(folder), folder
    from huggingface_hub import snapshot_download
    say(f"[{name}] fetching {source} into the Hugging Face cache (if missing)")
    return name, source, pathlib.Path(snapshot_download(source))


def context_length(folder):
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    return int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 4096)


def weights_bytes(folder):
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def token_counter(folder):
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(folder))
        return lambda text: len(tok.encode(text, add_special_tokens=False))
    except Exception:  # a tokenizer class this transformers lacks: its tokenizer.json
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


# ------------------------------------------------------ states, questions ---

def usable(row):
    options = [str(row["answer_" + k]).strip() for k in "abcd"]
    return row["question"].strip() and all(options) and len(set(options)) == 4


def decide_question(row):
    return {"text": row["question"].strip(),
            "options": [str(row["answer_" + k]).strip() for k in "abcd"]}


class Rows:
    """Hands out MMLU rows, each once (then again under new state headers)."""

    def __init__(self):
        self.rows = [r for r in common.mmlu_rows(n=1_000_000) if usable(r)]
        self.cursor = 0
        self.states = 0

    def take(self, n=1):
        out = [self.rows[(self.cursor + i) % len(self.rows)] for i in range(n)]
        self.cursor += n
        return out

    def short_question(self, count, limit=64):
        while True:
            (r,) = self.take()
            if count(common.mmlu_block(r)) <= limit:
                return r

    def state(self, count, target):
        """A state of at least `target` tokens (about; counted without a
        template), opened by a header no other state has."""
        self.states += 1
        parts = [f"Case file {self.states}, {datetime.date.today().isoformat()}."]
        total = count(parts[0])
        while True:
            while total < target:
                (r,) = self.take()
                part = common.mmlu_block(r) + "\nAnswer: " + r["correct_answer"]
                parts.append(part)
                total += count(part) + 1
            text = "\n\n".join(parts)
            n = count(text)
            if n >= target:
                return text, n
            total = n


def shorten(text, count, target):
    """Drops trailing paragraphs until `text` has at most `target` tokens."""
    parts = text.split("\n\n")
    while len(parts) > 1 and count("\n\n".join(parts)) > target:
        parts.pop()
    text = "\n\n".join(parts)
    return text, count(text)


# -------------------------------------------------------------- servers ---

def rss_now(pid):
    if IS_MAC:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
        return int(out.stdout.strip() or 0) * 1024
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssPeak:
    """Peak resident memory of a process: VmHWM on Linux (exact); on macOS
    the largest `ps -o rss` of samples every 0.1 s from its start."""

    def __init__(self, pid, sample):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        if IS_MAC and sample:
            threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, rss_now(self.pid))
            except (OSError, ValueError):
                pass
            self.stop.wait(0.1)

    def value(self):
        if IS_MAC:
            self.peak = max(self.peak, rss_now(self.pid))
            return self.peak
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    method = "ps -o rss, sampled every 0.1 s" if IS_MAC else "VmHWM of /proc/PID/status"


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_for(pattern, path, proc, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        m = pattern.search(ANSI.sub("", path.read_text(errors="replace")))
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited (status {proc.returncode}); log {path}")
        time.sleep(0.1)
    raise RuntimeError(f"no line matching {pattern.pattern!r} in {path}")


class Server:
    """One server process on loopback: decisio (POST /v1/decide) or
    mlx_lm.server (a chat completion per question)."""

    def __init__(self, kind, model, binary, logs, peak_file=False):
        self.kind, self.model = kind, model
        self.log = logs / f"{kind}-{time.monotonic_ns()}.log"
        self.peak_file = None
        self.out = open(self.log, "w")
        self.proc, self.rss = None, None
        # decisio's own state folder: the default one may be held by a
        # server already running on this machine (`make serve`).
        self.state = tempfile.mkdtemp(prefix="decisio-bench-state-") if kind == "decisio" else None
        try:
            self._start(binary, logs, peak_file)
        except BaseException:
            self.stop()
            raise

    def _start(self, binary, logs, peak_file):
        kind, model, out = self.kind, self.model, self.out
        if kind == "decisio":
            self.proc = subprocess.Popen(
                [str(binary), "serve", "--model", model, "--served-model-name", "model",
                 "--port", "0", "--state-dir", self.state],
                stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, NO_COLOR="1"))
            self.rss = RssPeak(self.proc.pid, peak_file)
            self.port = int(wait_for(LISTENING, self.log, self.proc).group(2))
            self.device = wait_for(DEVICE_LINE, self.log, self.proc).group(1)
            common.wait_healthy(self.port, self.proc, limit=1800)
        else:
            self.port = common.free_port()
            env = dict(os.environ, HF_HUB_OFFLINE="1")
            if os.path.exists(common.OPENBLAS):
                # The BLAS decisio links (the wheel's own is the slow reference one).
                env["LD_PRELOAD"] = common.OPENBLAS
            head = ["-m", "mlx_lm.server"]
            if peak_file:
                self.peak_file = logs / f"mlx-peak-{time.monotonic_ns()}.json"
                env["MAC_BENCH_PEAK_FILE"] = str(self.peak_file)
                head = ["-c", PEAK_WATCH]
            self.proc = subprocess.Popen(
                [sys.executable, *head, "--model", model, "--port", str(self.port),
                 "--chat-template-args", json.dumps({"enable_thinking": False})],
                stdout=out, stderr=subprocess.STDOUT, env=env)
            self.rss = RssPeak(self.proc.pid, peak_file)
            common.wait_healthy(self.port, self.proc, path="/v1/models", limit=1800)

    def ask(self, state, questions):
        """Seconds for the questions on the state, and what the server said."""
        if self.kind == "decisio":
            t, r = common.post(self.port, "/v1/decide",
                               {"state": state, "questions": [decide_question(q) for q in questions]})
            assert len(r["answers"]) == len(questions)
            return t, {"state_tokens": r["state"]["tokens"], "cached": r["state"]["cached"],
                       "prompt_tokens": r["usage"]["prompt_tokens"],
                       "cached_tokens": r["usage"].get("cached_tokens")}
        total, prompt, cached = 0.0, [], []
        for q in questions:
            t, r = common.post(self.port, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": state + "\n\n" + common.mmlu_block(q)}],
                "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 10})
            total += t
            usage = r.get("usage", {})
            prompt.append(usage.get("prompt_tokens"))
            cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        return total, {"prompt_tokens": prompt if len(prompt) > 1 else prompt[0],
                       "cached_tokens": cached if len(cached) > 1 else cached[0]}

    def mlx_memory(self):
        """MLX's (peak, active) bytes in the server's process."""
        if self.kind == "decisio":
            m = metrics(self.port)
            return (m.get('decisio_mlx_memory_bytes{kind="peak"}'),
                    m.get('decisio_mlx_memory_bytes{kind="active"}'))
        if self.peak_file is None:
            return None, None
        time.sleep(0.5)
        try:
            d = json.loads(self.peak_file.read_text())
            return d["peak"], d["active"]
        except (OSError, ValueError):
            return None, None

    def stop(self):
        if self.rss is not None:
            self.rss.stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        if self.state:
            shutil.rmtree(self.state, ignore_errors=True)


# ---------------------------------------------------------------- cases ---

SERVERS = ("decisio", "mlx_lm")
CASES = {
    "a": "one question on a new state",
    "b": "a new question on a seen state (prefix-cache hit)",
    "c": "per question, {n} questions sharing one seen state",
}


def timing(name, model, binary, logs, count, rows, args, in_turn):
    """Cases (a), (b), (c): `args.reps` rounds on distinct states."""
    warm = {"state": rows.state(count, args.state_tokens)[0], "questions": rows.take(4)}
    rounds = []
    for _ in range(args.reps):
        text, n = rows.state(count, args.state_tokens)
        rounds.append({"state": text, "state_text_tokens": n, "a": rows.take(1),
                       "b": rows.take(1), "c": rows.take(args.questions)})
    samples = {c: {s: [] for s in SERVERS} for c in CASES}
    info = {c: {s: [] for s in SERVERS} for c in CASES}

    def warm_up(server):
        qs = warm["questions"]
        server.ask(warm["state"], qs[:1])
        server.ask(warm["state"], qs[1:2])
        server.ask(warm["state"], qs[2:4])

    def one(server, case, rnd):
        common.settle()
        t, said = server.ask(rnd["state"], rnd[case])
        samples[case][server.kind].append(t / len(rnd[case]))
        info[case][server.kind].append(said)

    devices = {}
    if in_turn:
        for kind in SERVERS:
            s = Server(kind, model, binary, logs)
            try:
                devices[kind] = getattr(s, "device", None)
                if kind == "decisio":
                    say(f"[{name}] decisio: MLX computes on the {s.device} (its start-up log)")
                warm_up(s)
                for i, rnd in enumerate(rounds):
                    for case in CASES:
                        one(s, case, rnd)
                    say(f"[{name}] {kind}: round {i + 1} of {len(rounds)}")
            finally:
                s.stop()
    else:
        servers = {k: Server(k, model, binary, logs) for k in SERVERS}
        try:
            devices["decisio"] = servers["decisio"].device
            say(f"[{name}] decisio: MLX computes on the {devices['decisio']} (its start-up log)")
            for s in servers.values():
                warm_up(s)
            for i, rnd in enumerate(rounds):
                order = SERVERS if i % 2 == 0 else SERVERS[::-1]
                for case in CASES:
                    for kind in order:
                        one(servers[kind], case, rnd)
                say(f"[{name}] round {i + 1} of {len(rounds)}")
        finally:
            for s in servers.values():
                s.stop()
    return {"samples_seconds": samples, "responses": info,
            "state_text_tokens": [r["state_text_tokens"] for r in rounds],
            "decisio_device": devices.get("decisio")}


def memory(name, model, binary, logs, count, rows, lengths, context):
    """Case (d): a fresh process of each server per length."""
    out = []
    question = rows.short_question(count)
    room = count(common.mmlu_block(question)) + QUESTION_ROOM
    warm_state = rows.state(count, 32)[0]
    warm_question = rows.short_question(count)
    for target in lengths:
        row = {"target_tokens": target, "context": context}
        if target > context:
            row["skipped"] = (f"{target:,} tokens of state exceed the model's context of "
                              f"{context:,} tokens (max_position_embeddings of its config.json)")
            out.append(row)
            say(f"[{name}] memory at {target}: skipped ({row['skipped']})")
            continue
        text, n = rows.state(count, min(target, context - room))
        if n > context - room:
            text, n = shorten(text, count, context - room)
        row["state_text_tokens"] = n
        if n < target:
            row["note"] = (f"state shortened to {n:,} tokens so that it and a question fit "
                           f"the context of {context:,}")
        for kind in SERVERS:
            s = Server(kind, model, binary, logs, peak_file=True)
            try:
                s.ask(warm_state, [warm_question])
                loaded_rss = rss_now(s.proc.pid)
                loaded_peak, loaded_active = s.mlx_memory()
                t, said = s.ask(text, [question])
                peak, _ = s.mlx_memory()
                row[kind] = {"seconds": t, "response": said, "peak_rss_bytes": s.rss.value(),
                             "rss_after_load_bytes": loaded_rss, "mlx_peak_bytes": peak,
                             "mlx_active_after_load_bytes": loaded_active,
                             "mlx_peak_after_load_bytes": loaded_peak}
                if kind == "decisio":
                    row[kind]["prefix_cache_bytes"] = metrics(s.port).get("decisio_prefix_cache_bytes")
            except Exception as e:  # noqa: BLE001 (an out-of-memory server, say): record it
                row[kind] = {"error": str(e)[:300]}
            finally:
                s.stop()
        out.append(row)
        say(f"[{name}] memory at {target}: " + ", ".join(
            f"{k} peak RSS {mib(row[k].get('peak_rss_bytes'))} MiB, MLX peak "
            f"{mib(row[k].get('mlx_peak_bytes'))} MiB" for k in SERVERS))
    return out


# -------------------------------------------------------------- summary ---

def median_ms(values):
    return statistics.median(values) * 1e3 if values else float("nan")


def medians(samples):
    out = {}
    for case, by in samples.items():
        d, m = median_ms(by["decisio"]), median_ms(by["mlx_lm"])
        out[case] = {"decisio_ms": d, "mlx_lm_ms": m, "ratio": d / m if m else float("nan")}
    return out


def mib(v):
    return "—" if v is None else f"{v / MIB:,.0f}"


def reuse(info, case):
    """How each server's cache served a case: decisio's `state.cached`,
    mlx_lm.server's cached prompt tokens against its prompt tokens."""
    d = info[case]["decisio"]
    m = info[case]["mlx_lm"]
    cached = [x["cached_tokens"] or 0 for x in m]
    prompt = [x["prompt_tokens"] or 0 for x in m]
    return (f"decisio `state.cached` {sum(1 for x in d if x['cached'])} of {len(d)}; "
            f"mlx_lm.server {statistics.median(cached):,.0f} of "
            f"{statistics.median(prompt):,.0f} prompt tokens cached (medians)")


def model_section(m, questions):
    lines = [f"## {m['name']}", "", f"Conversion: `{m['source']}` (both servers); context "
             f"{m['context']:,} tokens; weights {m['weights_bytes'] / 1e9:.2f} GB; servers "
             f"{'one after the other' if m['in_turn'] else 'at once, alternating'}.", ""]
    if "error" in m:
        return lines + [f"Not measured: {m['error']}", ""]
    t = m["timing"]
    med = m["medians"]
    st = t["state_text_tokens"]
    a_d = [r["state_tokens"] for r in t["responses"]["a"]["decisio"]]
    a_m = [r["prompt_tokens"] for r in t["responses"]["a"]["mlx_lm"]]
    reps = len(st)
    lines += [f"States: {reps} of {min(st):,} to {max(st):,} tokens of text (decisio's state: "
              f"median {statistics.median(a_d):,.0f} tokens; mlx_lm.server's prompt with the "
              f"question: median {statistics.median(a_m):,.0f} tokens).", "",
              "| case | decisio (ms, median) | mlx_lm.server (ms, median) | ratio (decisio / mlx_lm) |",
              "|---|---|---|---|"]
    for case, what in CASES.items():
        r = med[case]
        lines.append(f"| ({case}) {what.format(n=questions)} | {r['decisio_ms']:,.1f} | "
                     f"{r['mlx_lm_ms']:,.1f} | **{r['ratio']:.3f}** |")
    info = t["responses"]
    lines += ["", f"Cache reuse: (a) {reuse(info, 'a')}; (b) {reuse(info, 'b')}. (mlx_lm.server "
              "reuses on a new state only the chat template's opening, which every prompt "
              "shares.)", ""]
    lines += ["Memory (d), a fresh process of each server per length, one question on the state "
              "(MiB; RSS: resident set of the process; MLX: MLX's own peak):", "",
              "| state (target) | state tokens (decisio) | decisio peak RSS | decisio MLX peak "
              "| mlx_lm.server peak RSS | mlx_lm.server MLX peak | decisio (ms) | mlx_lm.server (ms) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in m["memory"]:
        if "skipped" in r:
            lines.append(f"| {r['target_tokens']:,} | skipped: {r['skipped']} | | | | | | |")
            continue
        d, x = r["decisio"], r["mlx_lm"]
        cell = lambda s, k: ("error: " + s["error"].replace("|", "/")[:120]) if "error" in s \
            else mib(s[k])
        ms = lambda s: "—" if "error" in s else f"{s['seconds'] * 1e3:,.0f}"
        tokens = d["response"]["state_tokens"] if "response" in d else r["state_text_tokens"]
        lines.append(f"| {r['target_tokens']:,} | {tokens:,} | {cell(d, 'peak_rss_bytes')} | "
                     f"{cell(d, 'mlx_peak_bytes')} | {cell(x, 'peak_rss_bytes')} | "
                     f"{cell(x, 'mlx_peak_bytes')} | {ms(d)} | {ms(x)} |")
        if "note" in r:
            lines.append(f"| | {r['note']} | | | | | | |")
    return lines + [""]


def write(out, record):
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    dev = record["device"]
    a = record["args"]
    lines = ["# decisio against mlx_lm.server: new state, seen state, many questions, memory", "",
             f"**{dev['line']}**", "",
             f"Machine: {record['machine']['chip']}, {record['machine']['cpus']} CPUs, "
             f"{record['machine']['memory_bytes'] / 2**30:.0f} GiB; {record['machine']['platform']}.",
             f"Versions: {record['versions']['decisio']} (commit {record['versions']['commit']}), "
             f"MLX {record['versions']['mlx']}, mlx-lm {record['versions']['mlx_lm']}, "
             f"transformers {record['versions']['transformers']}, Python "
             f"{record['machine']['python']}.",
             f"Command: `{record['command']}`.",
             f"Started {record['started']}, took {record['wall_seconds'] / 60:.1f} min.", "",
             "How: both servers serve the same MLX conversion on 127.0.0.1. decisio answers "
             "`POST /v1/decide` (prefix cache on, its defaults). mlx_lm.server answers the same "
             "prompt (one user message: the state, a blank line, the question block; thinking off "
             "through `--chat-template-args`) as a chat completion with `max_tokens` 1, "
             "`logprobs` true, `top_logprobs` 10, its prompt cache on (its defaults). Times are "
             "the client's wall time of the whole request, medians of "
             f"{a['reps']} rounds, each round on its own state of about {a['state_tokens']:,} "
             "tokens of MMLU questions (text no server saw before) and its own questions; each "
             "timed request follows a one-second pause. Ratio below 1: decisio is faster.", "",
             f"- (a) one question on a new state; (b) a question not asked before on the state "
             f"of (a), sent again: a prefix-cache hit; (c) {a['questions']} questions not asked "
             f"before on that same (seen) state, reported per question. For (c) decisio gets one "
             f"`POST /v1/decide` with all {a['questions']} questions; mlx_lm.server, which has no "
             f"such request, gets {a['questions']} chat completions in sequence that share the "
             "state's prefix (its prompt cache reuses it): their total time over "
             f"{a['questions']}.",
             "- (d) memory: for each length a fresh process of each server, alone, answers one "
             "short question on a small state (loading everything), then one question on a state "
             f"of about that length. Peak RSS: {RssPeak.method}"
             + (" (on macOS this misses Metal buffers, which MLX allocates outside the "
                "resident set it reports)" if IS_MAC else "")
             + ". MLX peak: MLX's own peak memory in the process: decisio's "
             "`decisio_mlx_memory_bytes{kind=\"peak\"}` from `/metrics`; for mlx_lm.server, "
             "`mlx.core.get_peak_memory()` read by a thread in its process. "
             + ("On this Mac the MLX peak counts the Metal buffers (weights, caches): it is the "
                "figure to compare." if IS_MAC else
                "On the CPU the MLX peak counts MLX's buffers only; RSS also counts the "
                "program, the Python runtime and what else the process holds."),
             "- A length over the model's context is skipped; the row says why. A length equal "
             f"to the context is shortened by room for the question ({QUESTION_ROOM} tokens plus "
             "the question's).", ""]
    notes = list(record.get("notes", []))
    if not IS_MAC:
        notes.insert(0, "Not a Mac: MLX computes on the CPU here, so these figures test the "
                        "benchmark and compare the two servers on this machine; they are not the "
                        "Metal figures of the reference pages. The default model off macOS is the "
                        "fixture's dense copy (mlx-lm's dequantized copy of the 4-bit fixture): "
                        "MLX's CPU quantized kernels take mlx_lm.server minutes per 1,000-token "
                        "prompt, and decisio expands quantized weights at load on the CPU, so the "
                        "dense folder puts both servers on the same kernels.")
    if a["reps"] != FULL["reps"] or a["questions"] != FULL["questions"]:
        notes.append(f"Sizes: {a['reps']} rounds and {a['questions']} questions for (c) "
                     f"(defaults {FULL['reps']} and {FULL['questions']}).")
    for n in notes:
        lines += [n, ""]
    for m in record["models"]:
        lines += model_section(m, a["questions"])
    (out / "summary.md").write_text("\n".join(lines))


# ----------------------------------------------------------------- main ---

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", metavar="NAME=FOLDER_OR_REPO",
                    help="MLX conversions (default on macOS: the three bases' conversions; "
                         "elsewhere the fixture's dense copy)")
    ap.add_argument("--state-tokens", type=int, help="tokens of a state for (a)-(c) (1000)")
    ap.add_argument("--memory-tokens", help="state lengths for (d), comma-separated "
                                            "(8192,16384,32768)")
    ap.add_argument("--questions", type=int, help="questions sharing a state in (c) (100)")
    ap.add_argument("--reps", type=int, help="rounds, one state each; medians reported (5)")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes for the test: state 200, memory 512,16384, "
                         "5 questions, 2 rounds")
    ap.add_argument("--in-turn", action="store_true",
                    help="run the two servers one after the other (the default when two "
                         "copies of the weights would not fit in memory)")
    ap.add_argument("--bin", type=pathlib.Path, default=default_bin(),
                    help="the decisio binary (default: $DECISIO_BIN, else "
                         "$CARGO_TARGET_DIR/release/decisio, else target/release/decisio)")
    ap.add_argument("--out", type=pathlib.Path, help="record folder (runs/<today>_mac-bench)")
    ap.add_argument("--note", action="append", default=[],
                    help="a line for the summary (repeatable)")
    args = ap.parse_args()
    preset = QUICK if args.quick else FULL
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    lengths = sorted({int(x) for x in str(args.memory_tokens).split(",") if x.strip()})
    binary = args.bin.expanduser().resolve()
    if not binary.exists():
        sys.exit(f"no decisio binary at {binary}: build it (cargo build --release) or pass --bin")
    out = args.out or common.run_dir("mac-bench")
    out.mkdir(parents=True, exist_ok=True)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="mac-bench-logs-"))
    started, t0 = datetime.datetime.now().isoformat(timespec="seconds"), time.time()

    venv = mlx_in_venv()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    specs = args.models or default_models()
    rows = Rows()
    models, decisio_devices = [], set()
    device = {"mlx_lm_default_device": venv["default_device"],
              "metal_available": venv["metal_available"], "device_info": venv["device_info"],
              "platform": venv["platform"], "processor": venv["processor"] or chip()}
    print(f"mlx_lm.server's MLX default device: {venv['default_device']} "
          f"({venv['device_info'].get('device_name', '')}; {venv['platform']}, "
          f"{device['processor']})", flush=True)
    try:
        for spec in specs:
            name, model, folder = resolve(spec)
            ctx, weights = context_length(folder), weights_bytes(folder)
            in_turn = args.in_turn or 2 * weights > 0.6 * memory_bytes()
            m = {"name": name, "source": shown(model), "context": ctx, "weights_bytes": weights,
                 "in_turn": in_turn}
            try:
                count = token_counter(folder)
                t = timing(name, model, binary, logs, count, rows, args, in_turn)
                if t["decisio_device"]:
                    decisio_devices.add(t["decisio_device"])
                m["timing"] = t
                m["medians"] = medians(t["samples_seconds"])
                m["memory"] = memory(name, model, binary, logs, count, rows, lengths, ctx)
            except Exception as e:  # noqa: BLE001 (a model that does not start, say): record it
                m["error"] = f"{type(e).__name__}: {e}"[:500]
                say(f"[{name}] not measured: {m['error']}")
            models.append(m)
    except BaseException:
        print(f"server logs kept in {logs}", file=sys.stderr)
        raise
    if any("error" in m for m in models):
        print(f"server logs kept in {logs}", file=sys.stderr)
    else:
        shutil.rmtree(logs, ignore_errors=True)

    device["decisio"] = sorted(decisio_devices)
    name = venv["device_info"].get("device_name") or chip()
    device["line"] = (f"Device: decisio: MLX computes on the {'/'.join(device['decisio']) or '?'} "
                      f"(its start-up log); mlx_lm.server: MLX default device "
                      f"{venv['default_device']}"
                      f"{', Metal available' if venv['metal_available'] else ', no Metal'}; "
                      f"{name}; {venv['platform']}, processor {device['processor']}")
    record = {
        "benchmark": "decisio against mlx_lm.server: (a) new state, (b) seen state, "
                     "(c) questions sharing a state, (d) peak memory",
        "device": device,
        "machine": {**common.machine(), "chip": chip(), "memory_bytes": memory_bytes()},
        "versions": {"decisio": version, "commit": git_commit(), "mlx": venv["mlx"],
                     "mlx_lm": venv["mlx_lm"], "transformers": venv["transformers"]},
        "command": " ".join(["scripts/bench/mac.sh", *map(shown_arg, sys.argv[1:])]),
        "decisio_binary": shown(binary),
        "args": {"state_tokens": args.state_tokens, "memory_tokens": lengths,
                 "questions": args.questions, "reps": args.reps, "quick": args.quick},
        "notes": args.note,
        "started": started,
        "wall_seconds": time.time() - t0,
        "rss_method": RssPeak.method,
        "models": models,
    }
    write(out, record)
    print((out / "summary.md").read_text())
    print(device["line"])
    if any("error" in m for m in models):
        sys.exit("some models were not measured: see the record")


if __name__ == "__main__":
    main()
