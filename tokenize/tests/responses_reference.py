"""Expected token ids of OpenAI Responses requests, rendered the way vLLM 0.33's /v1/responses does.

usage: python responses_reference.py TOKENIZER_DIR VLLM_WHEEL < cases.json > results.json

vLLM itself cannot be imported here (it needs torch), so this runs vLLM's OWN code for the
Responses-specific steps, taken from the wheel at run time (never copied into the repo): the
function and class definitions named in SOURCES are read from the wheel's .py files, re-emitted
with `ast.unparse` and executed in a namespace holding the real openai SDK types and pydantic.
That covers the request parsing (ResponsesRequest's `input`/`tools` fields and its
`input_item_parsing` / `check_custom_tool_format` / `check_tool_usage` validators, reduced to the
fields that reach the prompt), `construct_tool_dicts`, `construct_input_messages` with its
helpers, `build_chat_params` (continue_final_message, reasoning effort) and the kwargs merge of
`render_responses` -> `preprocess_chat`. Only vLLM's logger, `random_uuid`, its exception class
and `ChatParams` (a plain record here) are stand-ins, and a relative import inside
`build_chat_params` is dropped (its name is loaded from the same wheel).

The chat normalization that follows (vLLM's parse_chat_messages, which needs the multimodal
stack) is the Python mirror in hf_reference.py, checked on its own by hf_compat.rs; then
transformers' apply_chat_template, as vLLM calls it.

Each case: {"name", "request": {...}, "previous": [{"request": {...}, "output": [items]}, ...]}.
`previous` is the conversation before `request`, oldest first, each turn with the `output` its
response had: vLLM's msg_store keeps each turn's constructed messages and
its response_store the output items; the next turn names it by previous_response_id.
Prints [{"ids", "text", "messages", "tools"} | {"error"}], one per case.
"""
import ast, json, logging, sys, uuid, zipfile
from typing import Any

from transformers import AutoTokenizer

from hf_reference import developer_to_system, postprocess, vllm_message

SOURCES = {
    "vllm/renderers/params.py": ["merge_kwargs", "map_reasoning_effort"],
    "vllm/entrypoints/generate/base/protocol.py": ["FunctionDefinition"],
    "vllm/entrypoints/openai/chat_completion/protocol.py": ["ChatCompletionToolsParam"],
    "vllm/tool_parsers/utils.py": [
        "Tool", "CUSTOM_TOOL_INPUT_KEY", "custom_tool_parameters", "custom_tool_as_function_dict", "_NAMESPACE_TOOL_SEPARATOR",
        "flat_namespace_tool_name", "get_function_tools", "iter_response_function_tool_dicts",
    ],
    "vllm/entrypoints/openai/responses/protocol.py": [
        "ResponseInputOutputItem", "_default_input_image_details", "_tool_field", "_resolve_named_tool_choice",
    ],
    "vllm/entrypoints/openai/responses/utils.py": [
        "encode_custom_tool_input", "_item_type", "_item_dict", "should_continue_final_message",
        "construct_input_messages", "construct_chat_messages_with_tool_call", "_construct_message_from_response_item",
        "convert_tool_responses_to_completions_format", "construct_tool_dicts",
    ],
}
# ResponsesRequest, reduced to what reaches the prompt (fields and validators kept verbatim).
REQUEST_FIELDS = ["input", "instructions", "reasoning", "tool_choice", "tools", "chat_template_kwargs", "media_io_kwargs"]
REQUEST_METHODS = ["input_item_parsing", "check_custom_tool_format", "check_tool_usage", "build_chat_params"]
IMPORT_FROM = ("openai", "pydantic", "typing", "collections")
IMPORT = ("json",)


def node_name(n):
    if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
        return n.name
    if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
        return n.targets[0].id
    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
        return n.target.id
    return None


class LocalImports(ast.NodeTransformer):
    """`from .utils import x` inside a function -> nothing: `x` is already in the namespace,
    loaded from the same wheel (the one rewrite of vLLM's code)."""

    def visit_ImportFrom(self, node):
        return ast.Pass() if node.level > 0 else node


