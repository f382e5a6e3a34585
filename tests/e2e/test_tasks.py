"""Tasks through the official OpenAI Python SDK: the example registration
(examples/task_yesno.json) registered with the SDK's generic `post`,
followed to `ready`, then named in a chat decision (`extra_body`) and in
`POST /v1/decide`."""

import json
import math
import pathlib
import time

import openai
import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples/task_yesno.json"


def test_a_registered_task_answers_through_the_sdk(client):
    body = json.loads(EXAMPLE.read_text())
    task = client.post("/tasks", cast_to=object, body=body)
    assert task["object"] == "task" and task["status"] == "queued"
    assert task["progress"]["total"] == len(body["examples"])
    tid = task["id"]

    deadline = time.time() + 300
    while task["status"] in ("queued", "running"):
        assert time.time() < deadline, task
        time.sleep(0.3)
        task = client.get(f"/tasks/{tid}", cast_to=object)
    assert task["status"] == "ready", task
    result = task["result"]
    t = result["temperature"]
    assert 0.01 <= t <= 100
    for key in ("before", "after"):
        f = result[key]
        assert 0 <= f["accuracy"] <= 1 and f["nll"] > 0 and 0 <= f["ece"] <= 1
        assert sum(b["count"] for b in f["reliability"]) == result["holdout_examples"]
    listed = client.get("/tasks", cast_to=object)
    assert [x["id"] for x in listed["data"]] == [tid]

    # A chat decision naming the task: its question, options and temperature.
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "system", "content": "Refund my order 4410, it never arrived."},
                  {"role": "user", "content": "Does the customer ask for a refund?"}],
        extra_body={"decisio": {"task": "refund", "abstain_below": 0.01}})
    answer = r.model_extra["decisio"]["answer"]
    assert answer["temperature"] == pytest.approx(t, rel=1e-6)
    assert set(answer["probabilities"]) == {"A", "B"}
    assert r.choices[0].message.content == answer["letter"]
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert sum(math.exp(x.logprob) for x in top) == pytest.approx(1.0, abs=1e-4)

    d = client.post("/decide", cast_to=object, body={
        "state": "Refund my order 4410, it never arrived.",
        "questions": [{"id": "r", "task": "refund", "temperature": 1.0}]})
    assert d["answers"][0]["temperature"] == 1.0
    assert d["answers"][0]["option"] in (None, "yes", "no")

    # A name taken is a conflict; then removing.
    with pytest.raises(openai.ConflictError) as e:
        client.post("/tasks", cast_to=object, body=body)
    assert e.value.body["param"] == "name" and e.value.body["code"] == "task_exists"
    gone = client.delete(f"/tasks/{tid}", cast_to=object)
    assert gone == {"id": tid, "object": "task.deleted", "deleted": True, "cancelled": False}
    with pytest.raises(openai.NotFoundError):
        client.get(f"/tasks/{tid}", cast_to=object)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
            extra_body={"decisio": {"task": "refund"}})
    assert e.value.body["param"] == "decisio.task"
    assert e.value.body["code"] == "task_not_found"


INTENT = EXAMPLE.parent / "task_intent.json"


def test_an_intent_task_answers_with_a_label_through_the_sdk(client):
    body = json.loads(INTENT.read_text())
    task = client.post("/tasks", cast_to=object, body=body)
    assert task["kind"] == "intent" and task["labels"] == body["labels"]
    tid = task["id"]
    deadline = time.time() + 300
    while task["status"] in ("queued", "running"):
        assert time.time() < deadline, task
        time.sleep(0.3)
        task = client.get(f"/tasks/{tid}", cast_to=object)
    assert task["status"] == "ready", task
    result = task["result"]
    assert result["head"]["layer"] == -1 and result["head"]["dim"] > 0
    assert len(result["draws"]["per_draw"]) == body["draws"]

    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "system", "content": "I left my card on the bus and it is gone."},
                  {"role": "user", "content": "?"}],
        extra_body={"decisio": {"task": "banking", "abstain_below": 0.001}})
    answer = r.model_extra["decisio"]["answer"]
    assert answer["letter"] is None
    assert set(answer["probabilities"]) == set(body["labels"])
    assert r.choices[0].message.content == answer["label"] == answer["option"]
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert {x.token for x in top} == set(body["labels"])
    assert sum(math.exp(x.logprob) for x in top) == pytest.approx(1.0, abs=1e-4)
    assert client.delete(f"/tasks/{tid}", cast_to=object)["deleted"] is True
