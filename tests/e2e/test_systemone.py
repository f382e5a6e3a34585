"""POST /v1/systemone through System One's own clients: TypeSafe's official
Python SDK (`typesafe-sdk`, sync and async, zstd-compressed bodies) and
jevcompat, the wire's conformance suite, against a real server on the
fixture (docs/design/systemone.md)."""

import asyncio
import gzip
import http.client
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from typesafe_sdk import AsyncTypeSafeClient, Choice, Noul, RetryPolicy, Score, TypeSafeClient

from conftest import API_KEY, MODEL, start_server, stop_server

TICKET = ("I was charged twice for March. Support promised a refund last week and nothing came. "
          "If it is not fixed today I will dispute both charges with my bank.")


def questions(options=3):
    crit = {"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": None}
    if options == 255:
        crit = {"Billing": "Payments, invoices, refunds",
                **{f"Queue {i:03d}": f"Tickets routed to queue {i}" for i in range(1, 255)}}
    elif options == 2:
        crit = {"Billing": "Payments", "Technical": "Bugs and outages"}
    return {
        "refund": Noul(instructions="Does the customer want money back?",
                       criteria={"true": "They ask for a refund or a chargeback"}),
        "team": Choice(instructions="Which team should handle this ticket?", criteria=crit),
        "anger": Score(instructions="How frustrated is the customer?",
                       criteria=["Calm", "Frustrated", "Very angry"]),
    }


def check(result, options):
    assert 0 <= result.nouls["refund"].noul <= 1
    team = result.choices["team"]
    assert len(team.probabilities) == options
    assert team.choice == max(team.probabilities, key=team.probabilities.get)
    assert abs(sum(team.probabilities.values()) - 1) < 1e-9
    anger = result.scores["anger"]
    assert anger.legend == {0: "Calm", 1: "Frustrated", 2: "Very angry"}
    assert abs(anger.score - sum(i * p for i, p in anger.probabilities.items())) < 1e-9
    assert 0 <= anger.confidence <= 1 and 0 <= team.confidence <= 1
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 3


def sync_client(server, **kw):
    return TypeSafeClient(api_key=API_KEY, base_url=server, retry=RetryPolicy(max_retries=0),
                          timeout=600, **kw)


@pytest.mark.parametrize("options", [2, 3, 255])
def test_the_official_sdk_asks_and_parses_every_type(server, options):
    with sync_client(server) as client:
        result = client.system_one(state=TICKET, questions=questions(options))
        check(result, options)
        assert any(m.name == "jev-latest" for m in client.models.list().models)


def test_structured_states_and_the_async_client(server):
    async def run():
        async with AsyncTypeSafeClient(api_key=API_KEY, base_url=server, timeout=600,
                                       retry=RetryPolicy(max_retries=0)) as client:
            as_object = await client.system_one(
                state={"subject": "Charged twice", "body": TICKET, "customer": {"plan": "pro"}},
                questions=questions())
            as_array = await client.system_one(
                state=["Charged twice for March.", "Refund promised, never came.", "Will dispute."],
                questions=questions())
            return as_object, as_array

    for result in asyncio.run(run()):
        check(result, 3)


def test_compressed_bodies_are_read_and_answer_the_same(server):
    """The SDK compresses bodies of 1 KiB and more with zstd; gzip is read
    too; both answer exactly as the plain body does."""
    body = {"state": TICKET * 8, "questions": {k: q.model_dump(exclude_none=True)
                                                for k, q in questions().items()}}
    raw = json.dumps(body).encode()
    assert len(raw) > 1024
    with sync_client(server, compression="zstd") as zstd_client, \
            sync_client(server, compression=False) as plain_client:
        zstd = zstd_client.system_one(state=body["state"], questions=questions())
        plain = plain_client.system_one(state=body["state"], questions=questions())
    assert zstd.choices == plain.choices and zstd.scores == plain.scores and zstd.nouls == plain.nouls

    def post(data, headers):
        req = urllib.request.Request(server + "/v1/systemone", data=data, method="POST",
                                     headers={"Authorization": f"Bearer {API_KEY}",
                                              "Content-Type": "application/json", **headers})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    gz = post(gzip.compress(raw), {"Content-Encoding": "gzip"})
    assert gz["answers"] == post(raw, {})["answers"]
    assert gz["answers"]["team"]["probabilities"] == plain.choices["team"].probabilities


