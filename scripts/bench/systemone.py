"""Benchmark: decisio beside the reference decisio 0.35.0 on System One's
cases, every server asked only what it has never answered.

Usage: python scripts/bench/systemone.py [--rounds 5] [--tokens 3000]
  [--questions 50] [--state-tokens 1000] [--cases read,new,seen,concurrent]
  [--servers mlx,vllm,ref,ref-pad] [--clients 16] [--requests 200]
  [--name systemone-bench] [--vllm-flags '--fair-seconds 0']

Servers, all on the fixture on this machine's CPUs, started once:
  - `mlx`: decisio on MLX (the fixture as `make serve` serves it);
  - `vllm`: decisio's vLLM backend in front of vLLM's CPU build (blocks of 32,
    the fixture's float32 copy);
  - `ref`: the reference decisio 0.35.0 on its own vLLM with `--pad-to none`:
    the same prompts as decisio, so the top options must agree (the primary
    ratio is to this one);
  - `ref-pad`: the reference again, a second server at its default padding
    (the state front-padded with newlines to its block of 32).
decisio answers on `POST /v1/systemone` and the same work on `POST
/v1/decide` (a yes/no as the options No and Yes, a score as its levels); the
reference on `/v1/systemone`. Each (server, route) is a subject.

Cases (the issue's target table), each timed per subject:
  read: one question on a new document of ~--state-tokens (the state's read);
  new: a new document of ~--tokens and 50 questions (17 yes/no, 17 choices of
    four, 16 scores of five levels), the whole request;
  seen: 50 new questions on the document `new` just read, per question;
  concurrent: --clients clients (a thread pool, loopback only) send
    --requests requests of 5 new questions each on 4 new documents of
    ~--state-tokens, on `/v1/systemone`; decisions per second, p50/p99
    latency; bounded by --limit seconds (requests not started by then are
    left out, and counted).
The warm-up round runs every case, `concurrent` with one request per client.
Fairness: documents are built from MMLU questions, each used once, so every
(server, route, case, round) reads a document of its own; every question
body is drawn (seeded by --seed) from topics, wordings and criteria and never
sent twice in a run, so no server answers from answers kept with a state.
One untimed warm-up round, then --rounds timed rounds; in each round the
subjects take turns in an order rotated by one per round. Ratios are paired
within a round (a subject's time over the reference's in that round; for
`concurrent`, decisions per second over the reference's), then their median
and range, beside the times' medians and ranges.
Agreement: each round (warm-up included) also sends one more document with 50
questions, the same body to every server's `/v1/systemone` (untimed); the
record counts per document how many top options agree with `ref`.
Split of time: around every request to decisio, `GET /metrics` is read;
the differences of `decisio_new_state_seconds` (the read of new states),
`decisio_question_seconds` (the whole decision, per question; its sum less
the states' read is the questions' time), `decisio_question_passes_total`
and `decisio_merged_jobs_total` are summed per subject and case, and each
response's `cached` flag kept.

Roofline (with `mlx`): each case's floating-point work on the fixture
(from the state's tokens and the questions' as MLX's wire responses report
them) at the machine's float32 product rate measured in the same run,
beside the reference's time: where a target lies under that floor's ratio.
Both backends read the same prompts (the base's padding, applied alike), so
the floor bounds the vLLM backend's float32 upstream as it bounds MLX; the
record sets each decisio subject's ratio beside it.

`--rewrite` writes summary.md (and times.png) again from the record's
results.json, the command and options as the run recorded them.

Writes runs/<date>_<--name>/{summary.md,results.json,times.png}; the
plot with matplotlib when it imports, else with the project's `paired_bars`
example when built (`make bench-systemone` builds it).
"""

import argparse
import concurrent.futures
import datetime
import json
import random
import subprocess
import sys
import time

import common

sys.path.insert(0, str(common.ROOT / "tests" / "e2e"))
from conftest import start_reference, start_vllm, stop_vllm  # noqa: E402

