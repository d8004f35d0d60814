"""Expected token ids for the kvroute-tokenize comparison test.

Reads a JSON list of cases on stdin, prints [{"ids": [...], "text": "..."} | {"error": "..."}].
Chat cases go through a Python mirror of vLLM 0.33's request normalization (written from
vllm/renderers/chat_utils/chat_message.py, vllm/entrypoints/anthropic/serving.py and
FunctionDefinition.model_dump) and then through transformers' own apply_chat_template, which is
what vLLM calls. The Rust crate implements the same normalization independently; this is the
reference it is checked against. Text cases use tok(text)["input_ids"] (add_special_tokens=True).
"""
import json, sys
import jinja2, jinja2.ext, jinja2.sandbox
from transformers import AutoTokenizer

BILLING = "x-anthropic-billing-header"
TEXT_TYPES = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking", "tool_reference": "name"}
MEDIA_TYPES = {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds", "video_url", "video_embeds", "prompt_embeds"}


def strip_billing(parts):
    out = []
    for p in parts:
        t = p if isinstance(p, str) else (p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None)
        if not (isinstance(t, str) and t.startswith(BILLING)):
            out.append(p)
            continue
        rest = t.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(p, str) else {**p, "text": rest})
    return out


def vllm_message(msg):
    role, content = msg["role"], msg.get("content")
    parts = [] if content is None else ([{"type": "text", "text": content}] if isinstance(content, str) else content)
    if role == "system":
        parts = strip_billing(parts)
    texts = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif p.get("type") in TEXT_TYPES:
            v = p.get(TEXT_TYPES[p["type"]])
            if v is not None:
                texts.append(v)
        elif p.get("type") in MEDIA_TYPES:
            pass  # counted by the Rust side; no text
        else:
            raise ValueError(f"unsupported part {p!r}")
    out = {"role": role, "content": "\n".join(texts)}
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            out["tool_calls"] = list(msg["tool_calls"])
        if msg.get("reasoning") is not None:
            out["reasoning"] = msg["reasoning"]
            out["reasoning_content"] = msg["reasoning"]
    elif role == "tool" and "tool_call_id" in msg:
        out["tool_call_id"] = msg["tool_call_id"]
    for k in ("name", "task"):
        if isinstance(msg.get(k), str):
            out[k] = msg[k]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def developer_to_system(conv, template):
    """safe_apply_chat_template: developer -> system, then consolidate system messages."""
    if not any(m["role"] == "developer" for m in conv) or '"developer"' in template or "'developer'" in template:
        return conv
    conv = [({**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m) for m in conv]
    systems, rest, needs = [], [], False
    for i, m in enumerate(conv):
        if m["role"] == "system":
            needs = needs or i > 0 or bool(systems)
            if m.get("content"):
                systems.append(m["content"])
        else:
            rest.append(m)
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest] if needs else conv


def postprocess(messages):
    for m in messages:
        if m["role"] == "assistant" and "tool_calls" in m and isinstance(m["tool_calls"], list):
            if not m["tool_calls"]:
                m.pop("tool_calls")
                continue
            m["tool_calls"] = [fix_call(c) for c in m["tool_calls"]]


def fix_call(c):
    c = json.loads(json.dumps(c))
    f = c["function"]
    args = f.get("arguments")
    if args:
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        f["arguments"] = args if isinstance(args, dict) else {}
    else:
        f["arguments"] = {}
    return c


def vllm_tool(t):
    f = t["function"]
    fd = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
    defer = f.get("defer_loading") if f.get("defer_loading") is not None else t.get("defer_loading")
    if f.get("strict") is not None:
        fd["strict"] = f["strict"]
    if defer is not None:
        fd["defer_loading"] = defer
    out = {"type": "function", "function": fd}
    if t.get("defer_loading") is not None:
        out["defer_loading"] = t["defer_loading"]
    return out


def merge_inline_system(template):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    try:
        env.from_string(template).render(messages=[{"role": r, "content": "t"} for r in ("system", "user", "system", "user")], add_generation_prompt=False)
        return False
    except jinja2.TemplateError:
        return True


def system_text(content):
    if isinstance(content, str):
        return None if content.startswith(BILLING) else content
    parts = [b["text"] for b in content if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING)]
    return "".join(parts) if parts else None


def anthropic_to_openai(body, merge):
    out, system_parts = [], []
    system = body.get("system")
    if system:
        if isinstance(system, str):
            system_parts.append(system)
        else:
            system_parts += [b["text"] for b in system if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING)]
    if merge:
        system_parts += [t for m in body["messages"] if m["role"] == "system" for t in [system_text(m["content"])] if t]
    if system_parts:
        out.append({"role": "system", "content": "".join(system_parts)})
    for msg in body["messages"]:
        if msg["role"] == "system":
            if not merge and (t := system_text(msg["content"])):
                out.append({"role": "system", "content": t})
            continue
        om = {"role": msg["role"]}
        if isinstance(msg["content"], str):
            om["content"] = msg["content"]
        else:
            parts, calls, reasoning = [], [], []
            for b in msg["content"]:
                if b["type"] == "text" and b.get("text"):
                    parts.append({"type": "text", "text": b["text"]})
                elif b["type"] == "image" and b.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": "data:"}})
                elif b["type"] == "thinking" and b.get("thinking") is not None:
                    reasoning.append(b["thinking"])
                elif b["type"] == "tool_use":
                    calls.append({"id": b.get("id") or "call_0", "type": "function", "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
                elif b["type"] == "tool_result" and msg["role"] == "user":
                    c = b.get("content")
                    text = c if isinstance(c, str) else "\n".join(i.get("text", "") for i in (c or []) if isinstance(i, dict) and i.get("type") == "text")
                    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text or ""})
            if reasoning:
                om["reasoning"] = "".join(reasoning)
            if calls:
                om["tool_calls"] = calls
            if parts:
                om["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if not (msg["role"] == "user" and "content" not in om):
            out.append(om)
    tools = None
    if body.get("tools") is not None:
        tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"), "parameters": t.get("input_schema"), "strict": t.get("strict"), "defer_loading": t.get("defer_loading")}} for t in body["tools"]]
    return out, tools


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    merge = merge_inline_system(tok.chat_template)
    results = []
    for case in json.load(sys.stdin):
        try:
            if case["api"] == "text":
                results.append({"ids": list(tok(case["text"])["input_ids"]), "text": case["text"]})
                continue
            body = case["input"]
            if case["api"] == "messages":
                messages, tools = anthropic_to_openai(body, merge)
            else:
                messages, tools = body["messages"], body.get("tools")
            conv = [vllm_message(m) for m in messages]
            postprocess(conv)
            conv = developer_to_system(conv, tok.chat_template)
            tools = [vllm_tool(t) for t in tools] if tools is not None else None
            kwargs = {k: v for k, v in (body.get("chat_template_kwargs") or {}).items()}
            common = dict(tools=tools, add_generation_prompt=body.get("add_generation_prompt", True), continue_final_message=body.get("continue_final_message", False), **kwargs)
            text = tok.apply_chat_template(conv, tokenize=False, **common)
            ids = tok.apply_chat_template(conv, tokenize=True, return_dict=False, **common)
            results.append({"ids": list(ids), "text": text})
        except Exception as e:  # the Rust side must fail too
            results.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
