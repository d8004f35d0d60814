//! Ingestion against an in-process fake engine: an XPUB (so the test can see the subscription
//! arrive before it publishes: no slow-joiner sleeps) and a ROUTER serving replay on demand.

use super::*;
use kvroute_kv::index::memory::MemoryIndex;
use rmpv::Value;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

struct FakeEngine {
    xpub: zmq::Socket,
    router: zmq::Socket,
    endpoint: String,
    replay_endpoint: String,
    buffer: Vec<(u64, Vec<u8>)>,
}

fn bind(kind: zmq::SocketType) -> (zmq::Socket, String) {
    let s = zmq_context().socket(kind).unwrap();
    s.set_linger(0).unwrap();
    s.bind("tcp://127.0.0.1:0").unwrap();
    let ep = s.get_last_endpoint().unwrap().unwrap();
    (s, ep)
}

impl FakeEngine {
    fn new() -> Self {
        let (xpub, endpoint) = bind(zmq::XPUB);
        let (router, replay_endpoint) = bind(zmq::ROUTER);
        router.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
        FakeEngine { xpub, router, endpoint, replay_endpoint, buffer: Vec::new() }
    }

    fn start(&self, index: &Arc<MemoryIndex>, replay: bool, timeout: Duration) -> (IngestHandle, Arc<IngestStats>) {
        let stats = Arc::new(IngestStats::new());
        let cfg = IngestConfig {
            engine: EngineSlot(3),
            endpoint: self.endpoint.clone(),
            replay_endpoint: replay.then(|| self.replay_endpoint.clone()),
            topic: "kv".into(),
            model: "m".into(),
            block_size: 4,
            dp_rank: 0,
            replay_timeout: timeout,
            resume_from: None,
        };
        let h = spawn_ingest(cfg, Arc::clone(index) as Arc<dyn KvIndex>, Arc::clone(&stats));
        // XPUB hands us the subscription message once the subscriber is really there.
        self.xpub.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
        assert_eq!(self.xpub.recv_bytes(0).unwrap(), b"\x01kv");
        (h, stats)
    }

    /// Publishes `payload` as `seq`; `live = false` only buffers it (a dropped message).
    fn publish(&mut self, seq: u64, payload: Vec<u8>, live: bool) {
        if live {
            self.xpub.send_multipart([&b"kv"[..], &seq.to_be_bytes(), &payload], 0).unwrap();
        }
        self.buffer.push((seq, payload));
    }

    /// Answers one replay request like vLLM (`legacy`: without the topic frame).
    fn serve_replay(&self, legacy: bool) {
        let req = self.router.recv_multipart(0).unwrap();
        assert_eq!(req.len(), 3, "[id, empty, start]");
        let start = u64::from_be_bytes(req[2].as_slice().try_into().unwrap());
        for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
            let seq = seq.to_be_bytes();
            let mut frames: Vec<&[u8]> = vec![&req[0], b""];
            if !legacy {
                frames.push(b"kv");
            }
            frames.extend([&seq[..], &payload[..]]);
            self.router.send_multipart(frames, 0).unwrap();
        }
        self.router.send_multipart([&req[0][..], b"", b"", &u64::MAX.to_be_bytes(), b""], 0).unwrap();
    }
}

fn batch(events: Vec<Value>, rank: i64) -> Vec<u8> {
    let v = Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::from(rank)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

fn store(hash: u64, parent: Option<u64>, first_token: u32) -> Value {
    Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        ("block_hashes".into(), Value::Array(vec![Value::from(hash)])),
        ("parent_block_hash".into(), parent.map_or(Value::Nil, Value::from)),
        ("token_ids".into(), Value::Array((first_token..first_token + 4).map(Value::from).collect())),
        ("block_size".into(), Value::from(4)),
        ("lora_id".into(), Value::Nil),
        ("medium".into(), "GPU".into()),
        ("lora_name".into(), Value::Nil),
    ])
}

