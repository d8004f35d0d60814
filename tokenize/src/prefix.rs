//! Incremental chat rendering: a warm turn of a long conversation renders only what is new.
//!
//! Re-rendering a 32k-token conversation on every turn costs more than a millisecond (JSON
//! parse, normalization, template). Most templates render each turn independently of later
//! turns, but not all, and not at every message: Qwen3's strips reasoning from assistant turns
//! before the last user query and groups consecutive tool messages. So the cut is made only at
//! an *anchor*: a user message with string content that is not a wrapped tool result
//! (`<tool_response>...`). With `S` the leading system message (if any), `u` an anchor,
//! `A` the history before `u` and `B` what follows it, we rely on
//!
//! ```text
//! render(A+u+B) = render(A+u) ++ (render(S+u+B) - render(S+u))     (no generation prompt)
//! render(X, gen) = render(X) ++ (render(S+u, gen) - render(S+u))
//! ```
//!
//! i.e. a template's header depends only on `S` and the tools, and what it renders for the
//! messages after a user query does not depend on what came before it. That holds for Qwen3's
//! template (each message looks only at its neighbours, `loop.first`/`loop.last` and the index
//! of the last user query), but cannot be decided for an arbitrary template, so:
//! - [`PrefixRenderer::new`] runs a self-check at load ([`selfcheck`]): synthetic conversations
//!   (system prompts, tools, tool loops, reasoning, wrapped tool results, inline system turns,
//!   kwargs) rendered turn by turn both ways must agree exactly, or the shortcut stays off;
//! - every composed render checks that `render(S+u)` is a prefix of the other two renders;
//! - anything unusual (developer messages, which vLLM merges across the conversation,
//!   `continue_final_message`, errors, another API) takes the full path, so errors are the
//!   full path's errors;
//! - tests/prefix_render.rs compares both paths on random growing conversations.
//!
//! The cache maps a hash of (tools, kwargs, raw JSON of `messages[..=k]`) for an anchor `k` to
//! `render(messages[..=k])` without generation prompt, stored when a request ends at that
//! anchor. A warm turn then costs a raw JSON scan + hash of the body, normalizing and rendering
//! `S` + the new messages, and a copy of the prefix text.
//!
//! Data flow: `model` asks this module first and falls back to the full path on `None`; this
//! module uses the renderer ([`crate::chat`]), the request parsing ([`crate::input`],
//! [`crate::openai`]) and the generic cache ([`crate::cache`]), and knows nothing of `model`.

mod selfcheck;
mod split;

use crate::cache::{PieceCache, PieceHash};
use crate::chat::{ChatTemplate, RenderInput, RenderedChat};
use crate::input::{self, RenderSettings};
use crate::openai::{self, ContentFormat};
use kvroute_core::request::Api;
use serde_json::value::RawValue;
use serde_json::Value as Json;
use split::RawChat;
use std::sync::Arc;

/// A rendered conversation prefix ending at an anchor, without generation prompt.
#[derive(Clone)]
struct Prefix {
    text: Arc<str>,
    media_items: usize,
}

pub(crate) struct PrefixRenderer {
    cache: PieceCache<Prefix>,
    format: ContentFormat,
    enabled: bool,
}

impl std::fmt::Debug for PrefixRenderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixRenderer").field("enabled", &self.enabled).field("cache", &self.cache).finish()
    }
}

/// A user message that starts a new query (see the module docs).
fn is_anchor(m: &Json) -> bool {
    m.get("role").and_then(Json::as_str) == Some("user") && m.get("content").and_then(Json::as_str).is_some_and(|c| !c.starts_with("<tool_response>"))
}

fn normalize(raw: &RawValue, format: ContentFormat, media: &mut usize) -> Option<Json> {
    let value: Json = serde_json::from_str(raw.get()).ok()?;
    openai::normalize_message(&value, format, media).ok()
}

