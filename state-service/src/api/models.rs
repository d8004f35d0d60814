//! `GET /v1/models`: per model, its block size, workers and local tokenizer (status,
//! directory, load error, piece-cache stats), and whether its worker `/tokenize` path is
//! paused after a failure.

use crate::config::Config;
use crate::fleet::Fleet;
use crate::tokenization::Tokenization;
use std::sync::Arc;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub async fn models(State(fleet): State<Arc<Fleet>>, State(tokenization): State<Arc<Tokenization>>, State(config): State<Arc<Config>>) -> Json<Value> {
    let mut workers: BTreeMap<String, (u32, Vec<String>)> = BTreeMap::new();
    for w in fleet.workers() {
        let entry = workers.entry(w.config.model.clone()).or_insert((w.block_size, Vec::new()));
        entry.1.push(w.id.to_string());
    }
    let statuses = tokenization.local.statuses(workers.keys().cloned());
    let models: Vec<Value> = statuses
        .into_iter()
        .map(|(model, tokenizer)| {
            let (block_size, ids) = workers.get(&model).cloned().unwrap_or((config.block_size(&model), Vec::new()));
            json!({
                "model": model,
                "block_size": block_size,
                "workers": ids,
                "tokenizer": tokenizer,
                "worker_tokenize_paused": tokenization.worker_paused(&model),
            })
        })
        .collect();
    Json(json!({ "models": models }))
}
