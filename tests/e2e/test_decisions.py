"""Decisions through the official OpenAI Python SDK: chat completions with a
`decisio` object (`extra_body`), and `POST /v1/decide` through the SDK's
generic `post`."""

import math
import re

import openai
import pytest

STATE = ("You are a careful assistant. Ada keeps three cats and one dog; "
         "the dog is called Rex.")
QUESTION = "How many cats does Ada keep?"
OPTIONS = ["one", "two", "three", "four"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def messages(question=QUESTION, state=STATE):
    return [{"role": "system", "content": state}, {"role": "user", "content": question}]


def decision(client, decisio, **kw):
    return client.chat.completions.create(
        model="smollm2", messages=kw.pop("messages", messages()),
        extra_body={"decisio": decisio}, **kw)


def extra(r):
    """The reply's `decisio` object, which the SDK keeps as an extra field."""
    d = (r.model_extra or {}).get("decisio")
    assert d is not None, r.to_dict()
    assert d == r.to_dict()["decisio"]
    return d


def test_chat_decision_answers_with_a_letter(client):
    r = decision(client, {"options": OPTIONS, "abstain_below": 0.01})
    letters = LETTERS[:len(OPTIONS)]
    choice = r.choices[0]
    assert r.object == "chat.completion"
    assert r.model == "smollm2"
    assert choice.message.role == "assistant"
    assert choice.message.content in letters
    assert choice.finish_reason == "stop"

    top = choice.logprobs.content[0].top_logprobs
    assert sorted(t.token for t in top) == list(letters)
    lps = [t.logprob for t in top]
    assert lps == sorted(lps, reverse=True)
    assert sum(math.exp(lp) for lp in lps) == pytest.approx(1.0, abs=1e-4)
    # The chosen letter is the most likely one.
    assert choice.logprobs.content[0].token == choice.message.content == top[0].token

    d = extra(r)
    assert re.fullmatch(r"[0-9a-f]{64}", d["state"]["hash"])
    assert d["state"]["tokens"] > 0
    answer = d["answer"]
    assert answer["letter"] == choice.message.content
    assert answer["option"] == OPTIONS[answer["index"]]
    assert LETTERS[answer["index"]] == answer["letter"]
    assert answer["abstained"] is False and answer["abstain_reason"] is None
    assert set(answer["probabilities"]) == set(letters)
    assert set(answer["letter_logprobs"]) == set(letters)
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    for t in top:
        assert math.exp(t.logprob) == pytest.approx(answer["probabilities"][t.token], rel=1e-4, abs=1e-6)
    for lp in answer["letter_logprobs"].values():
        assert lp <= 0.0
    assert answer["temperature"] > 0


def test_repeat_reads_the_state_from_the_cache(client):
    # A state no other test uses, so the first request is a miss.
    state = STATE + " This sentence makes the state unique to the cache test."
    first = decision(client, {"options": OPTIONS}, messages=messages(state=state))
    again = decision(client, {"options": OPTIONS}, messages=messages(state=state))
    d1, d2 = extra(first), extra(again)
    assert d1["state"]["cached"] is False
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert d2["state"]["cached"] is True
    assert d2["state"]["hash"] == d1["state"]["hash"]
    # The same question again: the state and the question's answer are both
    # read from the cache.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    # Bit for bit the same answer on a hit.
    assert d2["answer"]["probabilities"] == d1["answer"]["probabilities"]
    # Another question on the state: the state alone comes from the cache.
    other = decision(client, {"options": OPTIONS},
                     messages=messages(question="How many dogs does Ada keep?", state=state))
    d3 = extra(other)
    assert d3["state"]["cached"] is True and d3["state"]["hash"] == d1["state"]["hash"]
    assert other.usage.prompt_tokens_details.cached_tokens == d3["state"]["tokens"]
    assert other.usage.prompt_tokens > d3["state"]["tokens"]
    assert again.choices[0].message.content == first.choices[0].message.content


def test_abstention_leaves_the_content_empty(client):
    r = decision(client, {"options": OPTIONS, "abstain_below": 1.0})
    assert r.choices[0].message.content == ""
    answer = extra(r)["answer"]
    assert answer["abstained"] is True
    assert answer["letter"] is None and answer["index"] is None and answer["option"] is None
    assert answer["abstain_reason"]
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)


