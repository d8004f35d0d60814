//! Exact prefix hits for chat conversations through real Envoy, the real state service and
//! simulated vLLM workers that tokenize with the Qwen3 tokenizer and chat template (fixture:
//! `tokenize/fetch-tokenizer.sh`).
//!
//! Turn two of a conversation re-sends turn one's messages, the assistant's answer and a new
//! user message. The worker of turn one caches turn one's rendered prompt and the answer's
//! generated ids (all but the last, which is sampled but never computed, as in vLLM); the
//! simulator's answer text is the decoding of those ids and re-tokenizes to them, as a real
//! worker's does. With the state service tokenizing chat prompts like vLLM, turn two's pick
//! matches every full block of turn one's prompt *and answer*, lands on that worker, and the
//! worker's own prefix-cache hit counter grows by exactly those blocks. With the state
//! service's tokenizer directory missing, the pick falls to the worker's `/tokenize` (still
//! exact, degraded), and with that disabled to text chunks; the decision header
//! (`degraded=`, `tokenization=`) and the metrics say which.
//!
//! The expected count is derived from the worker's own `/tokenize` of turn one's prompt, of
//! the answer text and of turn two's prompt, never hard-coded.
//!
//! This file starts its own small stack (the shared `Stack` starts the simulator without a
//! tokenizer) from the harness's parts: `Proc`, `Envoy`, the readiness helpers.

use anyhow::{bail, Context, Result};
use kvroute_e2e::envoy::{worker_cluster, Envoy, EnvoyOptions, Mode};
use kvroute_e2e::llm::{decision_field, header};
use kvroute_e2e::net::{free_port, free_port_range, wait_for, wait_http_ok, API_TOKEN};
use kvroute_e2e::paths::repo_root;
use kvroute_e2e::proc::Proc;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const MODEL: &str = "kvroute/sim-27b-fp8";
const BLOCK: usize = 16;
/// Answer length: long enough that the answer fills blocks of its own.
const ANSWER: usize = 40;

fn bin(name: &str) -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug").join(name);
    if !p.is_file() {
        bail!("{} not found: run `cargo build -p kvroute-state -p kvroute-sim` first", p.display());
    }
    Ok(p)
}

