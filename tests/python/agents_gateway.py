"""The official `openai` (Responses) and `anthropic` (Messages) clients through the Spillway gateway.

usage: agents_gateway.py BASE_URL MODEL [HOLD_URL]
BASE_URL is the gateway (without /v1); MODEL its route. With HOLD_URL, the route `tight` serves
MODEL's replicas with one slot and no queue: a streamed request held open on it makes the next
one an overload, which each SDK must recognise and retry after Retry-After.
Prints a transcript of each call, then "ok: N checks".
"""

import json
import sys
import threading
import time

import urllib.request

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
checks = 0


def say(what, value):
    print(f"{what}: {json.dumps(value, default=str)[:400]}")


oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)

# Responses, whole and streamed.
r = oa.responses.create(model=model, input="Say something about gateways.", max_output_tokens=8)
say("responses.create", {"id": r.id, "model": r.model, "status": r.status, "usage": r.usage.model_dump(), "text": r.output_text})
# A model may end before its cap (a real vLLM's dummy weights can draw EOS): at most the cap.
assert r.model == model and 1 <= r.usage.output_tokens <= 8 and r.output_text, r
checks += 1

kinds, text, done = [], "", None
with oa.responses.create(model=model, input="Say something.", max_output_tokens=6, stream=True) as stream:
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            done = event.response
say("responses.create(stream=True)", {"events": kinds, "text": text, "usage": done.usage.model_dump() if done else None})
assert done is not None and 1 <= done.usage.output_tokens <= 6 and text, kinds
# vLLM may put several tokens in one delta: at least one, at most one a token.
deltas = kinds.count("response.output_text.delta")
assert kinds[0] == "response.created" and 1 <= deltas <= done.usage.output_tokens, kinds
checks += 1

# Messages, whole and streamed (the SDK's `messages.stream` helper).
m = an.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Say something."}])
say("messages.create", m.model_dump())
assert m.model == model and 1 <= m.usage.output_tokens <= 8 and m.content[0].text, m
checks += 1

with an.messages.stream(model=model, max_tokens=6, messages=[{"role": "user", "content": "Say more."}]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
say("messages.stream", {"text": streamed, "usage": final.usage.model_dump(), "stop_reason": final.stop_reason})
assert streamed and 1 <= final.usage.output_tokens <= 6, final
assert final.stop_reason == ("max_tokens" if final.usage.output_tokens == 6 else "end_turn"), final
checks += 1

n = an.messages.count_tokens(model=model, messages=[{"role": "user", "content": "How many tokens is this?"}])
say("messages.count_tokens", n.model_dump())
assert n.input_tokens > 0, n
checks += 1

# Errors each SDK maps to its own exception.
try:
    an.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    raise AssertionError("expected 404")
except anthropic.NotFoundError as e:
    say("messages.create(model=nope)", e.body)
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
checks += 1

if len(sys.argv) > 3:
    hold_url = sys.argv[3]

    def hold(seconds):
        """Holds `tight`'s only slot with a stream for `seconds`, then lets it go."""
        body = {"model": "tight", "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": "x"}]}
        req = urllib.request.Request(
            f"{hold_url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200, r.status
            r.read1(1)
            time.sleep(seconds)

    for name, call in [
        ("anthropic", lambda c: c.messages.with_raw_response.create(model="tight", max_tokens=4, messages=[{"role": "user", "content": "x"}])),
        ("openai", lambda c: c.responses.with_raw_response.create(model="tight", input="x", max_output_tokens=4)),
    ]:
        holder = threading.Thread(target=hold, args=(1.5,))
        holder.start()
        time.sleep(0.5)
        # Refused at once, with Retry-After: without retries, the SDK's own overload error.
        bare = (an if name == "anthropic" else oa).with_options(max_retries=0)
        try:
            call(bare)
            raise AssertionError(f"{name}: expected an overload")
        except (anthropic.InternalServerError, openai.InternalServerError) as e:
            say(f"{name} overloaded", {"status": e.status_code, "retry-after": e.response.headers.get("retry-after"), "body": e.body})
            assert e.status_code == 503 and int(e.response.headers["retry-after"]) >= 1, e
            if name == "anthropic":
                assert e.body["error"]["type"] == "overloaded_error", e.body
        # With retries, the SDK waits Retry-After and is served once the slot is free.
        started = time.time()
        raw = call((an if name == "anthropic" else oa).with_options(max_retries=3))
        holder.join()
        say(f"{name} retried", {"retries_taken": raw.retries_taken, "status": raw.status_code, "seconds": round(time.time() - started, 2)})
        assert raw.status_code == 200 and raw.retries_taken >= 1, raw.retries_taken
        checks += 1

print(f"ok: {checks} checks")