fn remove(hash: u64) -> Value {
    Value::Map(vec![
        ("type".into(), "BlockRemoved".into()),
        ("block_hashes".into(), Value::Array(vec![Value::from(hash)])),
        ("medium".into(), "GPU".into()),
    ])
}

const BIG: u64 = 0x8000_0000_0000_0001;

#[test]
fn applies_in_order_and_skips_duplicates_and_junk() {
    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    let (h, stats) = fake.start(&index, false, WAIT);
    fake.publish(0, batch(vec![store(BIG, None, 0), store(2, Some(BIG), 4)], 0), true);
    fake.publish(0, batch(vec![remove(BIG)], 0), true); // duplicate seq: skipped
    fake.xpub.send_multipart([&b"kv"[..], b"short"], 0).unwrap();
    fake.xpub.send_multipart([&b"kv"[..], &[0; 4], b""], 0).unwrap();
    fake.publish(1, vec![0xc1], true);
    fake.publish(2, batch(vec![remove(2), remove(77), Value::from(5)], 1), true);
    assert!(stats.wait_for_seq(2, WAIT));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 1);
    assert_eq!(stats.duplicates.load(Ordering::Relaxed), 1);
    assert_eq!(stats.rejected(RejectKind::MalformedMessage), 2);
    assert_eq!(stats.rejected(RejectKind::BadBatch), 1);
    assert_eq!(stats.rejected(RejectKind::BadEvent), 1);
    assert_eq!(stats.rejected(RejectKind::UnknownHash), 1);
    assert_eq!(stats.events(EventKind::BlockStored), 2);
    assert_eq!(stats.events(EventKind::BlockRemoved), 2);
    assert_eq!((stats.blocks_stored.load(Ordering::Relaxed), stats.blocks_removed.load(Ordering::Relaxed)), (2, 1));
    assert_eq!(stats.dp_rank_mismatches.load(Ordering::Relaxed), 1, "rank 1 on a rank-0 endpoint");
    assert_eq!(stats.batches.load(Ordering::Relaxed), 2);
    assert!(stats.last_event_unix_ms.load(Ordering::Relaxed) > 0);
    h.stop();
}

#[test]
fn a_gap_is_replayed_in_both_reply_layouts() {
    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    let (_h, stats) = fake.start(&index, true, WAIT);
    fake.publish(0, batch(vec![store(1, None, 0)], 0), true);
    fake.publish(1, batch(vec![store(2, Some(1), 4)], 0), false);
    fake.publish(2, batch(vec![store(3, Some(2), 8)], 0), false);
    fake.publish(3, batch(vec![store(4, Some(3), 12)], 0), true);
    fake.serve_replay(false);
    assert!(stats.wait_for_seq(3, WAIT));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 4, "replayed blocks 2, 3 before live 4");
    fake.publish(4, batch(vec![store(5, Some(4), 16)], 0), false);
    fake.publish(5, batch(vec![store(6, Some(5), 20)], 0), true);
    fake.serve_replay(true);
    assert!(stats.wait_for_seq(5, WAIT));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 6);
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!((n(&stats.gaps), n(&stats.gaps_recovered), n(&stats.replays)), (2, 2, 2));
    assert_eq!((n(&stats.replayed_batches), n(&stats.replay_failures)), (3, 0));
    assert_eq!(stats.rejected(RejectKind::UnknownParent), 0);
}