def jevcompat(base, *args):
    """Runs `jevcompat test` and returns its JSON report."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.json"
        done = subprocess.run([str(Path(sys.executable).parent / "jevcompat"), "test", base, "--json", str(report), *args],
                              capture_output=True, text=True, timeout=1500)
        assert report.exists(), done.stdout + done.stderr
        return json.loads(report.read_text()), done.stdout


@pytest.mark.parametrize("auth,backend", [(False, "mlx"), (True, "mlx"), (False, "vllm")])
def test_jevcompat_finds_the_route_conformant(auth, backend, request):
    """jevcompat 0.1.1 (every MUST and SHOULD) against the fixture, without
    and with an API key (the auth checks run only with one), on the MLX
    backend and on the vLLM backend in front of a real vLLM. The key is
    checked in the HTTP layer, before any backend (src/http/auth.rs), so
    its checks run on one backend: the vLLM backend runs without one."""
    state_dir = tempfile.mkdtemp(prefix="decisio-jevcompat-")
    args = ["--model", str(MODEL), "--state-dir", state_dir] + (["--api-key", "jev-key"] if auth else [])
    if backend == "vllm":
        args += ["--backend", "vllm", "--upstream", request.getfixturevalue("real_vllm")]
    proc, base = start_server(args)
    try:
        report, out = jevcompat(base, "--timeout", "600", *(["--key", "jev-key"] if auth else []))
    finally:
        stop_server(proc)
    assert "conformant to spec" in out and "not conformant" not in out, out
    summary = [line for line in out.splitlines() if line.startswith("conformant")]
    assert summary, out
    must, must_of, should, should_of = re.search(
        r"MUST (\d+)/(\d+), SHOULD (\d+)/(\d+)", summary[0]).groups()
    assert (must, should) == (must_of, should_of), summary[0]  # every one checked passes
    # The JSON report, check by check: none failed, and as many passed as
    # the spec has for the run (runs/2026-12-03_systemone-conformance: 32
    # MUSTs, 13 SHOULDs without a key, 15 with one), so no check can drop
    # out unnoticed.
    assert not report["aborted"], report["aborted"]
    results = report["results"]
    failed = [r["id"] for r in results if r["status"] not in ("pass", "skip")]
    assert not failed, failed
    passed = {level: sum(r["level"] == level and r["status"] == "pass" for r in results)
              for level in ("MUST", "SHOULD")}
    assert passed == {"MUST": 32, "SHOULD": 15 if auth else 13}, (passed, summary[0])
    assert (int(must), int(should)) == (passed["MUST"], passed["SHOULD"]), summary[0]


# The reference's prompt-identity requests (target/reference/systemone/fixture.json, a list of
# {request, questions, input_tokens} from scripts/reference/systemone_prompts.py:
# every type, string/object/array states, Unicode keys, 2 to 255 options).
REFERENCE_DIR = Path(os.environ.get("DECISIO_REFERENCE_DIR", Path(__file__).resolve().parents[2] / "target/reference"))
TWO_ENGINES = 40


# The reference's block on the fixture (its engine's `block_size`, conftest's
# start_reference), which decisio is given as --pad-block.
REFERENCE_BLOCK = "32"
# The shared real vLLM serves a context of 4,096 tokens (conftest's
# start_vllm), the reference 8,192: the vLLM backend is asked the first 20
# requests whose prompts fit (counted input tokens up to 3,000; the MLX
# backend is asked all 40).
VLLM_REQUESTS, VLLM_FITS = 20, 3000


@pytest.mark.parametrize("backend", ["mlx", "vllm"])
def test_the_reference_decisio_on_vllm_answers_as_decisio_does(backend, reference_decisio, request):
    """The reference decisio 0.35.0 serving the fixture on vLLM's CPU build
    with its default padding (each state front-padded with newlines to its
    block) and decisio padding to the same block, on the MLX backend and on
    the vLLM backend in front of a real vLLM, answer the same System One
    requests with the same top option and every probability within 1e-3
    (two engines: the prompts are the same token for token,
    tests/systemone.rs), and count the same usage."""
    data = json.loads((REFERENCE_DIR / "systemone/fixture.json").read_text())
    args = ["--model", str(MODEL), "--api-key", API_KEY, "--pad-block", REFERENCE_BLOCK]
    if backend == "vllm":
        args += ["--backend", "vllm", "--upstream", request.getfixturevalue("real_vllm")]
    proc, server = start_server(args)
    requests, asked, worst = 0, 0, 0.0

    def post(base, body, key=None, route="/v1/systemone"):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(base + route, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{base}{route} answered {e.code}: {e.read()[:2000]!r}") from None

    try:
        # The state really is padded: /v1/decide counts a multiple of the block.
        decided = post(server, {"state": TICKET, "questions": [
            {"text": "Is this about billing?", "options": ["yes", "no"]}]}, API_KEY, "/v1/decide")
        assert decided["state"]["tokens"] % int(REFERENCE_BLOCK) == 0, decided["state"]
        items = data[:TWO_ENGINES]
        if backend == "vllm":
            items = [i for i in items if i["input_tokens"] <= VLLM_FITS][:VLLM_REQUESTS]
        for item in items:
            body = item["request"]
            ours, theirs = post(server, body, API_KEY), post(reference_decisio, body)
            assert ours["usage"] == theirs["usage"], (body, ours["usage"], theirs["usage"])
            assert sorted(ours["answers"]) == sorted(theirs["answers"]) == sorted(body["questions"])
            for qid, a in theirs["answers"].items():
                b = ours["answers"][qid]
                assert a["type"] == b["type"], qid
                if a["type"] == "noul":
                    pairs = [(a["noul"], b["noul"])]
                else:
                    assert a.get("choice") == b.get("choice") or a["type"] == "score", (qid, a, b)
                    assert list(a["probabilities"]) == list(b["probabilities"]), qid
                    top = max(a["probabilities"], key=a["probabilities"].get)
                    assert top == max(b["probabilities"], key=b["probabilities"].get), (qid, a, b)
                    pairs = [(a["probabilities"][k], b["probabilities"][k]) for k in a["probabilities"]]
                for p, q in pairs:
                    worst = max(worst, abs(p - q))
                    assert abs(p - q) <= 1e-3, (qid, p, q)
                asked += 1
            requests += 1
    finally:
        stop_server(proc)
    # Every request compared (the vLLM backend's first 20 that fit), and
    # every question of each.
    assert requests == len(items) == (VLLM_REQUESTS if backend == "vllm" else TWO_ENGINES)
    assert asked == sum(len(i["request"]["questions"]) for i in items)
    print(f"two engines ({backend}): {asked} questions, largest difference {worst:.2e}")


def post_json(base, path, body):
    """(status, headers, JSON body) of a POST, errors included."""
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def queue_depth(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return int(float(re.search(r"^decisio_queue_depth (\S+)$", text, re.M).group(1)))


def retries_counted(base):
    """decisio_client_retries_total of POST /v1/systemone, by retry label."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(
        r'^decisio_client_retries_total\{retry="([^"]+)",route="/v1/systemone"\} (\S+)$', text, re.M)}


