"""Calls a gateway with the official `openai` package, as an application
would, for tests/limits/tokens.rs.

    python3 client.py BASE_URL API_KEY CALLS_JSON

CALLS_JSON is a list of calls, each {"model", "max_tokens", "stream",
"include_usage"}. Prints one JSON list: per call, {"status": 200, "usage":
the total_tokens the answer reported (null when none)} or {"status": 429,
"retry_after": the header or null}. Retries are off, so a 429 is seen as
the gateway sent it. Exits 3 when the package is missing.
"""

import json
import sys

try:
    import openai
except ImportError:
    print("openai is not installed", file=sys.stderr)
    sys.exit(3)


def call(client, c):
    kwargs = dict(model=c["model"], max_tokens=c["max_tokens"],
                  messages=[{"role": "user", "content": c.get("prompt", "say hello to me")}])
    try:
        if not c.get("stream"):
            r = client.chat.completions.create(**kwargs)
            return {"status": 200, "usage": r.usage.total_tokens if r.usage else None}
        if c.get("include_usage"):
            kwargs["stream_options"] = {"include_usage": True}
        usage = None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.usage is not None:
                usage = chunk.usage.total_tokens
        return {"status": 200, "usage": usage}
    except openai.APIStatusError as e:
        return {"status": e.status_code, "retry_after": e.response.headers.get("retry-after")}


def main():
    base_url, api_key, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    print(json.dumps([call(client, c) for c in calls]))


if __name__ == "__main__":
    main()
