//! The chat-template input path: the `chat_json` of a pick (the filter's `template_input`, or
//! anything a caller of `/v1/pick` puts there) turned into template input and rendered with
//! the model's chat template, then encoded, as the state service's local tokenizer does
//! (`kvroute_tokenize::ModelTokenizer::render_chat` / `encode_chat`, and
//! `kvroute_tokenize::input::parse` under other render settings).
//!
//! No tokenizer file is needed: a byte-level BPE over the 256 byte symbols with a few merges
//! and ChatML / Gemma-style special tokens is built in memory, with two small inline templates
//! written for this target: a Qwen3-like one (tools, tool calls, reasoning, `tojson`,
//! namespaces, string content) and a Gemma-like one (content parts, `raise_exception` on a
//! non-leading system message, so `/v1/messages` merges inline system messages).
//!
//! Input: byte 0 picks the API (bit 0: Anthropic `/v1/messages`, else chat completions), the
//! template (bit 1) and the settings `input::parse` is also run with (bits 2-3); the rest is
//! the template input, decoded as UTF-8 with replacement (a protobuf string is UTF-8).
//!
//! Oracles beyond "no panic":
//! - incremental rendering is exact: `render_chat` (which reuses the rendered history of
//!   earlier turns) equals `render_chat_full`; every input first renders its own previous
//!   turn so that history is there to reuse;
//! - the piece cache is exact: the cached encoder gives the ids of the uncached one (what
//!   `encode_chat` and `encode_chat_uncached` do after rendering).
#![no_main]

use kvroute_tokenize::config::TokenizerConfig;
use kvroute_tokenize::input::{self, RenderSettings};
use kvroute_tokenize::{AnthropicRendering, Api, ContentFormat, ModelTokenizer, TokenizerOptions};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value as Json};
use std::str::FromStr;
use std::sync::OnceLock;

const QWEN_LIKE: &str = r##"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}
{{- messages[0].content + '\n\n' }}
{%- endif %}
{{- "# Tools\n\n<tools>" }}
{%- for tool in tools %}
{{- "\n" }}
{{- tool | tojson }}
{%- endfor %}
{{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}
{%- set ns.last_query_index = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}
{%- set content = message.content %}
{%- else %}
{%- set content = '' %}
{%- endif %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}
{{- '\n' }}
{%- endif %}
{%- if tool_call.function %}
{%- set tool_call = tool_call.function %}
{%- endif %}
{{- '<tool_call>\n{"name": "' }}
{{- tool_call.name }}
{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}
{{- tool_call.arguments }}
{%- else %}
{{- tool_call.arguments | tojson }}
{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %}"##;

const GEMMA_LIKE: &str = r##"{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'system' and not loop.first %}
{{- raise_exception('System message must be first') }}
{%- endif %}
{%- set role = 'model' if message.role == 'assistant' else message.role %}
{{- '<start_of_turn>' + role + '\n' }}
{%- if message.content is string %}
{{- message.content | trim }}
{%- else %}
{%- for part in message.content %}
{%- if part.type == 'text' %}
{{- part.text | trim }}
{%- elif part.type == 'image' %}
{{- '<start_of_image>' }}
{%- endif %}
{%- endfor %}
{%- endif %}
{{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<start_of_turn>model\n' }}
{%- endif %}"##;

const SPECIAL: [&str; 8] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<think>"];

/// GPT-2's byte -> printable character map (what a byte-level BPE vocabulary is written in).
fn byte_symbols() -> Vec<char> {
    let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~')).chain(0xa1..=0xac).chain(0xae..=0xff).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut by_byte = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(&chars) {
        by_byte[*b as usize] = char::from_u32(*c).expect("valid char");
    }
    by_byte
}

fn tokenizer() -> tokenizers::Tokenizer {
    let symbols = byte_symbols();
    let mut vocab = serde_json::Map::new();
    for (id, c) in symbols.iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ċ", "Ċ")];
    for (a, b) in merges {
        let id = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(id));
    }
    let added: Vec<Json> = SPECIAL
        .iter()
        .enumerate()
        .map(
            |(i, t)| json!({"id": vocab.len() + i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        )
        .collect();
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>(),
        }
    });
    tokenizers::Tokenizer::from_str(&spec.to_string()).expect("in-memory tokenizer")
}