@pytest.mark.parametrize("backend", ["mlx", "vllm"])
def test_a_full_queue_is_retried_as_its_headers_say(backend, caplog, request):
    """A full queue (`--max-queue 1`: a long generation running, on MLX
    another job waiting) answers System One 503 `overloaded_error` with
    `Retry-After` and `retry-after-ms`; typesafe-sdk waits what they say
    (its own backoff would wait at most 0.5 s before its first retry), its
    retries carry `X-TypeSafe-Retry-Count`, which decisio counts, and the
    request is answered once the queue has room. A request over the context
    is refused with a 4xx meanwhile, never a 503. The long generation holds
    its place until its client hangs up: on MLX the engine streams it token
    by token; the vLLM backend (in front of a real vLLM, whose jobs in
    flight are its queue) reads it whole, and its client's hanging up
    cancels it there."""
    args = ["--model", str(MODEL), "--max-queue", "1"]
    if backend == "vllm":
        args += ["--backend", "vllm", "--upstream", request.getfixturevalue("real_vllm")]
    proc, base = start_server(args)
    try:
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 1500 if backend == "mlx" else 4000,  # held longer than the 2.5 s below
                "temperature": 0, "ignore_eos": True, "stream": True}
        running = http.client.HTTPConnection(base.removeprefix("http://"), timeout=600)
        running.request("POST", "/v1/chat/completions", json.dumps(body),
                        {"Content-Type": "application/json"})
        if backend == "mlx":
            stream = running.getresponse()
            assert stream.status == 200, stream.read()
            while not stream.readline().startswith(b"data:"):  # the engine took it
                pass
        else:  # its answer comes whole at its end: wait for its place taken
            deadline = time.time() + 60
            while queue_depth(base) < 1:
                assert time.time() < deadline, "the generation took no place"
                time.sleep(0.05)
        waiting = threading.Thread(target=lambda: post_json(base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}))
        if backend == "mlx":  # the MLX queue holds one job beside the running one
            waiting.start()
            deadline = time.time() + 60
            while queue_depth(base) < 2:
                assert time.time() < deadline, "no job waited in the queue"
                time.sleep(0.05)
        # Refused while the queue is full, in System One's shape.
        wire = {"state": TICKET, "questions": {"team": {
            "type": "choice", "instructions": "Which team?",
            "criteria": {"Billing": None, "Technical": None}}}}
        status, headers, answer = post_json(base, "/v1/systemone", wire)
        assert status == 503, answer
        assert answer["detail"]["error_type"] == "overloaded_error", answer
        assert (headers["retry-after"], headers["retry-after-ms"]) == ("1", "1000")
        # A request that could never fit is refused as such, full queue or
        # not: a 4xx its client does not retry.
        status, headers, answer = post_json(base, "/v1/systemone", {**wire, "state": "word " * 20000})
        assert 400 <= status < 500, answer
        assert "retry-after" not in headers, headers

        # The SDK retries as told; the queue frees 2.5 s after it starts,
        # when the long generation hangs up and the engine frees its place.
        caplog.set_level(logging.INFO, logger="typesafe_sdk")
        result = {}
        client = TypeSafeClient(api_key=API_KEY, base_url=base, timeout=600,
                                retry=RetryPolicy(max_retries=8, timeout=120))
        asking = threading.Thread(target=lambda: result.update(
            r=client.system_one(state=TICKET, questions=questions())))
        asking.start()
        time.sleep(2.5)
        running.close()
        asking.join(timeout=300)
        if waiting.ident is not None:
            waiting.join(timeout=300)
        assert "r" in result, "the SDK's request was not answered"
        check(result["r"], 3)
        # The SDK's log, in order: each 503 it read, then the retry after it.
        log = [(rec.created, rec.getMessage()) for rec in caplog.records if rec.name.startswith("typesafe_sdk")]
        numbers, waits, last_503 = [], [], None
        for created, message in log:
            if re.search(r" <- 503 in ", message):
                last_503 = created
            elif m := re.search(r" retry (\d+)$", message):
                numbers.append(int(m.group(1)))
                waits.append(created - last_503)
        assert len(numbers) >= 2 and numbers == list(range(1, len(numbers) + 1)), log
        assert re.search(r" <- 200 in ", log[-1][1]), log
        # Retry-After's second each time, where the SDK's own backoff waits
        # at most 0.5 s before its first retry.
        assert all(w >= 0.95 for w in waits), waits
        want = {}
        for n in numbers:
            label = str(n) if n < 4 else "4+"
            want[label] = want.get(label, 0) + 1
        assert retries_counted(base) == want, (retries_counted(base), numbers)
    finally:
        stop_server(proc)