fn tokenizer_fixture() -> Result<PathBuf> {
    let out = Command::new("bash").arg(repo_root().join("tokenize/fetch-tokenizer.sh")).output().context("fetch-tokenizer.sh")?;
    if !out.status.success() {
        bail!("tokenize/fetch-tokenizer.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

struct ChatStack {
    sim: Proc,
    state: Proc,
    envoy: Envoy,
    http_base: u16,
    state_port: u16,
    client: reqwest::Client,
}

impl ChatStack {
    /// `state_tokenizer`: the state service's `tokenizer_dir` for the model; `tokenization`:
    /// extra lines of its `[tokenization]` section.
    async fn start(workers: u16, state_tokenizer: PathBuf, tokenization: &str) -> Result<ChatStack> {
        let fixture = tokenizer_fixture()?;
        let (http_base, zmq_base) = (free_port_range(workers), free_port_range(2 * workers));
        let sim_args: Vec<String> = [
            "--workers", &workers.to_string(), "--http-port", &http_base.to_string(), "--zmq-port", &zmq_base.to_string(),
            "--time-scale", "0.2", "--model", MODEL, "--tokenizer-dir", &fixture.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut sim = Proc::spawn("sim-chat", &bin("kvroute-sim")?, &sim_args)?;
        for i in 0..workers {
            if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{}/health", http_base + i), Duration::from_secs(60)).await {
                sim.check_alive()?;
                return Err(e);
            }
        }
        let state_port = free_port();
        let mut toml = format!(
            "listen = \"127.0.0.1:{state_port}\"\nseed = 7\napi_token = \"{API_TOKEN}\"\n\n[tokenization]\nworker_timeout_ms = 3000\n{tokenization}\n\n\
             [models.\"{MODEL}\"]\nblock_size = {BLOCK}\ntokenizer_dir = {:?}\n",
            state_tokenizer.display().to_string()
        );
        for i in 0..workers {
            let (http, zmq) = (http_base + i, zmq_base + 2 * i);
            toml.push_str(&format!(
                "\n[[workers]]\nid = \"{i}\"\nmodel = \"{MODEL}\"\nendpoint = \"127.0.0.1:{http}\"\ncluster = \"{}\"\n\
                 events_endpoint = \"tcp://127.0.0.1:{zmq}\"\nreplay_endpoint = \"tcp://127.0.0.1:{}\"\n\
                 metrics_url = \"http://127.0.0.1:{http}/metrics\"\n",
                worker_cluster(i as usize),
                zmq + 1
            ));
        }
        let config = std::env::temp_dir().join(format!("kvroute-e2e-chat-{state_port}.toml"));
        std::fs::write(&config, toml)?;
        let mut state = Proc::spawn("state-chat", &bin("kvroute-state")?, &["--config".to_string(), config.display().to_string()])?;
        if let Err(e) = wait_http_ok(&format!("http://127.0.0.1:{state_port}/readyz"), Duration::from_secs(60)).await {
            state.check_alive()?;
            return Err(e);
        }
        let envoy = Envoy::start(EnvoyOptions {
            mode: Mode::Endpoint,
            worker_ports: (0..workers).map(|i| http_base + i).collect(),
            state_port,
            plugin: json!({}),
        })
        .await?;
        let client = kvroute_e2e::net::client(Duration::from_secs(60));
        let stack = ChatStack { sim, state, envoy, http_base, state_port, client };
        wait_for("every worker healthy", Duration::from_secs(30), || async {
            let v = stack.state_json("/v1/workers").await.ok()?;
            v["workers"].as_array()?.iter().all(|w| w["healthy"].as_bool() == Some(true)).then_some(())
        })
        .await?;
        Ok(stack)
    }

    async fn state_json(&self, path: &str) -> Result<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.state_port);
        Ok(self.client.get(url).send().await?.error_for_status()?.json().await?)
    }

    async fn state_metrics(&self) -> Result<String> {
        Ok(self.client.get(format!("http://127.0.0.1:{}/metrics", self.state_port)).send().await?.text().await?)
    }

    fn worker_url(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http_base as usize + i)
    }

    /// The worker's own `/tokenize` of a chat (vLLM's shape): what it will cache.
    async fn worker_ids(&self, messages: &[Value]) -> Result<Vec<u64>> {
        self.tokenize(json!({"model": MODEL, "messages": messages, "add_generation_prompt": true})).await
    }

    /// The worker's own `/tokenize` of a plain text (the answer: the model adds no BOS).
    async fn text_ids(&self, text: &str) -> Result<Vec<u64>> {
        self.tokenize(json!({"model": MODEL, "prompt": text})).await
    }

    async fn tokenize(&self, body: Value) -> Result<Vec<u64>> {
        let v: Value = self.client.post(self.worker_url(0, "/tokenize")).json(&body).send().await?.error_for_status()?.json().await?;
        v["tokens"].as_array().context("tokens")?.iter().map(|t| t.as_u64().context("token id")).collect()
    }

    async fn prefix_hits(&self, i: usize) -> Result<f64> {
        let text = self.client.get(self.worker_url(i, "/metrics")).send().await?.text().await?;
        text.lines()
            .find(|l| l.starts_with("vllm:prefix_cache_hits_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .context("vllm:prefix_cache_hits_total in the worker's metrics")
    }

    /// No assignment in flight and no worker busy: reports arrived, the next pick sees equal load.
    async fn wait_idle(&self) -> Result<()> {
        wait_for("idle fleet", Duration::from_secs(20), || async {
            let v = self.state_json("/v1/workers").await.ok()?;
            let busy = v["workers"].as_array()?.iter().any(|w| w["load"]["running"].as_u64() != Some(0) || w["load"]["waiting"].as_u64() != Some(0));
            (v["assignments"].as_u64() == Some(0) && !busy).then_some(())
        })
        .await
    }

    /// The state service's index of worker `i` holds as many blocks as the worker caches
    /// (its KV events arrived), and that is at least `blocks`.
    async fn wait_index(&self, i: usize, blocks: u64) -> Result<()> {
        wait_for(&format!("worker {i} index in sync, >= {blocks}"), Duration::from_secs(20), || async {
            let sim: Value = self.client.get(self.worker_url(i, "/sim/state")).send().await.ok()?.json().await.ok()?;
            let cached = sim["cached_block_hashes"].as_array()?.len() as u64;
            let v = self.state_json("/v1/workers").await.ok()?;
            let w = v["workers"].as_array()?.iter().find(|w| w["id"].as_str() == Some(&i.to_string()))?.clone();
            let indexed = w["index_blocks"].as_u64()?;
            (indexed == cached && indexed >= blocks).then_some(())
        })
        .await
    }

    /// A chat completion of [`ANSWER`] tokens through Envoy: (worker, decision header, answer
    /// message).
    async fn chat(&self, messages: &[Value]) -> Result<(String, String, Value)> {
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": ANSWER, "ignore_eos": true});
        let r = self.client.post(self.envoy.url("/v1/chat/completions")).json(&body).send().await?;
        if r.status() != 200 {
            bail!("status {}: {}", r.status(), self.logs());
        }
        let (worker, decision) = (header(&r, "x-sim-worker"), header(&r, "x-kvroute-decision"));
        let answer: Value = r.json().await?;
        self.wait_idle().await?;
        Ok((worker, decision, answer["choices"][0]["message"].clone()))
    }

    fn logs(&self) -> String {
        format!("--- state ---\n{}\n--- envoy ---\n{}\n--- sim ---\n{}", self.state.log_tail(3000), self.envoy.proc.log_tail(2000), self.sim.log_tail(2000))
    }
}

fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One conversation: turn two must land on turn one's worker with every shared full block
/// matched, in the decision header and in the worker's prefix-cache hits.
async fn conversation(s: &ChatStack, conv: usize) -> Result<String> {
    let system = format!("You are careful assistant number {conv} for the kvroute project. ").repeat(20);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": format!("Conversation {conv}: explain prefix caching in detail.")}),
    ];
    let turn1 = s.worker_ids(&messages).await?;
    let (first, decision1, answer) = s.chat(&messages).await?;
    let w: usize = first.parse().with_context(|| format!("x-sim-worker {first:?}"))?;
    assert_eq!(decision_field(&decision1, "total").as_deref(), Some((turn1.len() / BLOCK).to_string().as_str()), "{decision1}");

    // What turn one's worker computed and cached: the prompt, then the answer's ids but the
    // last (sampled, never fed back).
    let text = answer["content"].as_str().context("answer content")?;
    let answer_ids = s.text_ids(text).await?;
    assert_eq!(answer_ids.len(), ANSWER, "the answer text re-tokenizes to the {ANSWER} generated ids: {text:?}");
    let computed = [turn1.as_slice(), answer_ids.as_slice()].concat();
    let cached_blocks = (computed.len() - 1) / BLOCK;
    s.wait_index(w, cached_blocks as u64).await?;

    messages.push(json!({"role": "assistant", "content": text}));
    messages.push(json!({"role": "user", "content": "And how does routing use it?"}));
    let turn2 = s.worker_ids(&messages).await?;
    assert_eq!(common_prefix(&computed, &turn2), computed.len(), "turn two's rendering starts with turn one's prompt and answer");
    // vLLM never serves turn two's last prompt token from the cache.
    let shared_blocks = cached_blocks.min((turn2.len() - 1) / BLOCK);
    assert!(shared_blocks > turn1.len() / BLOCK, "the answer's blocks count: {shared_blocks} vs prompt {}", turn1.len() / BLOCK);
    let hits_before = s.prefix_hits(w).await?;
    let (second, decision2, _) = s.chat(&messages).await?;
    assert_eq!(second, first, "conversation {conv}: {decision2}\n{}", s.logs());
    assert_eq!(decision_field(&decision2, "matched"), Some(shared_blocks.to_string()), "{decision2}");
    assert_eq!(decision_field(&decision2, "total"), Some((turn2.len() / BLOCK).to_string()), "{decision2}");
    let hits = s.prefix_hits(w).await? - hits_before;
    assert_eq!(hits, (shared_blocks * BLOCK) as f64, "worker {w} prefix-cache hit tokens for turn two ({decision2})");
    Ok(decision2)
}

/// An Anthropic `/v1/messages` request of [`ANSWER`] tokens through Envoy, streamed:
/// (worker, decision header, answer text, the `message_delta` usage).
async fn anthropic(s: &ChatStack, system: &str, messages: &[Value]) -> Result<(String, String, String, Value)> {
    let body = json!({"model": MODEL, "system": system, "messages": messages, "max_tokens": ANSWER, "ignore_eos": true, "stream": true});
    let r = s.client.post(s.envoy.url("/v1/messages")).json(&body).send().await?;
    if r.status() != 200 {
        bail!("status {}: {}", r.status(), s.logs());
    }
    let (worker, decision) = (header(&r, "x-sim-worker"), header(&r, "x-kvroute-decision"));
    let sse = r.text().await?;
    let events: Vec<Value> = sse.split("\n\n").filter_map(|e| serde_json::from_str(e.split_once("\ndata: ")?.1).ok()).collect();
    let text: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    let usage = events.iter().find(|e| e["type"] == "message_delta").map(|e| e["usage"].clone()).with_context(|| format!("message_delta in {sse}"))?;
    s.wait_idle().await?;
    Ok((worker, decision, text, usage))
}

/// Anthropic's Messages API (vLLM's `/v1/messages`, as agents speaking Anthropic use it):
/// the state service converts and renders the request as vLLM does, so turn two lands on turn
/// one's worker with every shared full block matched, and the worker's own usage reports
/// exactly those tokens as cache reads. The stream's reports close every assignment.
#[tokio::test]
async fn anthropic_turn_two_hits_turn_one_worker_exactly() -> Result<()> {
    let s = ChatStack::start(3, tokenizer_fixture()?, "").await?;
    let system = "You are the kvroute project's careful assistant; answer in detail. ".repeat(20);
    let user = |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}]});
    let mut messages = vec![user("Explain prefix caching in detail.")];
    // The same conversation as OpenAI chat messages: what the worker renders and caches.
    let mut chat = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": "Explain prefix caching in detail."})];
    let turn1 = s.worker_ids(&chat).await?;
    let (first, decision1, text, usage1) = anthropic(&s, &system, &messages).await?;
    let w: usize = first.parse().with_context(|| format!("x-sim-worker {first:?}"))?;
    assert_eq!(usage1["input_tokens"].as_u64(), Some(turn1.len() as u64), "converted like the chat request: {usage1}");
    assert_eq!(decision_field(&decision1, "tokenization").as_deref(), Some("local"), "{decision1}");
    assert_eq!(decision_field(&decision1, "total"), Some((turn1.len() / BLOCK).to_string()), "{decision1}");

    let answer_ids = s.text_ids(&text).await?;
    assert_eq!(answer_ids.len(), ANSWER, "the streamed answer re-tokenizes to the generated ids: {text:?}");
    let computed = [turn1.as_slice(), answer_ids.as_slice()].concat();
    let cached_blocks = (computed.len() - 1) / BLOCK;
    s.wait_index(w, cached_blocks as u64).await?;

    messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text}]}));
    messages.push(user("And how does routing use it?"));
    chat.push(json!({"role": "assistant", "content": text}));
    chat.push(json!({"role": "user", "content": "And how does routing use it?"}));
    let turn2 = s.worker_ids(&chat).await?;
    assert_eq!(common_prefix(&computed, &turn2), computed.len(), "turn two's rendering starts with turn one's prompt and answer");
    let shared_blocks = cached_blocks.min((turn2.len() - 1) / BLOCK);
    let (second, decision2, _, usage2) = anthropic(&s, &system, &messages).await?;
    assert_eq!(second, first, "{decision2}\n{}", s.logs());
    assert_eq!(decision_field(&decision2, "matched"), Some(shared_blocks.to_string()), "{decision2}");
    assert_eq!(decision_field(&decision2, "degraded").as_deref(), Some("none"), "{decision2}");
    assert_eq!(usage2["cache_read_input_tokens"].as_u64(), Some((shared_blocks * BLOCK) as u64), "{usage2}");
    assert_eq!(usage2["input_tokens"].as_u64(), Some((turn2.len() - shared_blocks * BLOCK) as u64), "{usage2}");
    let m = s.state_metrics().await?;
    assert_eq!(metric(&m, r#"kvroute_tokenization_total{path="local"}"#), 2, "{m}");
    Ok(())
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn turn_two_hits_turn_one_worker_exactly_with_the_local_tokenizer() -> Result<()> {
    let s = ChatStack::start(3, tokenizer_fixture()?, "").await?;
    for conv in 0..3 {
        let decision = conversation(&s, conv).await?;
        assert_eq!(decision_field(&decision, "degraded").as_deref(), Some("none"), "{decision}");
        assert_eq!(decision_field(&decision, "tokenization").as_deref(), Some("local"), "{decision}");
    }
    let m = s.state_metrics().await?;
    assert_eq!(metric(&m, r#"kvroute_tokenization_total{path="local"}"#), 6, "{m}");
    assert_eq!(metric(&m, r#"kvroute_tokenizer_loaded{model="kvroute/sim-27b-fp8"}"#), 1);
    assert!(metric(&m, r#"kvroute_tokenizer_cache_hits_total{model="kvroute/sim-27b-fp8"}"#) > 0, "{m}");
    Ok(())
}

#[tokio::test]
async fn missing_tokenizer_dir_falls_to_the_worker_tokenize_and_stays_exact() -> Result<()> {
    let s = ChatStack::start(3, PathBuf::from("/nonexistent/kvroute-tokenizer"), "").await?;
    let decision = conversation(&s, 7).await?;
    assert_eq!(decision_field(&decision, "degraded").as_deref(), Some("tokenizer_unavailable"), "{decision}");
    assert_eq!(decision_field(&decision, "tokenization").as_deref(), Some("worker"), "{decision}");
    let m = s.state_metrics().await?;
    assert_eq!(metric(&m, r#"kvroute_tokenization_total{path="worker"}"#), 2, "{m}");
    assert_eq!(metric(&m, r#"kvroute_degraded_decisions_total{reason="tokenizer_unavailable"}"#), 2);
    assert_eq!(metric(&m, "kvroute_tokenizer_load_failures_total"), 1);
    let models = s.state_json("/v1/models").await?;
    assert_eq!(models["models"][0]["tokenizer"]["status"], "failed", "{models}");
    Ok(())
}

#[tokio::test]
async fn without_any_tokenizer_picks_use_text_chunks_and_say_so() -> Result<()> {
    let s = ChatStack::start(2, PathBuf::from("/nonexistent/kvroute-tokenizer"), "worker_fallback = false").await?;
    let messages = vec![json!({"role": "user", "content": "Explain prefix caching. ".repeat(40)})];
    let (_, decision, _) = s.chat(&messages).await?;
    assert_eq!(decision_field(&decision, "degraded").as_deref(), Some("tokenizer_unavailable"), "{decision}");
    assert_eq!(decision_field(&decision, "tokenization").as_deref(), Some("text_chunks"), "{decision}");
    let m = s.state_metrics().await?;
    assert_eq!(metric(&m, r#"kvroute_tokenization_total{path="text_chunks"}"#), 1, "{m}");
    assert_eq!(metric(&m, r#"kvroute_tokenization_failures_total{path="local",reason="unavailable"}"#), 1);
    Ok(())
}
