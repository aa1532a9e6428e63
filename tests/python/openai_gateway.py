"""The official `openai` client through the Spillway gateway: answers, and errors it can parse.

usage: openai_gateway.py BASE_URL
The gateway serves `chat` (healthy), `tight` and `tight429` (their only slot held by the caller,
overflow 503 and 429), and `hung` (a replica that never sends a first token).
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
checks = 0

stream = client.chat.completions.create(
    model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True,
    stream_options={"include_usage": True},
)
text, usage, models = "", None, set()
for chunk in stream:
    models.add(chunk.model)
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
assert text and usage is not None and usage.completion_tokens == 8, (text, usage)
assert models == {"chat"}, models
checks += 1

resp = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
assert resp.choices[0].message.content and resp.usage.completion_tokens == 4 and resp.model == "chat", resp
resp = client.completions.create(model="chat", prompt="once", max_tokens=3)
assert resp.choices[0].text and resp.usage.completion_tokens == 3, resp
checks += 1

for model, exc, status in [("tight", openai.InternalServerError, 503), ("tight429", openai.RateLimitError, 429)]:
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4, stream=True)
        raise AssertionError(f"expected {status} from {model}")
    except exc as e:
        assert e.status_code == status, e
        assert "at capacity" in e.message, e.message
        assert int(e.response.headers["retry-after"]) >= 1, e.response.headers
        assert e.body["code"] == "queue_full", e.body
    checks += 1

try:
    client.chat.completions.create(model="hung", messages=[{"role": "user", "content": "x"}], max_tokens=4, stream=True)
    raise AssertionError("expected 504")
except openai.InternalServerError as e:
    assert e.status_code == 504 and e.body["code"] == "first_token_timeout", e
checks += 1

try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("expected 404")
except openai.NotFoundError as e:
    assert "does not exist" in e.message, e
checks += 1

print(f"ok: {checks} checks")