impl PrefixRenderer {
    /// A renderer with a cache of `cache_bytes` (0: always the full path), enabled only if the
    /// template passes the self-check.
    pub fn new(cache_bytes: usize, template: &ChatTemplate, settings: &RenderSettings) -> PrefixRenderer {
        let format = settings.content_format.resolve(template.source());
        let enabled = cache_bytes > 0 && {
            let probe = PrefixRenderer { cache: PieceCache::new(4 << 20), format, enabled: true };
            selfcheck::passes(&probe, template, settings)
        };
        PrefixRenderer { cache: PieceCache::new(if enabled { cache_bytes } else { 0 }), format, enabled }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The rendered chat, or `None`: use the full path.
    pub fn render(&self, text: &str, api: Api, template: &ChatTemplate, settings: &RenderSettings) -> Option<RenderedChat> {
        if !self.enabled || api != Api::ChatCompletions || text.contains("\"developer\"") {
            return None;
        }
        let raw = RawChat::parse(text, settings)?;
        if raw.continue_final_message || raw.messages.is_empty() {
            return None;
        }
        let found = (1..=raw.messages.len()).rev().find_map(|k| self.cache.peek(raw.prefix_hashes[k]).map(|p| (k - 1, p)));
        self.cache.count(found.is_some(), text.len());
        match found {
            Some((anchor, prefix)) => self.warm(&raw, anchor, prefix, template),
            None => self.cold(&raw, text, template, settings),
        }
    }

    fn store(&self, key: PieceHash, text: &str, media_items: usize) {
        self.cache.insert_sized(key, text.len(), Prefix { text: Arc::from(text), media_items });
    }

    /// `prefix` is the render of `messages[..=anchor]`.
    fn warm(&self, raw: &RawChat, anchor: usize, prefix: Prefix, template: &ChatTemplate) -> Option<RenderedChat> {
        let n = raw.messages.len();
        let mut media = prefix.media_items;
        let mut head = Vec::with_capacity(n - anchor + 1);
        if anchor > 0 {
            let first = normalize(raw.messages[0], self.format, &mut 0)?;
            if first.get("role").and_then(Json::as_str) == Some("system") {
                head.push(first);
            }
        }
        head.push(normalize(raw.messages[anchor], self.format, &mut 0)?);
        let mut tail = head.clone();
        for m in &raw.messages[anchor + 1..] {
            tail.push(normalize(m, self.format, &mut media)?);
        }
        let input = |messages: Vec<Json>, gen: bool| RenderInput {
            messages,
            tools: raw.tools.clone(),
            add_generation_prompt: gen,
            continue_final_message: false,
            kwargs: raw.kwargs.clone(),
        };
        let ends_at_anchor = anchor + 1 < n && tail.last().is_some_and(is_anchor);
        let base = template.render(&input(head.clone(), false)).ok()?;
        let rest = template.render(&input(tail, false)).ok()?;
        let mut text = String::with_capacity(prefix.text.len() + rest.len() + 64);
        text.push_str(&prefix.text);
        text.push_str(rest.strip_prefix(base.as_str())?);
        if ends_at_anchor {
            self.store(raw.prefix_hashes[n], &text, media);
        }
        if raw.add_generation_prompt {
            let gen = template.render(&input(head, true)).ok()?;
            text.push_str(gen.strip_prefix(base.as_str())?);
        }
        Some(RenderedChat { text, media_items: media })
    }

    /// No cached prefix: the full render, and the prefix for the next turn if the request
    /// ends at an anchor.
    fn cold(&self, raw: &RawChat, text: &str, template: &ChatTemplate, settings: &RenderSettings) -> Option<RenderedChat> {
        let parsed = input::parse(text, Api::ChatCompletions, template.source(), settings).ok()?;
        let rendered = template.render(&parsed.render).ok()?;
        let messages = &parsed.render.messages;
        if messages.len() == raw.messages.len() && messages.last().is_some_and(is_anchor) {
            let base = if parsed.render.add_generation_prompt {
                let input = RenderInput { add_generation_prompt: false, ..parsed.render.clone() };
                template.render(&input).ok()?
            } else {
                rendered.clone()
            };
            if rendered.starts_with(&base) {
                self.store(raw.prefix_hashes[messages.len()], &base, parsed.media_items);
            }
        }
        Some(RenderedChat { text: rendered, media_items: parsed.media_items })
    }
}
