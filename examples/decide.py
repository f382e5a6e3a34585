"""Decisions with decisio through the official OpenAI Python SDK.

Start the server first (`make serve`), then:
    python examples/decide.py [--base-url http://127.0.0.1:8000/v1]

A decision picks one of a question's options and reports a calibrated
probability for every option. It can be asked two ways:
  1. a chat completion with a `decisio` object (sent with `extra_body`): the
     messages before the last are the state, the last user message is the
     question; the reply's content is the chosen letter;
  2. `POST /v1/decide`: one state and several questions in one request.
"""

import argparse
import math

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
ap.add_argument("--api-key", default="none")
args = ap.parse_args()

client = OpenAI(base_url=args.base_url, api_key=args.api_key)
model = client.models.list().data[0].id

state = "Ada keeps three cats and one dog. The dog is called Rex."

# 1. A decision through chat completions.
reply = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": state},
        {"role": "user", "content": "How many cats does Ada keep?"},
    ],
    extra_body={"decisio": {"options": ["one", "two", "three"], "abstain_below": 0.2}},
)
decision = reply.model_extra["decisio"]
answer = decision["answer"]
print("chat:", repr(reply.choices[0].message.content),
      "abstained" if answer["abstained"] else f"-> {answer['option']}")
for t in reply.choices[0].logprobs.content[0].top_logprobs:
    print(f"  {t.token}: {math.exp(t.logprob):.3f}")
print("  state", decision["state"]["hash"][:12], "cached:", decision["state"]["cached"])

# 2. Several questions on one state through /v1/decide (the SDK's generic
#    post: the path is relative to the base URL, which ends in /v1).
result = client.post(
    "/decide",
    cast_to=object,
    body={
        "model": model,
        "state": state,
        "questions": [
            {"id": "cats", "text": "How many cats does Ada keep?", "options": ["one", "two", "three"]},
            {"id": "dog", "text": "What is the dog called?", "options": ["Tom", "Rex"],
             "temperature": 1.5},
        ],
    },
)
print("decide: state", result["state"]["hash"][:12], "cached:", result["state"]["cached"],
      "prompt tokens:", result["usage"]["prompt_tokens"],
      "cached tokens:", result["usage"]["cached_tokens"])
for a in result["answers"]:
    probabilities = ", ".join(f"{k} {v:.3f}" for k, v in a["probabilities"].items())
    print(f"  {a['id']}: {a['letter']} ({a['option']})  [{probabilities}]")