def load_vllm(wheel):
    ns: dict[str, Any] = {}

    class VLLMValidationError(ValueError):
        def __init__(self, message, *, parameter=None, value=None):
            super().__init__(message)

    class ChatParams:  # a record; the real one also carries media kwargs
        def __init__(self, chat_template=None, chat_template_content_format=None, chat_template_kwargs=None, media_io_kwargs=None, tool_choice=None, **_):
            self.chat_template_kwargs = chat_template_kwargs or {}

    from pydantic import BaseModel, ConfigDict

    class OpenAIBaseModel(BaseModel):  # vLLM's, less its log of ignored fields
        model_config = ConfigDict(extra="allow")

    ns.update(
        __name__="vllm_responses_reference", Any=Any, logger=logging.getLogger("vllm"), random_uuid=lambda: uuid.uuid4().hex, VLLMValidationError=VLLMValidationError,
        ChatParams=ChatParams, OpenAIBaseModel=OpenAIBaseModel, ChatCompletionMessageParam=dict, ChatTemplateContentFormatOption=str,
        ModelConfig=Any, TokenizeParams=Any,
    )
    z = zipfile.ZipFile(wheel)
    for path, names in SOURCES.items():
        tree = ast.parse(z.read(path).decode())
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in IMPORT_FROM]
        imports += [n for n in tree.body if isinstance(n, ast.Import) and all(a.name in IMPORT for a in n.names)]
        exec(compile(ast.Module(body=imports, type_ignores=[]), path, "exec"), ns)
        found = {node_name(n): n for n in tree.body if node_name(n) in names}
        missing = set(names) - set(found)
        assert not missing, f"{path}: {missing} not found"
        body = [found[n] for n in names]
        if path.endswith("responses/protocol.py"):
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ResponsesRequest")
            members = {node_name(n): n for n in cls.body}
            cls.body = [members[n] for n in REQUEST_FIELDS + REQUEST_METHODS]
            body.append(LocalImports().visit(cls))
        exec(compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), path, "exec"), ns)
    return ns


def render(vllm, tok, case):
    msg_store = output_store = None
    previous = case.get("previous", [])
    for i, turn in enumerate(previous + [{"request": case["request"]}]):
        req = vllm["ResponsesRequest"].model_validate(json.loads(json.dumps(turn["request"])))
        # online_renderer.render_responses (non-Harmony), exclude_tools_when_tool_choice_none off.
        tool_dicts = vllm["construct_tool_dicts"](req.tools, req.tool_choice, exclude_tools_when_tool_choice_none=False)
        messages = vllm["construct_input_messages"](
            request_instructions=req.instructions,
            request_input=req.input,
            prev_msg=list(msg_store) if msg_store is not None else None,
            prev_response_output=list(output_store) if output_store is not None else None,
        )
        if i < len(previous):
            from pydantic import TypeAdapter

            msg_store = messages
            output_store = [TypeAdapter(vllm["ResponseOutputItem"]).validate_python(o) for o in turn["output"]]
            continue
        # effective_chat_template_kwargs, then preprocess_chat's merge with the tools.
        ctk = req.build_chat_params(None, "auto", None).chat_template_kwargs
        merge = vllm["merge_kwargs"]
        kwargs = merge(merge(ctk, dict(tools=tool_dicts, tokenize=False)), ctk)
        tools = kwargs.pop("tools", None)
        kwargs.pop("tokenize")
        shown = json.loads(json.dumps(messages, default=lambda o: o.model_dump()))
        conv = [vllm_message(m) for m in json.loads(json.dumps(messages))]
        postprocess(conv)
        conv = developer_to_system(conv, tok.chat_template)
        text = tok.apply_chat_template(conv, tools=tools, tokenize=False, **kwargs)
        ids = tok.apply_chat_template(conv, tools=tools, tokenize=True, return_dict=False, **kwargs)
        return {"ids": list(ids), "text": text, "messages": shown, "tools": tools}


def main():
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    vllm = load_vllm(sys.argv[2])
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append(render(vllm, tok, case))
        except Exception as e:  # the Rust side must fail too
            results.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
