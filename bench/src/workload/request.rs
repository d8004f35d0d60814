//! Turning a session's turn (plus the answers received so far) into an OpenAI request body.
//!
//! Token mode: `/v1/completions` with `prompt: [ids]` = system ++ (user_i ++ answer_i)* ++
//! user_k. Chat mode: `/v1/chat/completions` with system / user / assistant messages.
//! Both stream (`stream: true`) with `ignore_eos` so every answer is exactly `max_tokens`
//! long and the load does not depend on when a model happens to stop.

use super::{Content, PromptMode, Session};
use serde_json::{json, Value};

/// What came back for an earlier turn, carried into the next turn's prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Token ids the server returned, or a seeded stand-in of the answer's length when the
    /// server does not return ids (the history's prefix still matches up to that answer).
    Tokens(Vec<u32>),
    Text(String),
}

pub fn path(mode: PromptMode) -> &'static str {
    match mode {
        PromptMode::Tokens => "/v1/completions",
        PromptMode::Chat => "/v1/chat/completions",
    }
}

/// Body for turn `turn` of `session`; `answers` holds the answers of turns `0..turn`.
pub fn body(model: &str, mode: PromptMode, session: &Session, turn: usize, answers: &[Answer]) -> Value {
    let max_tokens = session.turns[turn].max_tokens;
    let common = |mut v: Value| {
        v["model"] = json!(model);
        v["max_tokens"] = json!(max_tokens);
        v["stream"] = json!(true);
        v["ignore_eos"] = json!(true);
        v["stream_options"] = json!({"include_usage": true});
        v
    };
    match mode {
        PromptMode::Tokens => {
            let mut ids: Vec<u32> = Vec::new();
            if let Some(Content::Tokens(t)) = &session.system {
                ids.extend_from_slice(t);
            }
            for (i, t) in session.turns[..=turn].iter().enumerate() {
                if let Content::Tokens(u) = &t.user {
                    ids.extend_from_slice(u);
                }
                if let Some(Answer::Tokens(a)) = answers.get(i).filter(|_| i < turn) {
                    ids.extend_from_slice(a);
                }
            }
            common(json!({ "prompt": ids }))
        }
        PromptMode::Chat => {
            let mut messages = Vec::new();
            if let Some(Content::Text(s)) = &session.system {
                messages.push(json!({"role": "system", "content": s}));
            }
            for (i, t) in session.turns[..=turn].iter().enumerate() {
                if let Content::Text(u) = &t.user {
                    messages.push(json!({"role": "user", "content": u}));
                }
                if let Some(Answer::Text(a)) = answers.get(i).filter(|_| i < turn) {
                    messages.push(json!({"role": "assistant", "content": a}));
                }
            }
            common(json!({ "messages": messages }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Turn;

    fn session(mode: PromptMode) -> Session {
        let c = |n: u32| match mode {
            PromptMode::Tokens => Content::Tokens(vec![n; 2]),
            PromptMode::Chat => Content::Text(format!("m{n}")),
        };
        Session {
            id: 0,
            at_s: None,
            group: None,
            system: Some(c(1)),
            turns: vec![Turn { user: c(2), max_tokens: 3 }, Turn { user: c(3), max_tokens: 4 }],
        }
    }

    #[test]
    fn token_history_is_prefix_of_next_turn() {
        let s = session(PromptMode::Tokens);
        let b0 = body("m", PromptMode::Tokens, &s, 0, &[]);
        assert_eq!(b0["prompt"], json!([1, 1, 2, 2]));
        let b1 = body("m", PromptMode::Tokens, &s, 1, &[Answer::Tokens(vec![9])]);
        assert_eq!(b1["prompt"], json!([1, 1, 2, 2, 9, 3, 3]));
        assert_eq!(b1["max_tokens"], json!(4));
        assert_eq!(b1["stream"], json!(true));
    }

    #[test]
    fn chat_history_has_roles() {
        let s = session(PromptMode::Chat);
        let b1 = body("m", PromptMode::Chat, &s, 1, &[Answer::Text("a0".into())]);
        let roles: Vec<_> = b1["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(b1["messages"][2]["content"], json!("a0"));
    }
}
