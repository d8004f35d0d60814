#!/usr/bin/env python3
"""A stored Responses API conversation with the official `openai` SDK through Envoy with the
kvroute filter: run by tests/tests/sdk_responses.rs, which starts the stack and asserts on the
JSON this script prints.

    responses_conversation.py run FIRST_URL FOLLOW_URL MODEL STREAM

Turn 1 goes to FIRST_URL, turns 2 and 3 (each with `previous_response_id` of the turn before)
and `responses.retrieve(turn 1)` to FOLLOW_URL (another replica's Envoy, or the same one).
STREAM is `true` or `false`. Then the Anthropic SDK's `messages.count_tokens` through
FIRST_URL. Prints, per call, the response id, the worker kvroute chose and what it matched
(`x-kvroute-decision`, sent to trusted peers), and the usage the worker reported.
"""

import json
import sys


def decision(headers):
    raw = headers.get("x-kvroute-decision", "")
    return dict(kv.split("=", 1) for kv in raw.split(";") if "=" in kv)


def turn(client, model, stream, previous, text):
    kwargs = dict(model=model, input=text, store=True)
    if previous:
        kwargs["previous_response_id"] = previous
    if stream:
        raw = client.responses.with_raw_response.create(stream=True, **kwargs)
        events, final = [], None
        for event in raw.parse():
            events.append(event.type)
            if event.type == "response.completed":
                final = event.response
        response = final
    else:
        raw = client.responses.with_raw_response.create(**kwargs)
        response, events = raw.parse(), None
    usage = response.usage
    cached = usage.input_tokens_details.cached_tokens if usage and usage.input_tokens_details else None
    return {
        "id": response.id,
        "status": response.status,
        "text": response.output_text,
        "decision": decision(raw.headers),
        "input_tokens": usage.input_tokens if usage else None,
        "cached_tokens": cached,
        "events": events,
    }


def main():
    if len(sys.argv) != 6 or sys.argv[1] != "run":
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    first_url, follow_url, model, stream = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "true"
    import anthropic
    import openai

    first = openai.OpenAI(base_url=f"{first_url}/v1", api_key="x", max_retries=0)
    follow = openai.OpenAI(base_url=f"{follow_url}/v1", api_key="x", max_retries=0)
    context = " ".join(f"Fact {i}: the sky over city {i} is a shade of blue numbered {i * 7}." for i in range(60))
    turns = [turn(first, model, stream, None, f"Here is our project context. {context} Summarize it.")]
    for question in ["Which city has shade 42?", "And which one has shade 70?"]:
        turns.append(turn(follow, model, stream, turns[-1]["id"], question))
    stored = follow.responses.retrieve(turns[0]["id"])
    messages = [{"role": "user", "content": f"Count me. {context}"}]
    counted = anthropic.Anthropic(base_url=first_url, api_key="x", max_retries=0).messages.count_tokens(model=model, messages=messages)
    print(json.dumps({
        "openai": openai.__version__,
        "turns": turns,
        "retrieved": {"id": stored.id, "status": stored.status, "text": stored.output_text},
        "count_tokens": counted.input_tokens,
        "count_messages": messages,
    }))


if __name__ == "__main__":
    main()
