"""The official OpenAI Python SDK against a real decisio server."""

import json
import math
import urllib.request

import openai
import pytest

from conftest import API_KEY

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_chat_completion_answers(client):
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=24, temperature=0)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert r.usage.completion_tokens == r.usage.total_tokens - r.usage.prompt_tokens
    assert 1 <= r.usage.completion_tokens <= 24


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=10)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        assert len(tok.top_logprobs) == 10
        lps = [t.logprob for t in tok.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert tok.logprob == pytest.approx(lps[0])
        assert bytes(tok.bytes).decode("utf-8", "replace") == tok.token
        assert sum(math.exp(lp) for lp in lps) <= 1.0001
    assert "".join(t.token for t in content) == r.choices[0].message.content


def test_chat_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=20, temperature=0,
        stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens


def test_seeded_sampling_repeats(client):
    kw = dict(model="smollm2", messages=QUESTION, max_tokens=12, temperature=1.0, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_stop_string(client):
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=24,
                                       temperature=0, stop=["Paris"])
    assert "Paris" not in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_completions_text_and_tokens(client, server):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5,
                                  temperature=0, logprobs=3)
    assert "Paris" in r.choices[0].text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens
    assert all(len(t) == 3 for t in lp.top_logprobs)
    req = urllib.request.Request(
        server + "/tokenize", data=json.dumps({"prompt": "The capital of France is"}).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        ids = json.load(resp)
    r2 = client.completions.create(model="smollm2", prompt=ids["tokens"], max_tokens=5, temperature=0)
    assert r2.choices[0].text == r.choices[0].text


def test_completions_echo(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=3,
                                  temperature=0, echo=True, logprobs=1)
    choice = r.choices[0]
    assert choice.text.startswith("The capital of France is")
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset[0] == 0


def test_errors_are_typed(client, server):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi " * 9000}])
    assert e.value.code == "context_length_exceeded"
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
