#!/usr/bin/env python3
"""The official `openai` and `anthropic` SDKs against Envoy with the kvroute filter, with
tenant budgets: run by tests/tests/sdk_budgets.rs, which starts the stack, configures the
budgets and asserts on the JSON this script prints.

    budget_errors.py check                    SDK versions (exit 3 when an SDK is missing)
    budget_errors.py digest KEY...            {"KEY": "sha256:<hex>"} (the filter's api_key form)
    budget_errors.py run ENVOY_URL MODEL KEYS_JSON

`run` makes a fixed sequence of calls (see CALLS) with `max_retries=0`, so each SDK raises on
the first 429 instead of backing off, and prints one JSON object: the SDK versions and, per
call, whether it succeeded or what it raised (exception class, status, the response headers
that matter, the parsed error body, and how long the SDK itself would wait before a retry,
from its own Retry-After parser). It exits 0 when it could make every call, whatever each
call answered: the Rust test owns the expectations. KEYS_JSON maps the roles `chat`,
`completions`, `messages`, `tokens` to API keys.
"""

import hashlib
import json
import sys
import time

MISSING = 3
HEADERS = ("retry-after", "retry-after-ms", "x-kvroute-rejected", "content-type")


def load_sdks():
    try:
        import anthropic
        import openai
    except ImportError as e:
        print(
            f"budget_errors.py: {e} in {sys.executable}: the official SDKs are missing; "
            "run scripts/setup.sh (installs scripts/requirements.txt, openai and anthropic, into .cache/venv)",
            file=sys.stderr,
        )
        sys.exit(MISSING)
    return openai, anthropic


def versions(openai, anthropic):
    return {"python": sys.version.split()[0], "openai": openai.__version__, "anthropic": anthropic.__version__}


def sdk_wait(client, headers):
    """What the SDK's own parser makes of the retry headers (seconds), when it exposes one."""
    parse = getattr(client, "_parse_retry_after_header", None)
    if parse is None:
        return None
    try:
        return parse(headers)
    except Exception as e:  # a private helper: report, never fail on it
        return f"unavailable: {type(e).__name__}"


def describe_error(client, e):
    out = {"class": f"{type(e).__module__.split('.')[0]}.{type(e).__name__}", "message": str(e)[:500]}
    response = getattr(e, "response", None)
    if response is not None:
        out["status"] = response.status_code
        out["headers"] = {h: response.headers.get(h) for h in HEADERS}
        out["sdk_retry_after_s"] = sdk_wait(client, response.headers)
    for attr in ("status_code", "type", "code", "param"):
        if hasattr(e, attr):
            out[attr] = getattr(e, attr)
    body = getattr(e, "body", None)
    try:
        json.dumps(body)
        out["body"] = body
    except (TypeError, ValueError):
        out["body"] = repr(body)
    return out


# --- the calls: (name, sdk, key role, what) -------------------------------------------------

SMALL = [{"role": "user", "content": "Say hello."}]
# Far more than the `tokens` tenant's whole budget: rejected whatever the window holds.
BIG = " ".join(f"word{i}" for i in range(8000))


def chat(c, model, stream=False, messages=SMALL):
    if not stream:
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=8)
        return {"text": r.choices[0].message.content, "usage": r.usage.model_dump() if r.usage else None}
    chunks, text = 0, ""
    for chunk in c.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True):
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return {"chunks": chunks, "text": text}


def completion(c, model, stream=False):
    if not stream:
        r = c.completions.create(model=model, prompt="Once upon a time", max_tokens=8)
        return {"text": r.choices[0].text}
    chunks, text = 0, ""
    for chunk in c.completions.create(model=model, prompt="Once upon a time", max_tokens=8, stream=True):
        chunks += 1
        if chunk.choices:
            text += chunk.choices[0].text or ""
    return {"chunks": chunks, "text": text}


def message(c, model, stream=None):
    if stream is None:
        r = c.messages.create(model=model, max_tokens=8, messages=SMALL)
        return {"text": "".join(b.text for b in r.content if b.type == "text"), "stop_reason": r.stop_reason}
    if stream == "create":
        events = []
        for event in c.messages.create(model=model, max_tokens=8, messages=SMALL, stream=True):
            events.append(event.type)
        return {"events": events}
    # The `messages.stream()` helper (a context manager that raises on entering).
    with c.messages.stream(model=model, max_tokens=8, messages=SMALL) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    return {"text": text, "stop_reason": final.stop_reason}


