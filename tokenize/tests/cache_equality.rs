//! The piece cache never changes token ids: for random conversations growing turn by turn
//! (warm: shared cache; small cache: constant eviction; cold: split but uncached) and for
//! random text around added tokens, ids equal whole-prompt tokenization.
//!
//! Equality alone would pass when every path fails the same way, so each case must also
//! tokenize to a non-empty prompt; the corpus cases meant to be rejected are named `*_error`
//! and must fail on every path.

mod common;

use kvroute_tokenize::{Api, ModelTokenizer, TokenizerOptions};
use proptest::prelude::*;
use serde_json::Value as Json;
use std::sync::OnceLock;

struct Tokenizers {
    warm: ModelTokenizer,
    tiny: ModelTokenizer,
    cold: ModelTokenizer,
}

fn tokenizers() -> &'static Tokenizers {
    static T: OnceLock<Tokenizers> = OnceLock::new();
    T.get_or_init(|| {
        let (dir, _) = common::fixture().expect("tokenizer fixture");
        let with = |cache_bytes| ModelTokenizer::from_dir_with(&dir, TokenizerOptions { cache_bytes, ..TokenizerOptions::default() }).expect("load");
        Tokenizers { warm: with(64 << 20), tiny: with(16 * 2 * 600), cold: with(0) }
    })
}

/// Every path encodes `input` to the same ids as whole-prompt tokenization, and that
/// tokenization succeeded with a non-empty prompt: a case where every path fails would compare
/// nothing, so it is a failure here (a generator or fixture bug), never a pass.
fn check(input: &Json, api: Api) {
    let t = tokenizers();
    let text = input.to_string();
    let whole = match t.warm.encode_chat_uncached(&text, api) {
        Ok(ids) => ids,
        Err(e) => panic!("uncached tokenization failed, nothing to compare ({e}) for {input}"),
    };
    assert!(!whole.is_empty(), "uncached tokenization gave no ids for {input}");
    for (name, tok) in [("warm", &t.warm), ("tiny", &t.tiny), ("cold", &t.cold)] {
        match tok.encode_chat(&text, api) {
            Ok(got) => assert_eq!(got, whole, "{name} differs for {input}"),
            Err(e) => panic!("{name}: cached tokenization failed ({e}) where the uncached one gave {} ids, for {input}", whole.len()),
        }
    }
    // Bounded encodings stop exactly, at message boundaries and at spaces inside messages.
    let rendered = t.cold.render_chat(&text, api).unwrap_or_else(|e| panic!("render failed ({e}) for {input}")).text;
    for budget in [0, 7, 64, 300, 1500] {
        let p = t.cold.encoder().encode_prefix(&rendered, budget).unwrap_or_else(|e| panic!("prefix failed ({e}) for {input}"));
        assert!(whole.starts_with(&p.ids), "the {budget}-byte prefix differs for {input}");
    }
}

/// A completions prompt encodes through the piece cache like `tokenizers` on the whole text
/// with special tokens (the fixture, Qwen3, adds no BOS, so nothing is prepended).
fn check_text(name: &str, text: &str) {
    let t = tokenizers();
    let whole = t.warm.encoder().encode_uncached(text, true).unwrap_or_else(|e| panic!("{name}: uncached encoding failed: {e}"));
    assert!(!whole.is_empty(), "{name}: no ids for {text:?}");
    for (path, tok) in [("warm", &t.warm), ("tiny", &t.tiny), ("cold", &t.cold)] {
        let got = tok.encode_text(text).unwrap_or_else(|e| panic!("{name}: {path} encoding failed: {e}"));
        assert_eq!(got, whole, "{name}: {path} differs");
    }
}

/// A corpus case that must be rejected: every path (cached or not) returns an error. These are
/// named `*_error` in the corpus, so a case that should succeed can never pass by failing.
fn check_rejected(name: &str, input: &Json, api: Api) {
    let t = tokenizers();
    let text = input.to_string();
    let whole = t.warm.encode_chat_uncached(&text, api);
    assert!(whole.is_err(), "{name}: expected an error, the uncached path gave {whole:?}");
    for (path, tok) in [("warm", &t.warm), ("tiny", &t.tiny), ("cold", &t.cold)] {
        let got = tok.encode_chat(&text, api);
        assert!(got.is_err(), "{name}: expected an error, the {path} path gave {got:?}");
    }
}