WIRE, DECIDE = "/v1/systemone", "/v1/decide"
NAMES = {"mlx": "decisio MLX", "vllm": "decisio vLLM backend",
         "ref": "reference 0.35.0 --pad-to none", "ref-pad": "reference 0.35.0, default padding"}
CASES = {"read": "(a) one question on a new state (s per request)",
         "new": "(b) new document + 50 questions (s per request)",
         "seen": "(c) 50 new questions on a seen document (s per question)",
         "concurrent": "(d) concurrent clients (decisions per second)"}
TOPICS = ["mathematics", "history", "biology", "law", "medicine", "physics", "chemistry",
          "economics", "philosophy", "computer science", "geography", "psychology",
          "astronomy", "music", "ethics", "statistics", "engineering"]
NOUL = ["Is question {n} of the document more about {t} than about {u}?",
        "Does question {n} need knowledge of {t} rather than {u}?",
        "Would a teacher of {t}, not of {u}, set question {n}?"]
CHOICE = ["Which subject does question {n} belong to?",
          "Which field is question {n} closest to?",
          "Which course would teach the answer to question {n}?"]
SCORE = ["How much does question {n} rely on {t} rather than {u}?",
         "How hard is question {n} for a student of {t} who never studied {u}?",
         "How much of question {n} is about {t}, leaving {u} aside?"]
LEVELS = [["none at all", "a little", "some", "much", "very much"],
          ["never", "rarely", "sometimes", "often", "always"],
          ["not at all", "slightly", "moderately", "strongly", "entirely"]]


class Questions:
    """Question bodies drawn with a seeded generator, none given twice."""

    def __init__(self, seed):
        self.rng, self.sent = random.Random(seed), set()

    def one(self, kind):
        r = self.rng
        for _ in range(10000):
            n, (t, u) = r.randint(1, 40), r.sample(TOPICS, 2)
            if kind == "noul":
                q = {"type": "noul", "instructions": r.choice(NOUL).format(n=n, t=t, u=u),
                     "criteria": {"true": f"question {n} is about {t}"}}
            elif kind == "choice":
                q = {"type": "choice", "instructions": r.choice(CHOICE).format(n=n),
                     "criteria": {x.replace(" ", "_"): None for x in r.sample(TOPICS, 4)}}
            else:
                q = {"type": "score", "instructions": r.choice(SCORE).format(n=n, t=t, u=u),
                     "criteria": r.choice(LEVELS)}
            key = json.dumps(q, sort_keys=True)
            if key not in self.sent:
                self.sent.add(key)
                return q
        raise RuntimeError("no new question left to draw")

    def take(self, k):
        """k questions keyed q00..; 50 are 17 yes/no, 17 choices, 16 scores."""
        return {f"q{i:02d}": self.one(("noul", "choice", "score")[i % 3]) for i in range(k)}


def as_decide(qs):
    """The same questions on /v1/decide: each as lettered options."""
    out = []
    for q in qs.values():
        c = q["criteria"]
        options = (["No", "Yes"] if q["type"] == "noul" else
                   [k.replace("_", " ") for k in c] if q["type"] == "choice" else list(c))
        out.append({"text": q["instructions"], "options": options})
    return out


class Documents:
    """Documents of MMLU questions, numbered; no row is used twice."""

    def __init__(self, tokenize):
        self.rows, self.at, self.tokenize = common.mmlu_rows(20000), 0, tokenize

    def take(self, target):
        parts = []
        while not parts or len("\n\n".join(parts)) < target * 3.6:
            if self.at >= len(self.rows):
                raise RuntimeError("MMLU rows used up: fewer rounds or smaller documents")
            parts.append(f"Question {len(parts) + 1}. {common.question_text(self.rows[self.at])}")
            self.at += 1
        text = "\n\n".join(parts)
        return text, self.tokenize(text)