fn model(template: &str) -> ModelTokenizer {
    let config = json!({
        "chat_template": template,
        "bos_token": "<bos>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
        "add_bos_token": true,
    });
    let config = TokenizerConfig::from_json(&config.to_string()).expect("tokenizer config");
    // Small caches: evictions happen during a run, and memory stays bounded.
    let options = TokenizerOptions { cache_bytes: 256 << 10, render_cache_bytes: 256 << 10, ..TokenizerOptions::default() };
    ModelTokenizer::new(tokenizer(), &config, options).expect("model tokenizer")
}

fn models() -> &'static [ModelTokenizer; 2] {
    static MODELS: OnceLock<[ModelTokenizer; 2]> = OnceLock::new();
    MODELS.get_or_init(|| [model(QWEN_LIKE), model(GEMMA_LIKE)])
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let api = if flags & 1 != 0 { Api::Messages } else { Api::ChatCompletions };
    let tok = &models()[usize::from(flags >> 1 & 1)];
    let text = String::from_utf8_lossy(rest);

    // Other settings, straight into the parser (no render: `render_chat_full` below renders).
    let settings = RenderSettings {
        content_format: [ContentFormat::Auto, ContentFormat::String, ContentFormat::OpenAi, ContentFormat::OpenAi][usize::from(flags >> 2 & 3)],
        anthropic: AnthropicRendering::Vllm,
        default_kwargs: serde_json::Map::from_iter([("enable_thinking".to_string(), json!(flags & 0x10 != 0))]),
        merge_inline_system: flags & 0x20 != 0,
    };
    let _ = input::parse(&text, api, QWEN_LIKE, &settings);

    if let Some(earlier) = earlier_turn(&text) {
        let _ = tok.render_chat(&earlier, api);
    }
    let incremental = tok.render_chat(&text, api);
    let full = tok.render_chat_full(&text, api);
    if verbose() {
        eprintln!("{api:?} template {}: {full:?}", flags >> 1 & 1);
    }
    match (&incremental, &full) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "incremental rendering differs\ninput: {text}"),
        (Err(_), Err(_)) => {}
        _ => panic!("incremental {incremental:?} but full {full:?}\ninput: {text}"),
    }
    let rendered = match full {
        Ok(rendered) => rendered,
        Err(e) => {
            let _ = (e.kind(), e.to_string());
            return;
        }
    };
    // What `encode_chat` / `encode_chat_uncached` do after rendering (rendered once here).
    let cached = tok.encoder().encode(&rendered.text);
    let uncached = tok.encoder().encode_uncached(&rendered.text, false);
    match (&cached, &uncached) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "piece cache changed the ids\ninput: {text}"),
        (Err(_), Err(_)) => {}
        _ => panic!("cached {cached:?} but uncached {uncached:?}\ninput: {text}"),
    }
});

/// `KVROUTE_FUZZ_VERBOSE=1`: print what each input rendered (to check seeds and crashes).
fn verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var_os("KVROUTE_FUZZ_VERBOSE").is_some())
}

/// The same template input without its last message or, when the last message is not the
/// user's, without the messages since the last user message: the previous turn of this
/// conversation, as a client would have sent it. `None` for one message or no JSON.
fn earlier_turn(text: &str) -> Option<String> {
    let Ok(Json::Object(mut obj)) = serde_json::from_str::<Json>(text) else { return None };
    let Some(Json::Array(messages)) = obj.get_mut("messages") else { return None };
    let last_user = messages.iter().rposition(|m| m.get("role").and_then(Json::as_str) == Some("user"));
    let keep = match last_user {
        Some(i) if i + 1 < messages.len() => i + 1,
        _ => messages.len().checked_sub(1)?,
    };
    if keep == 0 {
        return None;
    }
    messages.truncate(keep);
    Some(Json::Object(obj).to_string())
}
