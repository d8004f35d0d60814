//! Conformance with vLLM 0.33.0's own KV-event publisher.
//!
//! `tests/conformance/vllm_publisher.py` runs vLLM's real, unmodified `ZmqEventPublisher`
//! (fetched from PyPI by `tests/conformance/setup.sh` into the gitignored `.cache/`). Two
//! publishers play two data-parallel ranks of one worker; kvroute's real ingestion subscribes
//! to both, and after every published step the index must hold exactly the expected blocks.
//! Covered: uint64 hashes above 2^63, 32-byte binary hashes, negative hashes, GPU/CPU/nil
//! media, LoRA + cache salt in `extra_keys`, BlockRemoved, AllBlocksCleared, and a sequence gap
//! (a dropped live message) recovered from vLLM's replay socket.
//!
//! Needs python3 (setup.sh builds the venv). Without it the test fails, unless
//! `KVROUTE_SKIP_PY=1`, which turns it into a no-op.

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_state::ingest::{spawn_ingest, IngestConfig, IngestHandle, IngestStats, RejectKind};
use kvroute_kv::types::{BlockKey, EngineSlot};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const MODEL: &str = "Qwen/Qwen3-8B";
const BS: u32 = 4;
const H1: u64 = 0x8000_0000_0000_0001;
const H2: u64 = u64::MAX;
const H3: u64 = 0xdead_beef_0000_0003;
const H4: u64 = 0xfeed_0000_0000_0004;
const H5: u64 = 0xc0ff_ee00_0000_0005;
const H6: u64 = 6;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv's python, running setup.sh first if the venv or the vLLM sources are missing.
fn python() -> Option<PathBuf> {
    let skip = std::env::var("KVROUTE_SKIP_PY").is_ok_and(|v| v == "1");
    let cache = std::env::var_os("KVROUTE_CACHE_DIR").map_or_else(|| repo().join(".cache"), PathBuf::from);
    let py = cache.join("venv-vllm/bin/python");
    let ready = || py.exists() && cache.join("vllm-src/.complete").exists();
    if !ready() {
        let status = Command::new("bash").arg(repo().join("tests/conformance/setup.sh")).status();
        if !matches!(status, Ok(s) if s.success()) || !ready() {
            assert!(skip, "tests/conformance/setup.sh failed ({status:?}); set KVROUTE_SKIP_PY=1 to skip");
            eprintln!("KVROUTE_SKIP_PY=1: skipping the vLLM conformance test");
            return None;
        }
    }
    Some(py)
}

/// One `vllm_publisher.py` process, driven line by line over stdin/stdout.
struct Publisher {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    ready: Value,
}