/// Every prefix of the conversation that ends with a user turn, in order: the turns a client
/// would send.
fn turns(input: &Json) -> Vec<Json> {
    let messages = input["messages"].as_array().cloned().unwrap_or_default();
    (1..=messages.len())
        .filter(|&n| messages[n - 1]["role"] == "user")
        .map(|n| {
            let mut step = input.clone();
            step["messages"] = Json::Array(messages[..n].to_vec());
            step
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn growing_conversations_encode_like_whole_prompts(seed in any::<u64>(), turns_n in 1usize..7, size in 1usize..4) {
        let mut rng = common::gen::rng(seed);
        let chat = common::gen::openai(&mut rng, turns_n, size);
        for step in turns(&chat) {
            check(&step, Api::ChatCompletions);
        }
        let messages = common::gen::anthropic(&mut rng, turns_n, size);
        for step in turns(&messages) {
            check(&step, Api::Messages);
        }
    }

    #[test]
    fn text_around_added_tokens_splits_exactly(parts in prop::collection::vec(prop::sample::select(vec![
        "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>", "<|im_", "|>", "<",
        "\u{301}", "e", "a\u{30a}", " ", "\n", "\n\n", "  ", "\t", "🚀", "👩\u{200d}💻", "你好", "'s", "123", "user", "Ω",
    ]), 0..40)) {
        let text: String = parts.concat();
        let t = tokenizers();
        let whole = t.warm.encoder().encode_uncached(&text, false).unwrap();
        // Only the empty text may encode to nothing; anything else comparing empty to empty
        // would mean the tokenizer dropped the input.
        prop_assert_eq!(whole.is_empty(), text.is_empty(), "ids of {:?}: {:?}", text, whole);
        prop_assert_eq!(&t.warm.encoder().encode(&text).unwrap(), &whole);
        prop_assert_eq!(&t.cold.encoder().encode(&text).unwrap(), &whole);
        prop_assert_eq!(&t.tiny.encoder().encode(&text).unwrap(), &whole);
    }
}

proptest! {
    /// A bounded prefix encoding is exactly a prefix of the whole encoding, stops at a piece
    /// boundary or at a space inside the piece that does not fit, spends at most its budget on
    /// uncached text, and is the whole encoding when the budget allows (cold: every byte
    /// counts; warm: cached pieces are free).
    #[test]
    fn prefix_encoding_is_an_exact_prefix_within_its_budget(parts in prop::collection::vec(prop::sample::select(vec![
        "<|im_start|>user\n", "<|im_end|>\n", "Hello there, router.", " shared system prompt text ", "\n\n", "你好", "🚀 ",
        "don't", " 'quoted' ", "12 345 6.7", "  ", " a", "e\u{301} x", "\t", "(see: docs)", "A", " B ",
    ]), 1..30), budget in 0usize..200) {
        let text: String = parts.concat();
        let t = tokenizers();
        let whole = t.cold.encoder().encode_uncached(&text, false).unwrap();
        let p = t.cold.encoder().encode_prefix(&text, budget).unwrap();
        prop_assert!(whole.starts_with(&p.ids), "{:?} is not a prefix of {:?} for {:?} within {}", p.ids, whole, text, budget);
        let text_bytes: usize = text.len() - text.matches("<|im_start|>").count() * 12 - text.matches("<|im_end|>").count() * 10;
        prop_assert!(p.rest_bytes <= text_bytes);
        prop_assert!(text_bytes - p.rest_bytes <= budget, "encoded {} of {} text bytes within {}", text_bytes - p.rest_bytes, text_bytes, budget);
        if text_bytes <= budget {
            prop_assert!(p.complete(), "budget {} covers all {} text bytes", budget, text_bytes);
            prop_assert_eq!(&p.ids, &whole);
        }
        // Warm: once the whole text was encoded, every piece is cached and nothing is spent.
        t.warm.encoder().encode(&text).unwrap();
        let warm = t.warm.encoder().encode_prefix(&text, 0).unwrap();
        prop_assert!(warm.complete());
        prop_assert_eq!(&warm.ids, &whole);
    }
}

/// A message longer than the budget is encoded up to its last space within the budget, so a
/// long single-message prompt still gets exact leading blocks; one without a space there gets
/// nothing of that message (the caller routes it on text chunks).
#[test]
fn a_message_longer_than_the_budget_is_encoded_up_to_a_space_in_it() {
    let t = tokenizers();
    assert!(t.cold.encoder().cuts_at_spaces(), "the Qwen3 pre-tokenizer starts a pre-token at every space between words");
    let words = "Summarise this incident report for the on-call engineer, in 3 bullet points. ".repeat(400);
    let text = format!("<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n");
    let whole = t.cold.encoder().encode_uncached(&text, false).unwrap();
    let budget = 4096;
    let p = t.cold.encoder().encode_prefix(&text, budget).unwrap();
    let encoded = text.len() - 12 * 2 - 10 - p.rest_bytes;
    assert!(encoded <= budget && encoded > budget - 16, "encoded {encoded} bytes of a {budget}-byte budget");
    assert!(p.ids.len() > 500, "{} ids", p.ids.len());
    assert!(whole.starts_with(&p.ids));
    assert!(p.ids.len() < whole.len());
    // No space within the budget: nothing of the message, only the token before it.
    let blob = format!("<|im_start|>user\n{}<|im_end|>\n", "QUJDRA==".repeat(1000));
    let p = t.cold.encoder().encode_prefix(&blob, budget).unwrap();
    assert_eq!(p.ids.len(), 1);
    assert!(t.cold.encoder().encode_uncached(&blob, false).unwrap().starts_with(&p.ids));
}

/// A text prompt longer than the budget: its leading ids as `encode_text` gives them.
#[test]
fn a_long_text_prompt_is_encoded_up_to_a_space_within_the_budget() {
    let t = tokenizers();
    let text = "Once upon a time a router learned to read KV events and route by them. ".repeat(200);
    let whole = t.cold.encode_text(&text).unwrap();
    let p = t.cold.encode_text_prefix(&text, 2048).unwrap().expect("Qwen3 adds no tokens around a text prompt");
    assert!(p.ids.len() > 200 && p.ids.len() < whole.len(), "{} of {} ids", p.ids.len(), whole.len());
    assert!(whole.starts_with(&p.ids));
    assert!(text.len() - p.rest_bytes <= 2048);
}

#[test]
fn corpus_encodes_like_whole_prompts() {
    let (mut encoded, mut rejected) = (0, 0);
    for case in common::corpus() {
        let name = case["name"].as_str().unwrap_or("?");
        let api = match case["api"].as_str() {
            Some("chat") => Api::ChatCompletions,
            Some("messages") => Api::Messages,
            Some("text") => {
                check_text(name, case["text"].as_str().unwrap_or_else(|| panic!("{name}: text case without text")));
                encoded += 1;
                continue;
            }
            other => panic!("{name}: unknown api {other:?}"),
        };
        if name.ends_with("_error") {
            check_rejected(name, &case["input"], api);
            rejected += 1;
        } else {
            check(&case["input"], api);
            encoded += 1;
        }
    }
    assert!(encoded > 0 && encoded > rejected, "the corpus must mostly encode: {encoded} encoded, {rejected} rejected");
}

#[test]
fn warm_turn_hits_the_cache() {
    let (dir, _) = common::fixture().expect("tokenizer fixture");
    let tok = ModelTokenizer::from_dir(&dir).expect("load");
    let mut rng = common::gen::rng(7);
    let conv = common::gen::openai(&mut rng, 6, 3);
    let steps = turns(&conv);
    let (last, prev) = (steps[steps.len() - 1].to_string(), steps[steps.len() - 2].to_string());
    tok.encode_chat(&prev, Api::ChatCompletions).unwrap();
    let before = tok.cache_stats();
    tok.encode_chat(&last, Api::ChatCompletions).unwrap();
    let after = tok.cache_stats();
    assert!(after.hit_bytes - before.hit_bytes > after.miss_bytes - before.miss_bytes, "{before:?} -> {after:?}");
}

/// One long user message grown by a paragraph (the shape of a fresh long prompt that repeats an
/// earlier one's text): the earlier text's chunks are cached, so a warm encoder encodes the
/// grown prompt whole within a budget far smaller than it, where a cold one cannot; every path
/// still equals whole-prompt encoding.
#[test]
fn a_prompt_repeating_cached_text_encodes_only_what_is_new() {
    let t = tokenizers();
    assert!(t.cold.encoder().chunks_pieces(), "Qwen3's chunk encodings concatenate to the whole");
    let words: Vec<String> = (0..6000).map(|i| format!("w{}{}", i % 97, ["", ",", ".", "'s", " -"][i % 5])).collect();
    let chat = |text: String| serde_json::json!({"messages": [{"role": "user", "content": text}]});
    let first = words[..3000].join(" ");
    let grown = format!("{first} and then {}", words[3000..3250].join(" "));
    check(&chat(grown.clone()), Api::ChatCompletions);
    let render = |text: String| t.cold.render_chat(&chat(text).to_string(), Api::ChatCompletions).unwrap().text;
    let (first, grown) = (render(first), render(grown));
    let whole = t.cold.encoder().encode_uncached(&grown, false).unwrap();
    let budget = 4096;
    assert!(grown.len() > 4 * budget, "{} bytes", grown.len());
    assert!(!t.cold.encoder().encode_prefix(&grown, budget).unwrap().complete());
    t.warm.encoder().encode(&first).unwrap();
    let warm = t.warm.encoder().encode_prefix(&grown, budget).unwrap();
    assert!(warm.complete(), "{} bytes left", warm.rest_bytes);
    assert_eq!(warm.ids, whole);
}
