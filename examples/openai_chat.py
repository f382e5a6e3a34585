"""Chat with decisio through the official OpenAI Python SDK.

Start the server first (`make serve`), then:
    python examples/openai_chat.py [--base-url http://127.0.0.1:8000/v1]
"""

import argparse

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
ap.add_argument("--api-key", default="none")
args = ap.parse_args()

client = OpenAI(base_url=args.base_url, api_key=args.api_key)
model = client.models.list().data[0].id

reply = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
)
print(reply.choices[0].message.content)
first = reply.choices[0].logprobs.content[0]
print("first token:", repr(first.token), "alternatives:",
      [(t.token, round(t.logprob, 3)) for t in first.top_logprobs])

print("streaming:", end=" ", flush=True)
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name three primary colours."}],
    max_tokens=32,
    temperature=0,
    stream=True,
):
    for choice in chunk.choices:
        print(choice.delta.content or "", end="", flush=True)
print()