impl Publisher {
    fn start(py: &PathBuf, scenario: Value) -> Publisher {
        let mut child = Command::new(py)
            .arg(repo().join("tests/conformance/vllm_publisher.py"))
            .arg("-")
            .env("VLLM_HOST_IP", "127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start vllm_publisher.py");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take().expect("stdin");
        let mut p = Publisher { child, stdin, lines, ready: Value::Null };
        p.send(&scenario.to_string());
        p.ready = p.expect("READY");
        p
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|_| self.stdin.flush()).expect("write to publisher");
    }

    /// The next line must start with `prefix`; returns the JSON after it (or the rest as text).
    fn expect(&mut self, prefix: &str) -> Value {
        let line = self.lines.recv_timeout(WAIT).unwrap_or_else(|e| panic!("publisher: no {prefix} line: {e}"));
        let rest = line.strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix}, got {line:?}")).trim();
        serde_json::from_str(rest).unwrap_or_else(|_| Value::String(rest.to_string()))
    }

    fn endpoint(&self, key: &str) -> String {
        self.ready[key].as_str().unwrap_or_else(|| panic!("READY has no {key}: {}", self.ready)).to_string()
    }

    /// Publishes the next step; returns its sequence number.
    fn next(&mut self) -> u64 {
        self.send("next");
        self.expect("SENT")["seq"].as_u64().expect("seq")
    }

    fn quit(mut self) {
        self.send("quit");
        self.expect("DONE");
        self.expect("BYE");
        assert!(self.child.wait().expect("wait").success());
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stored(hashes: Value, parent: Value, tokens: std::ops::Range<u32>, medium: Value) -> Value {
    json!({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
           "token_ids": tokens.collect::<Vec<_>>(), "block_size": BS, "lora_id": null,
           "medium": medium, "lora_name": null, "group_idx": 0})
}

fn scenario(dp_rank: u32, steps: Vec<Value>) -> Value {
    json!({"endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": "kv-events",
           "dp_rank": dp_rank, "linger_s": 60, "steps": steps})
}

/// Rank 0: chains, tiers, LoRA + salt, a dropped (replayed) step, binary and negative hashes.
fn rank0_steps() -> Vec<Value> {
    let mut lora = stored(json!([H4]), Value::Null, 100..104, json!("GPU"));
    lora["lora_name"] = json!("adapter-a");
    lora["lora_id"] = json!(1);
    lora["extra_keys"] = json!([["adapter-a", "salt-x"]]);
    let bin_hash = json!({"hex": format!("{}{:016x}", "ab".repeat(24), 0x1234_5678u64)});
    vec![
        json!({"events": [stored(json!([H1, H2]), Value::Null, 0..8, json!("GPU"))]}),
        json!({"events": [stored(json!([H3]), json!(H2), 8..12, json!("CPU")), lora]}),
        json!({"drop": true, "events": [stored(json!([H5]), json!(H3), 12..16, json!("GPU"))]}),
        json!({"events": [{"type": "BlockRemoved", "block_hashes": [H4], "medium": "GPU"},
                          stored(json!([bin_hash]), Value::Null, 200..204, Value::Null)]}),
        json!({"events": [{"type": "BlockRemoved", "block_hashes": [-5], "medium": "CPU"}]}),
    ]
}

/// Rank 1: shares rank 0's first block, then a prefix-cache reset, then a new block.
fn rank1_steps() -> Vec<Value> {
    vec![
        json!({"events": [stored(json!([H1]), Value::Null, 0..4, json!("GPU"))]}),
        json!({"events": [{"type": "AllBlocksCleared"}]}),
        json!({"events": [stored(json!([H6]), Value::Null, 50..54, json!("GPU"))]}),
    ]
}

fn keys(root: (&str, &str), tokens: std::ops::Range<u32>) -> Vec<BlockKey> {
    token_block_keys(&KeyRoot::new(root.0, root.1), &tokens.collect::<Vec<_>>(), BS as usize)
}

fn matches(index: &MemoryIndex, keys: &[BlockKey]) -> Vec<(u32, u32)> {
    let mut v: Vec<_> = index.match_prefix(keys).iter().map(|m| (m.engine.0, m.matched_blocks)).collect();
    v.sort();
    v
}

fn subscribe(p: &mut Publisher, engine: u32, rank: u32, index: &Arc<MemoryIndex>) -> (IngestHandle, Arc<IngestStats>) {
    let stats = Arc::new(IngestStats::new());
    let cfg = IngestConfig {
        engine: EngineSlot(engine),
        endpoint: p.endpoint("endpoint"),
        replay_endpoint: Some(p.endpoint("replay_endpoint")),
        topic: "kv-events".into(),
        model: MODEL.into(),
        block_size: BS,
        dp_rank: rank,
        replay_timeout: Duration::from_secs(5),
        resume_from: None,
    };
    let h = spawn_ingest(cfg, Arc::clone(index) as Arc<dyn KvIndex>, Arc::clone(&stats));
    p.send("wait_sub 1 20");
    assert_eq!(p.expect("SUBSCRIBED"), json!(1), "our SUB must reach vLLM's PUB");
    (h, stats)
}

#[test]
fn ingests_vllm_0_33_publisher_exactly() {
    let Some(py) = python() else { return };
    let index = Arc::new(MemoryIndex::new());
    let (a, b) = (EngineSlot(0), EngineSlot(1));
    let mut p0 = Publisher::start(&py, scenario(0, rank0_steps()));
    let mut p1 = Publisher::start(&py, scenario(1, rank1_steps()));
    let (h0, s0) = subscribe(&mut p0, a.0, 0, &index);
    let (h1, s1) = subscribe(&mut p1, b.0, 1, &index);
    let base = |r: std::ops::Range<u32>| keys((MODEL, ""), r);

    // Both ranks store the same first block: both match it.
    assert!(s0.wait_for_seq(p0.next(), WAIT) && s1.wait_for_seq(p1.next(), WAIT));
    assert_eq!(matches(&index, &base(0..16)), vec![(0, 2), (1, 1)]);

    assert!(s0.wait_for_seq(p0.next(), WAIT));
    assert_eq!(matches(&index, &base(0..16)), vec![(0, 3), (1, 1)], "CPU-tier child of a > 2^63 parent");
    let lora_salt = keys(("adapter-a", "salt-x"), 100..104);
    assert_eq!(matches(&index, &lora_salt), vec![(0, 1)], "LoRA name + cache salt from extra_keys");
    assert!(index.match_prefix(&keys(("adapter-a", ""), 100..104)).is_empty());

    // Step 2 is dropped on the live stream; step 3's arrival triggers replay of step 2.
    let dropped = p0.next();
    let live = p0.next();
    assert_eq!(live, dropped + 1);
    assert!(s0.wait_for_seq(live, WAIT));
    assert_eq!(matches(&index, &base(0..16)), vec![(0, 4), (1, 1)], "H5 came from replay");
    assert!(index.match_prefix(&lora_salt).is_empty(), "H4 removed");
    assert_eq!(matches(&index, &base(200..204)), vec![(0, 1)], "32-byte binary hash, nil medium");
    assert_eq!((s0.gaps.load(Relaxed), s0.gaps_recovered.load(Relaxed), s0.replayed_batches.load(Relaxed)), (1, 1, 1));

    assert!(s0.wait_for_seq(p0.next(), WAIT));
    assert_eq!(s0.rejected(RejectKind::UnknownHash), 1, "negative hash never stored");

    // Rank 1: AllBlocksCleared, then a new block.
    assert!(s1.wait_for_seq(p1.next(), WAIT));
    assert_eq!(index.engine_blocks(b), 0);
    assert!(s1.wait_for_seq(p1.next(), WAIT));
    assert_eq!(matches(&index, &base(50..54)), vec![(1, 1)]);

    assert_eq!(index.engine_blocks(a), 5, "H1 H2 H3 H5 and the binary-hash block");
    assert_eq!(index.engine_blocks(b), 1);
    for s in [&s0, &s1] {
        assert_eq!(s.dp_rank_mismatches.load(Relaxed), 0, "vLLM stamps each rank's batches");
        for k in [RejectKind::MalformedMessage, RejectKind::BadBatch, RejectKind::BadEvent, RejectKind::UnknownParent, RejectKind::BadBlock] {
            assert_eq!(s.rejected(k), 0, "{k:?}");
        }
        assert_eq!(s.resets.load(Relaxed), 0);
    }
    h0.stop();
    h1.stop();
    p0.quit();
    p1.quit();
}