#[test]
fn unanswered_or_absent_replay_counts_the_gap_and_carries_on() {
    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    // The ROUTER exists but nobody answers: the replay times out.
    let (_h, stats) = fake.start(&index, true, Duration::from_millis(200));
    fake.publish(0, batch(vec![store(1, None, 0)], 0), true);
    fake.publish(5, batch(vec![store(9, None, 100)], 0), true);
    assert!(stats.wait_for_seq(5, WAIT));
    assert_eq!(stats.replay_failures.load(Ordering::Relaxed), 1);
    assert_eq!(stats.gaps_recovered.load(Ordering::Relaxed), 0);
    assert_eq!(index.engine_blocks(EngineSlot(3)), 2);

    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    let (_h, stats) = fake.start(&index, false, WAIT);
    fake.publish(7, batch(vec![store(1, None, 0)], 0), true);
    fake.publish(9, batch(vec![store(2, Some(1), 4)], 0), true);
    assert!(stats.wait_for_seq(9, WAIT));
    assert_eq!((stats.gaps.load(Ordering::Relaxed), stats.replays.load(Ordering::Relaxed)), (1, 0));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 2);
}

/// An engine that stored blocks before we subscribed and has been quiet since: about a second
/// after joining, its replay buffer is read, so the blocks are indexed without a live batch;
/// live batches the replay already brought are then duplicates, not a restart.
#[test]
fn a_quiet_stream_is_caught_up_after_joining() {
    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    fake.publish(0, batch(vec![store(1, None, 0)], 0), false);
    fake.publish(1, batch(vec![store(2, Some(1), 4)], 0), false);
    let (_h, stats) = fake.start(&index, true, WAIT);
    fake.serve_replay(false);
    assert!(stats.wait_for_seq(1, WAIT), "caught up without any live batch");
    assert_eq!(index.engine_blocks(EngineSlot(3)), 2);
    fake.publish(1, batch(vec![store(2, Some(1), 4)], 0), true);
    fake.publish(2, batch(vec![store(3, Some(2), 8)], 0), true);
    assert!(stats.wait_for_seq(2, WAIT));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 3);
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!((n(&stats.duplicates), n(&stats.resets), n(&stats.gaps), n(&stats.replayed_batches)), (1, 0, 0, 2));
}

#[test]
fn a_sequence_reset_drops_the_engine_first() {
    let index = Arc::new(MemoryIndex::new());
    let mut fake = FakeEngine::new();
    let (_h, stats) = fake.start(&index, false, WAIT);
    fake.publish(5, batch(vec![store(1, None, 0), store(2, Some(1), 4)], 0), true);
    fake.publish(0, batch(vec![store(3, None, 50)], 0), true);
    assert!(stats.wait_until(WAIT, |s| s.resets.load(Ordering::Relaxed) == 1 && s.batches.load(Ordering::Relaxed) == 2));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 1);
    assert_eq!(stats.last_seq(), Some(0));
    fake.publish(1, batch(vec![Value::Map(vec![("type".into(), "AllBlocksCleared".into())])], 0), true);
    assert!(stats.wait_for_seq(1, WAIT));
    assert_eq!(index.engine_blocks(EngineSlot(3)), 0);
    assert_eq!(stats.events(EventKind::AllBlocksCleared), 1);
}

#[test]
fn wildcard_bind_addresses_mean_this_host() {
    assert_eq!(connect_endpoint("tcp://*:5557"), "tcp://127.0.0.1:5557");
    assert_eq!(connect_endpoint("tcp://[::]:5557"), "tcp://[::1]:5557");
    assert_eq!(connect_endpoint("tcp://10.0.0.2:5557"), "tcp://10.0.0.2:5557");
    assert_eq!(connect_endpoint("ipc:///tmp/kv"), "ipc:///tmp/kv");
}

#[test]
fn a_bad_endpoint_is_counted_and_stop_still_works() {
    let stats = Arc::new(IngestStats::new());
    let cfg = IngestConfig { endpoint: "nonsense://x".into(), ..IngestConfig::default() };
    let h = spawn_ingest(cfg, Arc::new(MemoryIndex::new()), Arc::clone(&stats));
    assert!(stats.wait_until(WAIT, |s| s.socket_errors.load(Ordering::Relaxed) >= 1));
    h.stop();
    assert!(stats.socket_errors.load(Ordering::Relaxed) >= 1);
}
