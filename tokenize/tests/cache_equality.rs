//! The piece cache never changes token ids: for random conversations growing turn by turn
//! (warm: shared cache; small cache: constant eviction; cold: split but uncached) and for
//! random text around added tokens, ids equal whole-prompt tokenization.

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

fn check(input: &Json, api: Api) {
    let t = tokenizers();
    let text = input.to_string();
    let whole = t.warm.encode_chat_uncached(&text, api);
    for (name, tok) in [("warm", &t.warm), ("tiny", &t.tiny), ("cold", &t.cold)] {
        let got = tok.encode_chat(&text, api);
        match (&got, &whole) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{name} differs for {input}"),
            (Err(_), Err(_)) => {}
            _ => panic!("{name}: {got:?} vs {whole:?}"),
        }
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
        prop_assert_eq!(&t.warm.encoder().encode(&text).unwrap(), &whole);
        prop_assert_eq!(&t.cold.encoder().encode(&text).unwrap(), &whole);
        prop_assert_eq!(&t.tiny.encoder().encode(&text).unwrap(), &whole);
    }
}

#[test]
fn corpus_encodes_like_whole_prompts() {
    for case in common::corpus() {
        match case["api"].as_str() {
            Some("chat") => check(&case["input"], Api::ChatCompletions),
            Some("messages") => check(&case["input"], Api::Messages),
            _ => {}
        }
    }
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
