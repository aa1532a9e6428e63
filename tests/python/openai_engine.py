"""Drives an OpenAI-compatible server with the official `openai` client; exits non-zero on a failure.

usage: openai_engine.py BASE_URL MODEL
"""

import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
checks = 0

# Streamed chat with usage.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=8,
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text, "streamed chat produced text"
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 8, usage
checks += 1

# Whole chat answer.
resp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
assert resp.choices[0].message.content and resp.usage.completion_tokens == 4, resp
checks += 1

# Legacy completions, streamed and not.
resp = client.completions.create(model=model, prompt="once", max_tokens=3)
assert resp.choices[0].text and resp.usage.completion_tokens == 3, resp
parts = [c.choices[0].text for c in client.completions.create(model=model, prompt="once", max_tokens=3, stream=True) if c.choices]
assert len("".join(parts)) > 0, parts
checks += 1

# Embeddings: the client asks for base64 and decodes it; a batch keeps its order.
resp = client.embeddings.create(model=model, input=["the first", "the second one"])
assert [d.index for d in resp.data] == [0, 1] and len(resp.data[0].embedding) == 32, resp
assert abs(sum(x * x for x in resp.data[0].embedding) - 1.0) < 1e-4, resp.data[0].embedding
assert resp.data[0].embedding != resp.data[1].embedding
assert resp.usage.prompt_tokens > 0 and resp.usage.total_tokens == resp.usage.prompt_tokens, resp.usage
again = client.embeddings.create(model=model, input="the first", encoding_format="float")
# The same vector (as floats in JSON, each read back as a double, so within an f32's precision).
assert all(abs(a - b) < 1e-6 for a, b in zip(again.data[0].embedding, resp.data[0].embedding, strict=True))
checks += 1

# Models.
assert [m.id for m in client.models.list()] == [model]
checks += 1

# Errors arrive as the client's typed exceptions, with status and message.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.status_code == 404 and "does not exist" in str(e), e
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=10**6)
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "maximum context length" in str(e), e
checks += 1

print(f"ok: {checks} checks")