def test_temperature_is_reported(client):
    r = decision(client, {"options": OPTIONS, "temperature": 2.5})
    assert extra(r)["answer"]["temperature"] == pytest.approx(2.5)


# An option whose float32 probability underflows to 0 still has a finite
# log-probability in the chat reply (never -inf, which JSON would carry as
# `null`).
def test_top_logprobs_stay_numbers_at_a_low_temperature(client):
    # The lowest temperature a decision takes (docs/limits.md).
    r = decision(client, {"options": OPTIONS, "temperature": 0.001})
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert len(top) == len(OPTIONS)
    for t in top:
        assert isinstance(t.logprob, float) and math.isfinite(t.logprob), r.to_dict()


@pytest.mark.parametrize("decisio, kw, param", [
    ({"options": [f"option {i}" for i in range(256)]}, {}, "decisio.options"),
    ({"options": ["yes", "no", "yes"]}, {}, "decisio.options[2]"),
    ({"options": ["yes", ""]}, {}, "decisio.options[1]"),
    ({"options": ["yes"]}, {}, "decisio.options"),
    ({"options": ["yes", "no"], "abstain_below": 1.5}, {}, "decisio.abstain_below"),
    ({"options": ["yes", "no"], "temperature": 0}, {}, "decisio.temperature"),
    ({"options": ["yes", "no"]}, {"stream": True}, "stream"),
    ({"options": ["yes", "no"], "task": "sentiment"}, {}, "decisio.options"),
])
def test_bad_decisions_are_refused(client, decisio, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        decision(client, decisio, **kw)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body


def test_a_decision_needs_a_state_and_a_user_question(client):
    with pytest.raises(openai.BadRequestError):
        decision(client, {"options": OPTIONS}, messages=[{"role": "user", "content": QUESTION}])
    with pytest.raises(openai.BadRequestError):
        decision(client, {"options": OPTIONS},
                 messages=messages() + [{"role": "assistant", "content": "B"}])


def test_decide_route_through_the_sdk(client):
    body = {
        "model": "smollm2",
        "state": STATE,
        "questions": [
            {"id": "cats", "text": QUESTION, "options": OPTIONS},
            {"id": "dog", "text": "What is the dog called?", "options": ["Tom", "Rex", "Sox"],
             "abstain_below": 0.01, "temperature": 1.0},
        ],
        "multi_question": "sequential",
    }
    r = client.post("/decide", cast_to=object, body=body)
    assert r["object"] == "decision"
    assert r["model"] == "smollm2"
    assert r["id"] and isinstance(r["created"], int)
    assert re.fullmatch(r"[0-9a-f]{64}", r["state"]["hash"])
    assert r["state"]["tokens"] > 0 and isinstance(r["state"]["cached"], bool)
    assert [a["id"] for a in r["answers"]] == ["cats", "dog"]
    fields = {"id", "letter", "index", "option", "probabilities", "letter_logprobs",
              "temperature", "abstained", "abstain_reason", "tie"}
    for a, n in zip(r["answers"], (4, 3)):
        assert set(a) == fields
        assert list(a["probabilities"]) == list(LETTERS[:n])
        assert list(a["letter_logprobs"]) == list(LETTERS[:n])
        assert sum(a["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
        assert a["letter"] in LETTERS[:n] and a["abstained"] is False
        assert a["probabilities"][a["letter"]] == max(a["probabilities"].values())
    u = r["usage"]
    assert u["prompt_tokens"] > r["state"]["tokens"]
    assert u["completion_tokens"] == 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["cached_tokens"] in (0, r["state"]["tokens"])

    for mode in ("warm", "packed"):
        with pytest.raises(openai.BadRequestError) as e:
            client.post("/decide", cast_to=object, body={**body, "multi_question": mode})
        assert e.value.body["param"] == "multi_question"


def test_generation_fields_are_refused_for_decisions(client):
    for field, value in [("temperature", 0.5), ("top_p", 0.9), ("stop", ["x"]), ("max_tokens", 5),
                         ("seed", 3)]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "system", "content": "The sky is blue."},
                                           {"role": "user", "content": "What colour is the sky?"}],
                extra_body={"decisio": {"options": ["blue", "green"]}}, **{field: value})
        assert e.value.body["param"] == field
