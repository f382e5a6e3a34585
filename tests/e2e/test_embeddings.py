"""The OpenAI Python SDK's embeddings client against a real decisio server."""

import math
import struct
import urllib.request
import json

import openai
import pytest

from conftest import API_KEY

TEXTS = ["The mitochondria is the powerhouse of the cell.", "Which planet is closest to the sun?"]


def post(server, path, body):
    req = urllib.request.Request(
        server + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def as_f32(values):
    """Each value as float32 bits (a float64 narrowed, or already float32)."""
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def test_embeddings_create_returns_hidden_states(client, server):
    # The SDK asks for base64 by default and decodes the float32 bytes.
    r = client.embeddings.create(model="smollm2", input=TEXTS)
    assert r.object == "list"
    assert r.model == "smollm2"
    assert [d.index for d in r.data] == [0, 1]
    assert all(d.object == "embedding" for d in r.data)
    assert all(len(d.embedding) == 576 for d in r.data)
    tokens = [post(server, "/tokenize", {"prompt": t})["count"] for t in TEXTS]
    assert r.usage.prompt_tokens == sum(tokens) == r.usage.total_tokens
    # Hidden states, not unit vectors.
    norm = math.sqrt(sum(x * x for x in r.data[0].embedding))
    assert abs(norm - 1.0) > 0.1
    assert all(math.isfinite(x) for x in r.data[0].embedding)

    # Floats and token ids: the same float32 bits.
    floats = client.embeddings.create(model="smollm2", input=TEXTS[1], encoding_format="float")
    assert as_f32(floats.data[0].embedding) == as_f32(r.data[1].embedding)
    ids = post(server, "/tokenize", {"prompt": TEXTS[0]})["tokens"]
    by_ids = client.embeddings.create(model="smollm2", input=[ids], dimensions=576)
    assert as_f32(by_ids.data[0].embedding) == as_f32(r.data[0].embedding)


def test_embeddings_refusals_are_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="smollm2", input="x", dimensions=64)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="smollm2", input=["x"] * 257)
    assert e.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="x")
