"""The official `openai` client through the gateway's TLS listener, trusting a private certificate.

usage: openai_tls.py BASE_URL CA_FILE
The gateway serves `chat` on https://, with the certificate in CA_FILE.
"""

import sys

import openai

base_url, ca_file = sys.argv[1], sys.argv[2]
assert base_url.startswith("https://"), base_url
client = openai.OpenAI(
    base_url=base_url, api_key="unused", max_retries=0, timeout=30,
    http_client=openai.DefaultHttpxClient(verify=ca_file),
)

stream = client.chat.completions.create(
    model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True,
    stream_options={"include_usage": True},
)
text, usage = "", None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
assert text and usage is not None and usage.completion_tokens == 8, (text, usage)

resp = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
assert resp.choices[0].message.content and resp.usage.completion_tokens == 4, resp

# Embeddings pass through with the same admission; the client asks for base64 and decodes it.
emb = client.embeddings.create(model="chat", input=["one text", "another"])
assert len(emb.data) == 2 and len(emb.data[0].embedding) == 32 and emb.model == "chat", emb
assert emb.usage.prompt_tokens > 0, emb.usage

# Without the certificate's file, the client refuses the server.
untrusting = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
try:
    untrusting.models.list()
    raise AssertionError("a private certificate was trusted without its CA file")
except openai.APIConnectionError:
    pass

print("ok: TLS, a stream, a whole answer, embeddings, and a refusal without the CA file")
