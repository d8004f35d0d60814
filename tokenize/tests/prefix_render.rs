//! Incremental rendering never changes the prompt: for random conversations sent turn by turn
//! (every prefix, so tool loops and assistant prefills too, with a shared, a tiny (evicting)
//! and no render cache), `render_chat` equals `render_chat_full`, errors included.

mod common;

use kvroute_tokenize::{Api, ModelTokenizer, TokenizerOptions};
use proptest::prelude::*;
use serde_json::{json, Value as Json};
use std::sync::OnceLock;

fn tokenizers() -> &'static [ModelTokenizer; 2] {
    static T: OnceLock<[ModelTokenizer; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let (dir, _) = common::fixture().expect("tokenizer fixture");
        let with = |render_cache_bytes| ModelTokenizer::from_dir_with(&dir, TokenizerOptions { render_cache_bytes, ..TokenizerOptions::default() }).expect("load");
        [with(64 << 20), with(16 * 2 * 4000)]
    })
}

fn check(input: &Json) {
    let text = input.to_string();
    for tok in tokenizers() {
        let (got, want) = (tok.render_chat(&text, Api::ChatCompletions), tok.render_chat_full(&text, Api::ChatCompletions));
        match (&got, &want) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "differs for {input}"),
            (Err(_), Err(_)) => {}
            _ => panic!("{got:?} vs {want:?} for {input}"),
        }
    }
}

/// Every prefix of the conversation, in order, with the generation prompt, and the whole
/// conversation without it.
fn steps(input: &Json) -> Vec<Json> {
    let messages = input["messages"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<Json> = (1..=messages.len())
        .map(|n| {
            let mut step = input.clone();
            step["messages"] = Json::Array(messages[..n].to_vec());
            step
        })
        .collect();
    let mut last = input.clone();
    last["add_generation_prompt"] = json!(false);
    out.push(last);
    out
}

#[test]
fn the_fixture_template_renders_incrementally() {
    assert!(tokenizers()[0].renders_incrementally());
}

#[test]
fn corpus_renders_like_the_full_path() {
    for case in common::corpus().iter().filter(|c| c["api"] == "chat") {
        for step in steps(&case["input"]) {
            check(&step);
        }
    }
}

#[test]
fn a_changed_history_or_context_is_not_reused() {
    let base = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning": "r"}, {"role": "user", "content": "q2"}]});
    check(&base);
    let mut edited = base.clone();
    edited["messages"][1]["content"] = json!("q1 edited");
    edited["messages"].as_array_mut().unwrap().push(json!({"role": "assistant", "content": "a2"}));
    edited["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": "q3"}));
    check(&edited);
    let mut kwargs = edited.clone();
    kwargs["chat_template_kwargs"] = json!({"enable_thinking": false});
    check(&kwargs);
    let mut developer = edited.clone();
    developer["messages"].as_array_mut().unwrap().push(json!({"role": "developer", "content": "d"}));
    check(&developer);
    let mut bad = edited.clone();
    bad["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": 5}));
    check(&bad);
    check(&json!({"messages": []}));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn growing_conversations_render_like_the_full_path(seed in any::<u64>(), turns_n in 1usize..8, size in 1usize..4) {
        let mut rng = common::gen::rng(seed);
        let chat = common::gen::openai(&mut rng, turns_n, size);
        for step in steps(&chat) {
            check(&step);
        }
    }
}
