"""The LLM clients people really use, against the proxy: the official `openai` and `anthropic`
Python SDKs, each call made as an application makes it.

    python3 sdk_client.py openai|anthropic BASE_URL API_KEY MAX_RETRIES CALLS

The openai client sends the key as `Authorization: Bearer <key>`, the anthropic one as
`x-api-key: <key>`. Prints one JSON line per call: whether it succeeded, the status, the error
class and the parsed error body the SDK raised, the last response's headers, and how long the
call took with the SDK's own retries (seconds).
"""

import json
import sys
import time

import anthropic
import openai


def call(sdk, client):
    if sdk == "openai":
        return client.chat.completions.with_raw_response.create(
            model="test-model", messages=[{"role": "user", "content": "hi"}]
        )
    return client.messages.with_raw_response.create(
        model="test-model", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
    )


def main():
    sdk, base_url, key, retries, calls = sys.argv[1:6]
    if sdk == "openai":
        client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=int(retries))
        errors = openai.APIStatusError
    else:
        client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=int(retries))
        errors = anthropic.APIStatusError
    for _ in range(int(calls)):
        started = time.monotonic()
        try:
            r = call(sdk, client)
            out = {"ok": True, "status": r.status_code, "headers": dict(r.headers)}
        except errors as e:
            out = {
                "ok": False,
                "status": e.status_code,
                "error": type(e).__name__,
                "body": e.body,
                "headers": dict(e.response.headers),
            }
        out["seconds"] = time.monotonic() - started
        print(json.dumps(out), flush=True)


main()
