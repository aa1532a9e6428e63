"""The official `openai` client's Responses calls against a server with vLLM's response store on
(`VLLM_ENABLE_RESPONSES_API_STORE=1`, or `spillway engine --responses-store`): create, retrieve,
a second turn by previous_response_id, background, cancel. Exits non-zero on a failure.

usage: openai_store.py BASE_URL MODEL
"""

import sys
import time

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
checks = 0
extra = {"ignore_eos": True}

first = client.responses.create(model=model, input="hello there", max_output_tokens=4, extra_body=extra)
assert first.status == "incomplete" and first.usage.output_tokens == 4, first
got = client.responses.retrieve(first.id)
assert got.id == first.id and got.output_text == first.output_text, got
checks += 1

second = client.responses.create(
    model=model, input="and then?", max_output_tokens=4, previous_response_id=first.id, extra_body=extra
)
assert second.previous_response_id == first.id, second
assert second.usage.input_tokens > first.usage.total_tokens, (first.usage, second.usage)
checks += 1

try:
    client.responses.retrieve("resp_0")
    raise AssertionError("an unknown id was found")
except openai.NotFoundError as e:
    assert "not found" in str(e), e
checks += 1

# Background: queued at once, cancelled while it runs, read back cancelled.
bg = client.responses.create(model=model, input="hello", max_output_tokens=2000, background=True, extra_body=extra)
assert bg.status == "queued" and bg.background, bg
cancelled = client.responses.cancel(bg.id)
assert cancelled.status == "cancelled", cancelled
assert client.responses.retrieve(bg.id).status == "cancelled"
try:
    client.responses.cancel(bg.id)
    raise AssertionError("cancelled twice")
except openai.BadRequestError as e:
    assert "Cannot cancel" in str(e), e
checks += 1

# A short background response to its end.
bg = client.responses.create(model=model, input="hello", max_output_tokens=6, background=True, extra_body=extra)
for _ in range(200):
    done = client.responses.retrieve(bg.id)
    if done.status != "queued":
        break
    time.sleep(0.02)
assert done.status == "incomplete" and done.usage.output_tokens == 6, done
checks += 1

# A background stream, read to its end by the SDK.
events = [e.type for e in client.responses.create(
    model=model, input="hi", max_output_tokens=3, background=True, stream=True, extra_body=extra
)]
assert events[0] == "response.created" and events[-1] == "response.completed", events
checks += 1

print(f"ok: {checks} checks")
