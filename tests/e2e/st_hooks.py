"""Schemathesis hooks: the rules of openapi/openapi.yaml that JSON Schema
cannot state, taught to the generator.

Each rule is written in the description's prose and enforced by the server
with a 400 that names the field. The hooks apply to *positive* cases only
(data the generator means to be valid), turning a draw into one that also
keeps these rules; negative cases reach the server as drawn. Every rule
here is listed in docs/design/openapi.md.

1. A task registration's example labels are among its options (a `choice`
   task) or labels (an `intent` task), or a System One task's answer keys,
   and every option has an example (so there are at least as many
   examples as options); a System One task's object states show a key
   (one not starting with `_`).
2. The question of a chat decision is the last message, the user's, and
   is not blank.
3. No two options (or labels) are equal after trimming whitespace.
4. The prompt (each prompt of a list), and the prompt plus `max_tokens`,
   fit the context, and a list of two or more prompts is not streamed; so does
   a state with each of its questions (a System One question too, its
   state, instructions and options counted as the JSON they are sent as). The generator cannot count tokens:
   a draw is kept when its text's UTF-8 bytes (at least its tokens, for
   the byte-level tokenizers served here) plus a fixed allowance for the
   template's own tokens fit `DECISIO_ST_CONTEXT`, the server's
   `--max-model-len`.
5. A stop sequence, and an intent task's label (trimmed), is at most
   `MAX_TEXT_BYTES` bytes of UTF-8 (the description's `maxLength` counts
   characters; the server counts bytes).
6. A task's prediction sets (`x_coverage`, with `x_conformal_score`) and
   its certificate (`x_certify`, the reference form's `certify`) need a
   holdout large enough for the level, which depends on the split of the
   examples: valid draws leave them out (tests/tasks.rs and
   tests/certify.rs register them).
7. A registration in the reference's form asks one question in every
   example (the first example's, here) and answers it with its keys, every
   key in turn, as rule 1 labels decisio's own form; its states are not
   blank (as decisio's own form's pattern says).
8. An import is an export a server of the same serving stack wrote (its
   records are the server's own files): valid draws are not generated
   (tests/certify.rs imports a real export, and one of another stack).
9. Certifying a task again takes labelled examples of that task's
   question (its type, options and instructions, and its answer keys):
   valid draws are not generated (tests/certify.rs certifies again).
10. `x_rotations` is at most the task's number of options, and 1 where
   they have no letters (an intent task, a yes/no question asked in
   words): valid draws leave it out (tests/tasks.rs reads rotations).
11. An abstention task's examples ask one choice question of one option
   set holding the declared key, and an import is a listing of a server
   of the same stack: valid draws are not generated (tests/abstention.rs
   registers, imports and deletes them).
"""

import json
import os

import schemathesis

CONTEXT = int(os.environ.get("DECISIO_ST_CONTEXT", "4096"))
# Tokens a chat template or the decision prompt adds per message (role
# headers) and per question (the instruction, the letters), generously.
PER_MESSAGE = 16
PER_PROMPT = 64
PER_OPTION = 8
# The server's limits in bytes of a stop sequence and of an intent
# task's label (docs/limits.md).
MAX_TEXT_BYTES = 256


def _positive(case):
    meta = getattr(case, "meta", None)
    return meta is None or meta.generation.mode.is_positive


@schemathesis.hook
def map_case(context, case):
    op = context.operation
    if op is None or not _positive(case) or not isinstance(case.body, dict):
        return case
    body = case.body
    if op.method.upper() == "POST" and op.path == "/v1/tasks":
        if _reference_form(body):
            _reference_task(body)
        _task_labels(body)
        for key in ("x_coverage", "x_conformal_score", "x_certify", "certify", "x_rotations"):
            body.pop(key, None)
    elif op.method.upper() == "POST" and op.path == "/v1/chat/completions":
        if isinstance(body.get("decisio"), dict) and isinstance(body.get("messages"), list):
            _decision_question(body["messages"])
    return case


def _wire_keys(question):
    """A System One question's answer keys, in the order asked."""
    if not isinstance(question, dict):
        return []
    criteria = question.get("criteria")
    if question.get("type") == "choice" and isinstance(criteria, dict):
        return list(criteria)
    if question.get("type") == "score" and isinstance(criteria, list):
        return [str(i) for i in range(len(criteria))]
    return ["no", "yes"] if question.get("type") == "noul" else []


def _task_names(body):
    if "systemone" in body:
        return _wire_keys(body["systemone"])
    kind = body.get("kind") or "choice"
    return body.get("labels") if kind == "intent" else body.get("options")


def _reference_form(body):
    return "id" in body and "name" not in body


def _reference_question(body):
    """The first example's question, when the draw has one."""
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples or not isinstance(examples[0], dict):
        return None
    request = examples[0].get("request")
    questions = request.get("questions") if isinstance(request, dict) else None
    if not isinstance(questions, dict) or not questions:
        return None
    return next(iter(questions.values()))


def _reference_task(body):
    """Rule 7: one question in every example, answered by its keys in
    turn."""
    question = _reference_question(body)
    keys = _wire_keys(question)
    if not keys:
        return
    for i, example in enumerate(body["examples"]):
        if isinstance(example, dict) and isinstance(example.get("request"), dict):
            example["request"]["questions"] = {"q": question}
            example["request"].pop("x_orders", None)
            example["answer"] = keys[i % len(keys)]


def _task_labels(body):
    """Rule 1: each example's label becomes a name of the task, in turn,
    so that every name has an example where there are enough examples."""
    names = _task_names(body)
    examples = body.get("examples")
    if not isinstance(names, list) or not names or not isinstance(examples, list):
        return
    for i, example in enumerate(examples):
        if isinstance(example, dict):
            example["label"] = names[i % len(names)]


