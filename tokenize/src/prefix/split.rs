//! The cheap first pass over `template_input` for [`super`]: message boundaries as raw JSON
//! slices (no value tree is built for the history), the request's flags, tools and kwargs, and
//! a hash of the rendering context followed by each message prefix.
//!
//! The hashes cover the raw bytes of the messages: the same bytes always normalize and render
//! the same way, so a hash hit stands for the whole prefix. A client that re-serializes a
//! message differently only misses the cache.

use crate::cache::PieceHash;
use crate::input::{self, RenderSettings};
use crate::openai;
use serde_json::value::RawValue;
use serde_json::{Map, Value as Json};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use xxhash_rust::xxh3::Xxh3;

/// Separates hashed fields; JSON values are self-delimiting, this only adds margin.
const SEP: &[u8] = &[0x1e];

pub(super) struct RawChat<'a> {
    pub messages: Vec<&'a RawValue>,
    pub tools: Option<Vec<Json>>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub kwargs: Map<String, Json>,
    /// `prefix_hashes[k]` covers the context (tools, kwargs) and `messages[..k]`.
    pub prefix_hashes: Vec<PieceHash>,
}

impl<'a> RawChat<'a> {
    /// `None` when the input is not a well-formed chat request; the full path then reports
    /// the error the way it always has.
    pub fn parse(text: &'a str, settings: &RenderSettings) -> Option<RawChat<'a>> {
        let Top { messages, rest } = serde_json::from_str(text).ok()?;
        let messages = messages?;
        let tools = match rest.get("tools") {
            None | Some(Json::Null) => None,
            Some(Json::Array(t)) => Some(openai::normalize_tools(t).ok()?),
            Some(_) => return None,
        };
        let kwargs = input::kwargs(&rest, settings).ok()?;
        let mut h = Xxh3::new();
        h.update(serde_json::to_string(&tools).ok()?.as_bytes());
        h.update(SEP);
        h.update(serde_json::to_string(&kwargs).ok()?.as_bytes());
        h.update(SEP);
        let mut prefix_hashes = Vec::with_capacity(messages.len() + 1);
        prefix_hashes.push(PieceHash(h.digest128()));
        for m in &messages {
            h.update(m.get().as_bytes());
            h.update(SEP);
            prefix_hashes.push(PieceHash(h.digest128()));
        }
        Some(RawChat {
            messages,
            tools,
            add_generation_prompt: input::flag(&rest, "add_generation_prompt", true).ok()?,
            continue_final_message: input::flag(&rest, "continue_final_message", false).ok()?,
            kwargs,
            prefix_hashes,
        })
    }
}

/// The top-level object in one pass: `messages` as raw slices, every other field parsed
/// (they are small). A repeated key keeps its last value, as `serde_json::Map` does.
struct Top<'a> {
    messages: Option<Vec<&'a RawValue>>,
    rest: Map<String, Json>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Top<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TopVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for TopVisitor<'a> {
            type Value = Top<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'a>, A::Error> {
                let mut top = Top { messages: None, rest: Map::new() };
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "messages" {
                        top.messages = Some(map.next_value()?);
                    } else {
                        top.rest.insert(key.into_owned(), map.next_value()?);
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(TopVisitor(std::marker::PhantomData))
    }
}