CALLS = [
    # The `chat` tenant: 2 requests per minute.
    ("chat_plain_1", "openai", "chat", lambda c, m: chat(c, m)),
    ("chat_stream_2", "openai", "chat", lambda c, m: chat(c, m, stream=True)),
    ("chat_plain_3", "openai", "chat", lambda c, m: chat(c, m)),
    ("chat_stream_4", "openai", "chat", lambda c, m: chat(c, m, stream=True)),
    # The `completions` tenant: 2 requests per minute.
    ("completions_plain_1", "openai", "completions", lambda c, m: completion(c, m)),
    ("completions_stream_2", "openai", "completions", lambda c, m: completion(c, m, stream=True)),
    ("completions_plain_3", "openai", "completions", lambda c, m: completion(c, m)),
    ("completions_stream_4", "openai", "completions", lambda c, m: completion(c, m, stream=True)),
    # The `messages` tenant (Anthropic SDK, x-api-key): 2 requests per minute.
    ("messages_plain_1", "anthropic", "messages", lambda c, m: message(c, m)),
    ("messages_stream_2", "anthropic", "messages", lambda c, m: message(c, m, stream="create")),
    ("messages_plain_3", "anthropic", "messages", lambda c, m: message(c, m)),
    ("messages_stream_4", "anthropic", "messages", lambda c, m: message(c, m, stream="create")),
    ("messages_helper_5", "anthropic", "messages", lambda c, m: message(c, m, stream="helper")),
    # The `tokens` tenant: a token budget; a small request fits, a prompt bigger than it never.
    ("tokens_small_1", "openai", "tokens", lambda c, m: chat(c, m)),
    ("tokens_big_2", "openai", "tokens", lambda c, m: chat(c, m, messages=[{"role": "user", "content": BIG}])),
    ("tokens_big_messages_3", "anthropic", "tokens",
     lambda c, m: c.messages.create(model=m, max_tokens=8, messages=[{"role": "user", "content": BIG}]).stop_reason),
    # Keys no tenant has (a near miss of the exhausted `chat` and `messages` keys): the
    # default tenant's budget, not the keyed one's, so they are admitted.
    ("wrong_key_openai", "openai", "chat+wrong", lambda c, m: chat(c, m)),
    ("wrong_key_anthropic", "anthropic", "messages+wrong", lambda c, m: message(c, m)),
]


def run(envoy_url, model, keys):
    openai, anthropic = load_sdks()
    envoy_url = envoy_url.rstrip("/")

    def client(sdk, role):
        base, _, suffix = role.partition("+")
        key = keys[base] + ("-" + suffix if suffix else "")
        if sdk == "openai":
            # The OpenAI SDK appends paths to base_url: it must end in /v1.
            return openai.OpenAI(api_key=key, base_url=envoy_url + "/v1", max_retries=0, timeout=60)
        # The Anthropic SDK's paths start with /v1.
        return anthropic.Anthropic(api_key=key, base_url=envoy_url, max_retries=0, timeout=60)

    results = []
    started = time.monotonic()
    for name, sdk, role, call in CALLS:
        c = client(sdk, role)
        t0 = time.monotonic()
        entry = {"name": name, "sdk": sdk, "key": role}
        try:
            entry["result"] = call(c, model)
            entry["ok"] = True
        except Exception as e:  # every outcome is data for the Rust test
            entry["ok"] = False
            entry["error"] = describe_error(c, e)
        entry["seconds"] = round(time.monotonic() - t0, 3)
        results.append(entry)
    summary = {"versions": versions(openai, anthropic), "seconds": round(time.monotonic() - started, 3), "calls": results}
    print(json.dumps(summary, indent=1, default=str))


def main(argv):
    if len(argv) >= 2 and argv[1] == "check":
        print(json.dumps(versions(*load_sdks())))
    elif len(argv) >= 3 and argv[1] == "digest":
        print(json.dumps({k: "sha256:" + hashlib.sha256(k.encode()).hexdigest() for k in argv[2:]}))
    elif len(argv) == 5 and argv[1] == "run":
        run(argv[2], argv[3], json.loads(argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