def _decision_question(messages):
    """Rule 2: the last message is the user's, with a question in it."""
    if not messages or not isinstance(messages[-1], dict):
        return
    last = messages[-1]
    last["role"] = "user"
    content = last.get("content")
    if not isinstance(content, str) or not content.strip():
        last["content"] = "Which option?"



@schemathesis.hook
def filter_case(context, case):
    """Rules 3, 4 and 5: drop positive draws that break them."""
    op = context.operation
    if op is None or not _positive(case) or not isinstance(case.body, dict):
        return True
    body = case.body
    path = op.path
    if path in ("/v1/tasks/import", "/v1/tasks/{id}/certify", "/v1/abstention/tasks",
                "/v1/abstention/tasks/import"):
        return False
    if path == "/v1/decide":
        state = _bytes(body.get("state"))
        for q in body.get("questions") or []:
            if not isinstance(q, dict):
                continue
            options = q.get("options") or []
            if not _distinct(options):
                return False
            if state + _question(q.get("text"), options) > CONTEXT:
                return False
        return True
    if path == "/v1/systemone":
        state = _json_bytes(body.get("state"))
        questions = body.get("questions")
        for q in (questions.values() if isinstance(questions, dict) else []):
            if not isinstance(q, dict):
                continue
            criteria = q.get("criteria")
            options = (list(criteria.items()) if isinstance(criteria, dict)
                       else [(None, c) for c in criteria] if isinstance(criteria, list) else [])
            text = _json_bytes(q.get("instructions")) + sum(
                PER_OPTION + _bytes(k) + _json_bytes(v) for k, v in options)
            if state + PER_PROMPT + text > CONTEXT:
                return False
        return True
    if path in ("/v1/chat/completions", "/v1/completions") and not _short(body.get("stop")):
        return False
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        prompt = sum(PER_MESSAGE + _bytes(_content(m)) for m in messages) + PER_PROMPT
        decisio = body.get("decisio")
        if isinstance(decisio, dict):
            options = decisio.get("options") or []
            return _distinct(options) and prompt + _question("", options) <= CONTEXT
        new = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        return prompt + new < CONTEXT
    if path == "/v1/completions":
        prompt = body.get("prompt")
        listed = isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str))
        prompts = prompt if listed else [prompt]
        if len(prompts) > 1 and body.get("stream") is True:
            return False
        new = body.get("max_tokens")
        new = 16 if new is None else new
        return all((len(p) if isinstance(p, list) else _bytes(p)) + new < CONTEXT for p in prompts)
    if path == "/v1/embeddings":
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else [inputs]
        return all((len(i) if isinstance(i, list) else _bytes(i) + 2) <= CONTEXT for i in inputs)
    if path == "/v1/tasks" and _reference_form(body):
        question = _reference_question(body)
        keys = _wire_keys(question)
        requests = [e.get("request") for e in body.get("examples") or [] if isinstance(e, dict)]
        if not keys or len(requests) < len(keys) or not all(isinstance(r, dict) for r in requests):
            return False
        text = _json_bytes(question) + PER_PROMPT + PER_OPTION * len(keys)
        return all(_shown(r.get("state")) and _not_blank(r.get("state"))
                   and _json_bytes(r.get("state")) + text <= CONTEXT for r in requests)
    if path == "/v1/tasks" and "systemone" in body:
        keys = _wire_keys(body["systemone"])
        examples = [e for e in body.get("examples") or [] if isinstance(e, dict)]
        if len(examples) < len(keys):
            return False
        question = _json_bytes(body["systemone"]) + PER_PROMPT + PER_OPTION * len(keys)
        return all(_shown(e.get("state")) and _json_bytes(e.get("state")) + question <= CONTEXT
                   for e in examples)
    if path == "/v1/tasks":
        names = body.get("options") or body.get("labels") or []
        if not _distinct(names) or len(body.get("examples") or []) < len(names):
            return False
        if not _short([n.strip() for n in body.get("labels") or [] if isinstance(n, str)]):
            return False
        question = _question(body.get("question"), body.get("options") or [])
        return all(
            _bytes(e.get("state")) + question <= CONTEXT
            for e in body.get("examples") or []
            if isinstance(e, dict)
        )
    return True


def _bytes(text):
    return len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0


def _json_bytes(value):
    """A value's bytes as the prompt shows it, at most: text as it is,
    anything else as JSON."""
    if value is None:
        return 0
    if isinstance(value, str):
        return _bytes(value)
    return _bytes(json.dumps(value, ensure_ascii=False))


def _not_blank(state):
    """Rule 7: a text state is not blank (the example schema of decisio's
    own form says so with a pattern; the reference form's request is a
    System One request, whose state may be)."""
    return not isinstance(state, str) or bool(state.strip())


def _shown(state):
    """Rule 1: an object state shows at least one key."""
    return not isinstance(state, dict) or any(not k.startswith("_") for k in state)


def _content(message):
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content


def _question(text, options):
    return PER_PROMPT + _bytes(text) + sum(PER_OPTION + _bytes(o) for o in options)


def _distinct(names):
    trimmed = [n.strip() for n in names if isinstance(n, str)]
    return len(set(trimmed)) == len(trimmed)


def _short(texts):
    """Rule 5: every text (one, or a list) within MAX_TEXT_BYTES."""
    texts = texts if isinstance(texts, list) else [texts]
    return all(_bytes(t) <= MAX_TEXT_BYTES for t in texts)