def metrics(port):
    """decisio's counters of interest from GET /metrics (sums over labels)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    want = {"decisio_new_state_seconds_sum": "state_s", "decisio_new_state_seconds_count": "states",
            "decisio_question_seconds_sum": "decision_s", "decisio_question_seconds_count": "questions",
            "decisio_question_passes_total": "passes", "decisio_merged_jobs_total": "merged_jobs"}
    out = dict.fromkeys(want.values(), 0.0)
    for line in c.getresponse().read().decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in want:
            out[want[name]] += float(line.rsplit(" ", 1)[1])
    return out


def split_add(into, before, after):
    for k in before:
        into[k] = into.get(k, 0.0) + after[k] - before[k]


def ask(port, route, doc, qs):
    """One timed request; returns (seconds, answers, what the response says
    of its state: `cached`, `tokens`, and `input_tokens` from its usage)."""
    body = {"state": doc, "questions": qs if route == WIRE else as_decide(qs)}
    seconds, out = common.post(port, route, body)
    if len(out["answers"]) != len(qs):
        raise RuntimeError(f"port {port} {route}: {len(out['answers'])} answers of {len(qs)}")
    state = dict(out.get("state") or out.get("x_state") or {})
    state["input_tokens"] = (out.get("usage") or {}).get("input_tokens")
    return seconds, out["answers"], state


def top(answer):
    if answer["type"] == "choice":
        return answer["choice"]
    if answer["type"] == "noul":
        return answer["noul"] >= 0.5
    p = answer["probabilities"]
    return max(p, key=lambda k: (p[k], -int(k)))


def concurrent_case(port, docs, bodies, clients, limit):
    """`bodies` (question sets) sent as requests on `docs` in turn by
    `clients` threads; returns (latencies, wall s, questions answered, requests
    left out at the deadline, errors)."""
    deadline = time.perf_counter() + limit

    def one(i):
        if time.perf_counter() > deadline:
            return None
        try:
            return common.post(port, WIRE, {"state": docs[i % len(docs)], "questions": bodies[i]})[0]
        except (OSError, RuntimeError) as e:
            return repr(e)[:200]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(one, range(len(bodies))))
    wall = time.perf_counter() - start
    lat = [d for d in done if isinstance(d, float)]
    errors = [d for d in done if isinstance(d, str)]
    per = len(bodies[0]) if bodies else 0
    return lat, wall, len(lat) * per, done.count(None), errors


def paired(values, ref):
    """Per-round ratios values[r] / ref[r], with their median and range."""
    ratios = [v / w for v, w in zip(values, ref) if w]
    return {"ratios": ratios, **(common.summarize(ratios) if ratios else {})}


def fmt(s, digits=2):
    return (f"{s['median']:.{digits}f} ({s['min']:.{digits}f} to {s['max']:.{digits}f})"
            if s and "median" in s else "n/a")


def start(servers, vllm_flags=()):
    """Starts the servers named (the vLLM backend with `vllm_flags` more);
    returns ({name: port}, [processes])."""
    ports, procs = {}, []
    try:
        if "mlx" in servers:
            p, ports["mlx"] = common.start_decisio()
            procs.append(p)
        if "vllm" in servers:
            up = common.free_port()
            procs.append(start_vllm(up, block_size=32))
            p, ports["vllm"] = common.start_decisio(
                extra=["--backend", "vllm", "--upstream", f"http://127.0.0.1:{up}",
                       *vllm_flags])
            procs.append(p)
        for name, pad in (("ref", "none"), ("ref-pad", None)):
            if name in servers:
                ports[name] = common.free_port()
                procs.append(start_reference(ports[name], pad_to=pad))
    except BaseException:
        stop(procs)
        raise
    return ports, procs


def stop(procs):
    for p in reversed(procs):
        if hasattr(p, "log"):
            stop_vllm(p)
        else:
            p.kill()
            p.wait()


def run(a, ports):
    """The rounds; returns the raw record."""
    decisio = [s for s in ("mlx", "vllm") if s in ports]
    tok = ((lambda t: common.post(ports[decisio[0]], "/tokenize",
                                  {"model": "model", "prompt": t})[1]["count"])
           if decisio else (lambda t: None))
    docs, qgen = Documents(tok), Questions(a.seed)
    subjects = [(s, r) for s in ports for r in ((WIRE, DECIDE) if s in decisio else (WIRE,))]
    key = lambda s, r: f"{s} {r}"  # noqa: E731
    times = {c: {key(*s): [] for s in subjects} for c in a.cases if c != "concurrent"}
    cached = {c: {key(*s): [] for s in subjects} for c in times}
    split = {c: {key(*s): {} for s in subjects if s[0] in decisio} for c in a.cases}
    conc = {s: [] for s in ports}
    agree, tokens = [], {"state": [], "document": []}
    sizes = {c: [] for c in ("read", "new", "seen")}
    for rnd in range(a.rounds + 1):
        warm = rnd == 0
        order = subjects[rnd % len(subjects):] + subjects[:rnd % len(subjects)]
        seen_docs = {}
        for case in ("read", "new", "seen"):
            if case not in a.cases:
                continue
            for srv, route in order:
                if case == "seen":
                    doc = seen_docs.get((srv, route))
                    if doc is None:  # `new` not run: the document read first, untimed
                        doc = docs.take(a.tokens)[0]
                        ask(ports[srv], route, doc, qgen.take(1))
                else:
                    doc, n = docs.take(a.state_tokens if case == "read" else a.tokens)
                    tokens["state" if case == "read" else "document"].append(n)
                    if case == "new":
                        seen_docs[(srv, route)] = doc
                qs = qgen.take(1 if case == "read" else a.questions)
                before = metrics(ports[srv]) if srv in decisio else None
                common.settle()
                secs, _, said = ask(ports[srv], route, doc, qs)
                if warm:
                    continue
                times[case][key(srv, route)].append(secs / (len(qs) if case == "seen" else 1))
                cached[case][key(srv, route)].append(said.get("cached"))
                if srv == "mlx" and route == WIRE and said.get("input_tokens"):
                    sizes[case].append({"state": said["tokens"], "questions": len(qs),
                                        "question_text": said["input_tokens"] - said["tokens"]})
                if before:
                    split_add(split[case][key(srv, route)], before, metrics(ports[srv]))
        if "ref" in ports and len(ports) > 1:
            doc, _ = docs.take(a.tokens)
            qs = qgen.take(a.questions)
            tops = {s: {k: top(x) for k, x in ask(ports[s], WIRE, doc, qs)[1].items()}
                    for s in ports}
            agree.append({s: sum(t[k] == tops["ref"][k] for k in qs)
                          for s, t in tops.items() if s != "ref"})
        if "concurrent" in a.cases:  # the warm-up's: one request per client
            for srv in list(ports)[rnd % len(ports):] + list(ports)[:rnd % len(ports)]:
                four = [docs.take(a.state_tokens)[0] for _ in range(4)]
                bodies = [qgen.take(5) for _ in range(a.clients if warm else a.requests)]
                before = metrics(ports[srv]) if srv in decisio else None
                common.settle()
                lat, wall, decided, left, errors = concurrent_case(ports[srv], four, bodies,
                                                                   a.clients, a.limit)
                if warm:
                    continue
                conc[srv].append({"latencies": lat, "wall_s": wall, "decisions": decided,
                                  "left_out": left, "errors": errors, "per_s": decided / wall})
                if before:
                    split_add(split["concurrent"][key(srv, WIRE)], before, metrics(ports[srv]))
        if not warm:
            print(f"[bench] round {rnd} of {a.rounds} done", flush=True)
    return {"subjects": [key(*s) for s in subjects], "seconds": times, "cached": cached,
            "split": split, "concurrent": conc, "agreement_with_ref": agree, "tokens": tokens,
            "sizes": sizes, "tail_tokens": tok(ANSWER_TAIL) if decisio else None}


# What follows a question's text in its prompt on the fixture (ChatML): the
# turn's end, the generation prompt, then the answer slot.
ANSWER_TAIL = "<|im_end|>\n<|im_start|>assistant\nAnswer:"
TARGETS = {"read": 1.0, "new": 0.6, "seen": 0.5}


def gemm_rate():
    """The machine's float32 product rate in GFLOP/s: numpy's BLAS on the
    fixture's largest linear shape (1,024 tokens by its MLP), median of 9."""
    import numpy as np
    cfg = json.loads((common.MODEL / "config.json").read_text())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, cfg["hidden_size"]), dtype=np.float32)
    w = rng.standard_normal((cfg["hidden_size"], cfg["intermediate_size"]), dtype=np.float32)
    x @ w
    times = []
    for _ in range(9):
        t = time.perf_counter()
        x @ w
        times.append(time.perf_counter() - t)
    times.sort()
    return 2 * x.shape[0] * w.shape[0] * w.shape[1] / times[4] / 1e9


def roofline(rec, summary, rate):
    """Per case, the floating-point work MLX's read of it takes on the
    fixture (the linear layers for every token, the output head once a
    question, attention's two products over every key a query sees) and
    the time it takes at `rate`: the floor no float32 implementation of the
    same prompts runs under on this machine, over the reference's time."""
    cfg = json.loads((common.MODEL / "config.json").read_text())
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    linear = 2 * layers * (2 * h * heads * hd + 2 * h * kvh * hd + 3 * h * cfg["intermediate_size"])
    att = 4 * layers * heads * hd  # per query and key seen
    out = {}
    for case, sizes in rec["sizes"].items():
        ref = ((summary.get(case) or {}).get(f"ref {WIRE}") or {}).get("time")
        if not sizes or not ref:
            continue
        flops = []
        for z in sizes:
            n, s_ = z["questions"], z["state"]
            q = z["question_text"] / n + (rec["tail_tokens"] or 0)
            f = n * (linear * q + 2 * h * vocab + att * (s_ * q + q * (q + 1) / 2))
            if case != "seen":
                f += linear * s_ + att * s_ * (s_ + 1) / 2
            flops.append(f / (n if case == "seen" else 1))
        floor = sorted(flops)[len(flops) // 2] / (rate * 1e9)
        out[case] = {"gflop": sorted(flops)[len(flops) // 2] / 1e9, "floor_s": floor,
                     "ref_s": ref["median"], "floor_ratio": floor / ref["median"],
                     "target": TARGETS[case], "question_tokens":
                     sum(z["question_text"] / z["questions"] for z in sizes) / len(sizes)
                     + (rec["tail_tokens"] or 0)}
    return out


def summarize(rec, ref="ref"):
    """Medians, ranges and paired ratios (to `ref`'s /v1/systemone) per case."""
    out = {}
    for case, per in rec["seconds"].items():
        base = per.get(f"{ref} {WIRE}")
        out[case] = {s: {"time": common.summarize(v) if v else None,
                         "ratio": paired(v, base) if base else None,
                         "ratio_pad": paired(v, per.get(f"ref-pad {WIRE}") or [])}
                     for s, v in per.items()}
    if any(rec["concurrent"].values()):
        c = rec["concurrent"]
        out["concurrent"] = {}
        for s, runs in c.items():
            lat = [x for r in runs for x in r["latencies"]]
            rate = [r["per_s"] for r in runs]
            out["concurrent"][s] = {
                "per_s": common.summarize(rate) if rate else None,
                "p50_s": common.nearest_rank(lat, 0.5), "p99_s": common.nearest_rank(lat, 0.99),
                "ratio": paired(rate, [r["per_s"] for r in c.get(ref, [])]),
                "left_out": sum(r["left_out"] for r in runs),
                "errors": sum(len(r["errors"]) for r in runs)}
    return out


def plot(summary, path, n):
    rows = [(case, s, v["time"]["median"]) for case, per in summary.items() if case != "concurrent"
            for s, v in per.items() if v["time"]]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        exe = common.DECISIO.parent / "examples" / "paired_bars"
        new, seen = summary.get("new", {}), summary.get("seen", {})
        if not exe.exists():
            return "not drawn (neither matplotlib nor the paired_bars example)"
        conc = summary.get("concurrent", {})
        if not new and not summary.get("read") and conc.get("ref"):
            ref = conc["ref"]["per_s"]["median"]
            bars = [{"name": NAMES[s], "a": v["per_s"]["median"], "b": ref}
                    for s, v in conc.items() if s != "ref" and v.get("per_s")]
            subprocess.run([str(exe), json.dumps({"rows": bars, "names": ["subject", "reference"],
                            "y": "decisions per second (median)", "title": "16 concurrent clients"}),
                            str(path)], check=True)
            return "drawn by the paired_bars example: each subject's decisions per second beside the reference's"
        if not new:
            read = summary.get("read", {})
            ref = (read.get(f"ref {WIRE}") or {}).get("time", {}).get("median")
            if not read or ref is None:
                return "not drawn (no new-document case, and no read case beside the reference)"
            bars = [{"name": s, "a": v["time"]["median"], "b": ref} for s, v in read.items() if v["time"]]
            subprocess.run([str(exe), json.dumps({"rows": bars, "names": ["subject", "reference"],
                            "y": "seconds per request (median)", "title": "one question on a new state"}),
                            str(path)], check=True)
            return "drawn by the paired_bars example: each subject's read beside the reference's"
        bars = [{"name": s, "a": v["time"]["median"],
                 "b": (seen.get(s) or {}).get("time", {}).get("median", 0) * n}
                for s, v in new.items() if v["time"]]
        subprocess.run([str(exe), json.dumps({"rows": bars, "names": ["new document", f"seen: {n} new"],
                        "y": "seconds per request (median)", "title": f"System One, {n} questions"}),
                        str(path)], check=True)
        return "drawn by the paired_bars example: new document vs as many new questions on it"
    cases = sorted({r[0] for r in rows})
    fig, axes = plt.subplots(1, max(1, len(cases)), figsize=(5 * max(1, len(cases)), 4.5))
    for ax, case in zip(axes if len(cases) > 1 else [axes], cases):
        mine = [r for r in rows if r[0] == case]
        ax.barh([r[1] for r in mine], [r[2] for r in mine])
        ax.set_title(CASES[case], fontsize=9)
        ax.set_xlabel("seconds (median)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return "drawn with matplotlib: each case's median seconds per subject"


def write(a, out, rec, summary, picture):
    m = common.machine()
    label = lambda s: f"{NAMES[s.split()[0]]}, {s.split()[1]}"  # noqa: E731
    toks = [t for t in rec["tokens"]["document"] if t]
    st = [t for t in rec["tokens"]["state"] if t]
    sizes = "; ".join(f"{min(t)} to {max(t)} tokens for ~{n}"
                      for t, n in ((toks, a.tokens), (st, a.state_tokens)) if t)
    lines = ["# System One: decisio beside the reference decisio 0.35.0, new questions only", "",
             f"Command: `python scripts/bench/systemone.py {rec['command']}`"
             " (`make bench-systemone` runs it with no options).",
             f"Machine: {m['cpus']} CPUs, {m['processor'] or 'x86_64'}, {m['platform']}; the fixture"
             f" (SmolLM2-135M-Instruct). Documents of MMLU questions{f' ({sizes})' if sizes else ''}, each read by"
             " one subject only; every question body sent once.", "",
             f"{a.rounds} timed rounds after one untimed round, the subjects in an order rotated"
             " each round. Times: median (min to max). Ratio: paired within a round, a subject's"
             " over the reference's (`--pad-to none`; ratio pad: over the default-padded one),"
             " median (min to max) of the rounds' ratios.", ""]
    for case, per in summary.items():
        lines += [f"## {case}: {CASES[case]}", ""]
        if case == "concurrent":
            lines += [f"{a.clients} clients, {a.requests} requests of 5 new questions on 4"
                      f" documents of ~{a.state_tokens} tokens, on {WIRE}; ratio = decisions per"
                      " second over the reference's (higher is faster).", "",
                      "| server | decisions/s | ratio | p50 s | p99 s | left out | errors |",
                      "|---|---|---|---|---|---|---|"]
            for s, v in per.items():
                p50, p99 = v["p50_s"], v["p99_s"]
                lines.append(f"| {NAMES[s]} | {fmt(v['per_s'])} | {fmt(v['ratio'])} |"
                             f" {p50 if p50 is None else f'{p50:.2f}'} |"
                             f" {p99 if p99 is None else f'{p99:.2f}'} | {v['left_out']} |"
                             f" {v['errors']} |")
        else:
            d = 4 if case == "seen" else 2
            lines += [{"read": f"One new question on a new document of ~{a.state_tokens} tokens:"
                       " the whole request, mostly the state's read.",
                       "new": f"A new document of ~{a.tokens} tokens and {a.questions} new"
                       " questions in one request: the whole request.",
                       "seen": f"{a.questions} new questions on the document the subject read in"
                       " `new` this round: the request's time over its questions."}[case], ""]
            lines += ["| server, route | time | ratio | ratio pad | state cached |",
                      "|---|---|---|---|---|"]
            for s, v in per.items():
                flags = rec["cached"][case][s]
                hits = (f"{sum(bool(f) for f in flags)} of {len(flags)}"
                        if any(f is not None for f in flags) else "not reported")
                lines.append(f"| {label(s)} | {fmt(v['time'], d)} | {fmt(v['ratio'])} |"
                             f" {fmt(v['ratio_pad'])} | {hits} |")
        lines.append("")
    if rec["agreement_with_ref"]:
        lines += ["## Agreement", "", "Top options agreeing with the reference (`--pad-to none`)"
                  f" of {a.questions}, the same document and questions on every server's /v1/systemone,"
                  " one document per round (the first is the warm-up's):", ""]
        for s in rec["agreement_with_ref"][0]:
            lines.append(f"- {NAMES[s]}: " + ", ".join(str(d[s]) for d in rec["agreement_with_ref"]))
        lines.append("")
    lines += ["## Split of time (decisio's /metrics)", "",
              "Over the timed rounds: seconds reading new states (`decisio_new_state_seconds`),"
              " seconds of the questions (`decisio_question_seconds`' sum less the states'),"
              " passes and merged jobs.", "",
              "| case | server, route | new states | state read s | questions | question s |"
              " passes | merged jobs |", "|---|---|---|---|---|---|---|---|"]
    for case, per in rec["split"].items():
        for s, v in per.items():
            if v:
                lines.append(f"| {case} | {label(s)} | {v['states']:.0f} | {v['state_s']:.2f} |"
                             f" {v['questions']:.0f} | {v['decision_s'] - v['state_s']:.2f} |"
                             f" {v['passes']:.0f} | {v['merged_jobs']:.0f} |")
    if rec.get("roofline"):
        subjects = [x for x in summary.get("read", summary.get("new", {}))
                    if x.split()[0] in ("mlx", "vllm")]
        lines += ["", "## Roofline (both backends)", "",
                  f"The work of each case's prompts on the fixture at the machine's float32 product rate,"
                  f" {rec['gemm_rate']:.0f} GFLOP/s (numpy's BLAS on the fixture's largest linear shape, in"
                  " this run): the linear layers for every token, the output head once a question,"
                  " attention's two products over every key each query sees. A question's tokens:"
                  f" its text (the response's `usage` less the state's) and the {rec['tail_tokens']}"
                  " of the turn's end and answer slot. The floor is the time of that work at that"
                  " rate; its ratio is over the reference's median time. A target under the floor's"
                  " ratio is out of reach of float32 arithmetic on this machine, whatever the kernels."
                  " Both backends read the same prompts, so the floor bounds the vLLM backend's float32"
                  " upstream as it bounds MLX; each decisio subject's median ratio is set beside it.",
                  "", "| case | question tokens | GFLOP | floor s | reference s | floor ratio | target | "
                  + " | ".join(label(x) for x in subjects) + " |",
                  "|---|---|---|---|---|---|---|" + "---|" * len(subjects)]
        for case, r in rec["roofline"].items():
            got = [((summary.get(case) or {}).get(x) or {}).get("ratio") or {} for x in subjects]
            lines.append(f"| {case} | {r['question_tokens']:.1f} | {r['gflop']:.1f} | {r['floor_s']:.3f} |"
                         f" {r['ref_s']:.3f} | {r['floor_ratio']:.2f} | {r['target']} | "
                         + " | ".join(f"{g['median']:.2f}" if "median" in g else "n/a" for g in got)
                         + " |")
    lines += ["", f"`times.png`: {picture}. `results.json`: every time and latency.", ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=3000, help="the 50-question documents")
    ap.add_argument("--questions", type=int, default=50, help="per request of new and seen")
    ap.add_argument("--state-tokens", type=int, default=1000, help="read and concurrent cases")
    ap.add_argument("--cases", default="read,new,seen,concurrent")
    ap.add_argument("--servers", default="mlx,vllm,ref,ref-pad")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--limit", type=float, default=900, help="seconds per concurrent run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="systemone-bench", help="the record: runs/<date>_NAME")
    ap.add_argument("--vllm-flags", default="",
                    help="more flags of the vLLM backend's server, e.g. '--fair-seconds 0'")
    ap.add_argument("--rewrite", action="store_true",
                    help="write runs/<date>_NAME's summary again from its results.json")
    a = ap.parse_args()
    if a.rewrite:
        return rewrite(a.name)
    a.cases, a.servers = a.cases.split(","), a.servers.split(",")
    bad = set(a.cases) - set(CASES) | set(a.servers) - set(NAMES)
    if bad:
        ap.error(f"unknown: {', '.join(sorted(bad))}")
    out = common.run_dir(a.name)
    ports, procs = start(a.servers, a.vllm_flags.split())
    try:
        rec = run(a, ports)
    finally:
        stop(procs)
    rec["command"] = " ".join(sys.argv[1:])
    summary = summarize(rec)
    if "mlx" in a.servers:
        rec["gemm_rate"] = gemm_rate()
        rec["roofline"] = roofline(rec, summary, rec["gemm_rate"])
    picture = plot(summary, out / "times.png", a.questions)
    (out / "results.json").write_text(json.dumps(
        {"machine": common.machine(), "options": vars(a), **rec, "summary": summary}, indent=2) + "\n")
    write(a, out, rec, summary, picture)


def rewrite(name):
    """The summary of runs/<date>_NAME (or runs/NAME) written again from
    its results.json: the figures as recorded, the text as this script
    writes it now."""
    out = common.ROOT / "runs" / name
    if not out.exists():
        out = common.ROOT / "runs" / f"{datetime.date.today().isoformat()}_{name}"
    rec = json.loads((out / "results.json").read_text())
    a = argparse.Namespace(**rec.pop("options"))
    rec.pop("machine", None)
    rec.pop("summary", None)
    if "command" not in rec:  # records from before the command was kept
        rec["command"] = " ".join(f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, list) else v}"
                                  for k, v in (("servers", a.servers), ("rounds", a.rounds),
                                               ("cases", a.cases), ("name", a.name)))
    summary = summarize(rec)
    if rec.get("gemm_rate"):
        rec["roofline"] = roofline(rec, summary, rec["gemm_rate"])
    picture = plot(summary, out / "times.png", a.questions)
    write(a, out, rec, summary, picture)


if __name__ == "__main__":
    main()
