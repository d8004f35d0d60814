//! Index benchmark: prefix-lookup latency, ingestion throughput, memory per (block, engine).
//!
//! `cargo run -p kvroute-kv --release --example index_bench [ENGINES BLOCKS_PER_ENGINE]`
//!
//! Fleet (default 64 engines x 50,000 blocks, block size 16): every engine holds one
//! 512-block shared prefix (a long system prompt: the lookup worst case, every key held by
//! every engine) and the rest as 48-block conversation tails of its own (the memory worst
//! case: one engine per key). `index_bench 1000 20000` loads the 1,000-engine fleet.
//! Figures are a report, not a test; they vary with the machine.
//!
//! `KVROUTE_BENCH_THREADS=1,2,4` sets the thread counts of the parallel-ingestion rows
//! (default 1,2); `KVROUTE_BENCH_ONLY=lookup,ingest,parallel` runs only those sections after
//! loading the fleet. Lookup rows print the minimum too: on a shared machine the p99 is
//! mostly other processes' time slices, the minimum is the lookup's own cost.

use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_kv::vllm::{decode_batch_into, EventBatch};
use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::KvIndex;
use kvroute_kv::types::{BlockKey, EngineHash, EngineSlot, KvEvent, Tier};
use rmpv::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Counts live heap bytes, so the index's footprint is measured, not estimated. Only while
/// the fleet loads: one counter shared by every thread would serialise the parallel rows.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(true);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(l.size(), Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_sub(l.size(), Relaxed);
        }
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(new, Relaxed);
            LIVE.fetch_sub(l.size(), Relaxed);
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BS: usize = 16;
const SHARED: usize = 512;
const TAIL: usize = 48;
const MODEL: &str = "bench-model";

/// Deterministic pseudo-random tokens, so runs are comparable: SplitMix64 (the generator the
/// pick uses, `kvroute_score::PickRng`, written out here so the index crate needs no scorer).
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        let mut rng = Rng(seed);
        rng.next();
        rng
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next() % 150_000) as u32).collect()
    }
}

fn stored(hashes: Vec<EngineHash>, parent: Option<EngineHash>, token_ids: Vec<u32>) -> KvEvent {
    KvEvent::Stored { hashes, parent, token_ids, block_size: BS as u32, lora_name: None, cache_salt: None, tier: Tier::Gpu }
}

/// One engine's load: the shared prefix, then its own tails, as vLLM would report them.
fn engine_batches(engine: u32, blocks: usize, shared: &[u32], rng: &mut Rng) -> Vec<KvEvent> {
    let mut h = u64::from(engine) << 40;
    let mut next_hash = || {
        h += 1;
        EngineHash(h.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    };
    let hashes: Vec<_> = (0..SHARED).map(|_| next_hash()).collect();
    let mut out = vec![stored(hashes, None, shared.to_vec())];
    let mut left = blocks - SHARED;
    while left > 0 {
        let n = left.min(TAIL);
        let hashes: Vec<_> = (0..n).map(|_| next_hash()).collect();
        out.push(stored(hashes, None, rng.tokens(n * BS)));
        left -= n;
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn bench_lookup(index: &MemoryIndex, label: &str, keys: &[BlockKey], iters: usize) {
    let mut lat = Vec::with_capacity(iters);
    let mut sink = 0usize;
    let start = Instant::now();
    for _ in 0..iters {
        let t = Instant::now();
        sink += index.match_prefix(keys).len();
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort_unstable();
    println!(
        "  {label:<46} min {:>6.2} us  p50 {:>7.2} us  p99 {:>7.2} us  {:>9.0} matches/s  ({} engines)",
        lat[0].as_secs_f64() * 1e6,
        percentile(&lat, 0.50).as_secs_f64() * 1e6,
        percentile(&lat, 0.99).as_secs_f64() * 1e6,
        iters as f64 / total.as_secs_f64(),
        sink / iters,
    );
}

/// Encoded batches of one BlockStored event with `per_event` chained blocks each. `stream`
/// makes the engine hashes distinct between streams.
fn encoded_batches(total_blocks: usize, per_event: usize, stream: u64, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut parent: Option<u64> = None;
    let mut h = 0xabcd_0000_0000_0000u64 ^ (stream << 40);
    for _ in 0..total_blocks / per_event {
        let hashes: Vec<u64> = (0..per_event)
            .map(|_| {
                h += 1;
                h | (1 << 63)
            })
            .collect();
        let ev = Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            ("block_hashes".into(), Value::Array(hashes.iter().map(|&x| Value::from(x)).collect())),
            ("parent_block_hash".into(), parent.map_or(Value::Nil, Value::from)),
            ("token_ids".into(), Value::Array(rng.tokens(per_event * BS).into_iter().map(Value::from).collect())),
            ("block_size".into(), Value::from(BS as u32)),
            ("lora_id".into(), Value::Nil),
            ("medium".into(), "GPU".into()),
            ("lora_name".into(), Value::Nil),
            ("group_idx".into(), Value::from(0)),
        ]);
        parent = hashes.last().copied();
        let batch = Value::Array(vec![Value::F64(1.7e9), Value::Array(vec![ev]), Value::from(0)]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &batch).expect("encode");
        out.push(buf);
    }
    out
}

const INGEST_BLOCKS: usize = 256_000;

/// Blocks per second of wall time and per second of this thread's CPU time (see
/// [`thread_times`]), for a row.
fn rates(blocks: usize, start: Instant, cpu0: u64) -> String {
    let (wall, cpu) = (start.elapsed().as_secs_f64(), (thread_times().0 - cpu0) as f64 / 1e9);
    let per_cpu = if cpu > 0.0 { format!(", {:>9.0} per CPU-second", blocks as f64 / cpu) } else { String::new() };
    format!("{:>9.0} blocks/s{per_cpu}", blocks as f64 / wall)
}

fn bench_ingest(index: &MemoryIndex, engine: u32, per_event: usize, rng: &mut Rng) {
    let payloads = encoded_batches(INGEST_BLOCKS, per_event, u64::from(engine), rng);
    let blocks = payloads.len() * per_event;
    let mut batch = EventBatch::default();
    let (start, cpu0) = (Instant::now(), thread_times().0);
    for p in &payloads {
        decode_batch_into(p, &mut batch).expect("decode");
        index.apply(EngineSlot(engine), MODEL, BS as u32, &batch.events);
    }
    println!("  {per_event:>3} blocks/event: {}  ({blocks} blocks, decode + apply, one thread)", rates(blocks, start, cpu0));
}

/// The 16-blocks/event row split: decoding alone, and applying already decoded batches.
fn bench_ingest_parts(index: &MemoryIndex, engine: u32, rng: &mut Rng) {
    let payloads = encoded_batches(INGEST_BLOCKS, 16, u64::from(engine), rng);
    let blocks = payloads.len() * 16;
    let mut batch = EventBatch::default();
    let (start, cpu0) = (Instant::now(), thread_times().0);
    for p in &payloads {
        decode_batch_into(p, &mut batch).expect("decode");
        std::hint::black_box(&batch);
    }
    println!("   16 blocks/event, decode alone: {}", rates(blocks, start, cpu0));
    let decoded: Vec<Vec<KvEvent>> = payloads
        .iter()
        .map(|p| {
            decode_batch_into(p, &mut batch).expect("decode");
            batch.events.clone()
        })
        .collect();
    let (start, cpu0) = (Instant::now(), thread_times().0);
    for events in &decoded {
        index.apply(EngineSlot(engine), MODEL, BS as u32, events);
    }
    println!("   16 blocks/event, apply alone:  {}", rates(blocks, start, cpu0));
}

/// This thread's time on a CPU and waiting for one, in ns (Linux's schedstat; zeros
/// elsewhere). On a shared machine wall-clock rates say little about scaling: blocks per
/// second of CPU time do (a lock serialising the threads would show as spinning or sleeping,
/// so fewer blocks per CPU-second, or as wall time beyond CPU time plus run-queue waits).
fn thread_times() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut f = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}

/// `threads` threads, each decoding and applying its own engines' batches (16 blocks per
/// event) into the loaded fleet at the same time; aggregate blocks/s.
fn bench_parallel_ingest(index: &Arc<MemoryIndex>, first_engine: u32, threads: usize, rng: &mut Rng) {
    const ENGINES_PER_THREAD: usize = 4;
    let per_engine = INGEST_BLOCKS / ENGINES_PER_THREAD;
    let work: Vec<Vec<(u32, Vec<Vec<u8>>)>> = (0..threads)
        .map(|t| {
            (0..ENGINES_PER_THREAD)
                .map(|i| {
                    let e = first_engine + (t * ENGINES_PER_THREAD + i) as u32;
                    (e, encoded_batches(per_engine, 16, u64::from(e), rng))
                })
                .collect()
        })
        .collect();
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = work
        .into_iter()
        .map(|engines| {
            let (index, barrier) = (Arc::clone(index), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut batch = EventBatch::default();
                barrier.wait();
                let (cpu0, wait0) = thread_times();
                // Round-robin over this thread's engines, one batch each, as a feed would.
                let n = engines[0].1.len();
                for i in 0..n {
                    for (e, payloads) in &engines {
                        decode_batch_into(&payloads[i], &mut batch).expect("decode");
                        index.apply(EngineSlot(*e), MODEL, BS as u32, &batch.events);
                    }
                }
                let (cpu1, wait1) = thread_times();
                (cpu1 - cpu0, wait1 - wait0)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let times: Vec<(u64, u64)> = handles.into_iter().map(|h| h.join().expect("ingest thread")).collect();
    let secs = start.elapsed().as_secs_f64();
    let blocks = threads * INGEST_BLOCKS;
    let cpu: u64 = times.iter().map(|t| t.0).sum();
    let wait: u64 = times.iter().map(|t| t.1).sum();
    print!(
        "  {threads} thread(s), {ENGINES_PER_THREAD} engines each, 16 blocks/event: {:>10.0} blocks/s wall in all",
        blocks as f64 / secs
    );
    if cpu > 0 {
        println!(
            ", {:>10.0} blocks per CPU-second (on CPU {:.0}% of the wall time per thread, waiting for a CPU {:.0}%)",
            blocks as f64 / (cpu as f64 / 1e9),
            cpu as f64 / 1e9 / secs / threads as f64 * 100.0,
            wait as f64 / 1e9 / secs / threads as f64 * 100.0
        );
    } else {
        println!();
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("ENGINES BLOCKS_PER_ENGINE")).collect();
    let engines = *args.first().unwrap_or(&64) as u32;
    let blocks_per_engine = (*args.get(1).unwrap_or(&50_000)).max(SHARED);
    let only = std::env::var("KVROUTE_BENCH_ONLY").unwrap_or_else(|_| "lookup,ingest,parallel".into());
    let run = |section: &str| only.split(',').any(|s| s.trim() == section);
    let threads: Vec<usize> = std::env::var("KVROUTE_BENCH_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);

    let mut rng = Rng::new(42);
    let shared = rng.tokens(SHARED * BS);
    let before = LIVE.load(Relaxed);
    let index = Arc::new(MemoryIndex::new());
    let mut load_secs = 0.0;
    for e in 0..engines {
        // Generated outside the clock and freed before the next engine: only the index stays.
        let batches = engine_batches(e, blocks_per_engine, &shared, &mut rng);
        let t = Instant::now();
        index.apply(EngineSlot(e), MODEL, BS as u32, &batches[..1]);
        for b in &batches[1..] {
            index.apply(EngineSlot(e), MODEL, BS as u32, std::slice::from_ref(b));
        }
        load_secs += t.elapsed().as_secs_f64();
    }
    let bytes = LIVE.load(Relaxed) - before;
    COUNTING.store(false, Relaxed);
    let pairs = engines as usize * blocks_per_engine;
    println!(
        "fleet: {engines} engines x {blocks_per_engine} blocks, block size {BS}, loaded in {load_secs:.1} s ({:.0} blocks/s, apply only, one thread)",
        pairs as f64 / load_secs
    );
    println!(
        "memory: {:.1} MiB for {pairs} (block, engine) pairs = {:.1} B/pair  ({} distinct keys)",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / pairs as f64,
        index.distinct_keys()
    );

    let root = KeyRoot::new(MODEL, "");
    let shared_keys = token_block_keys(&root, &shared, BS);
    let tail_engine_keys = {
        // A 32-block request continuing the shared prefix's first 8 blocks: nobody holds it past 8.
        let mut t = shared[..8 * BS].to_vec();
        t.extend(rng.tokens(24 * BS));
        token_block_keys(&root, &t, BS)
    };
    let all = format!("all {engines} engines hold all");
    if run("lookup") {
        bench_lookups(&index, engines, &all, &shared_keys, &tail_engine_keys);
    }
    if run("ingest") {
        println!("ingestion (msgpack batches -> decode -> apply, into the loaded fleet):");
        bench_ingest(&index, engines + 2, 1, &mut rng);
        bench_ingest(&index, engines + 3, 16, &mut rng);
        bench_ingest(&index, engines + 4, 64, &mut rng);
        bench_ingest_parts(&index, engines + 5, &mut rng);
    }
    if run("parallel") {
        println!("parallel ingestion (each thread its own engines):");
        let mut next = engines + 16;
        for &t in &threads {
            bench_parallel_ingest(&index, next, t, &mut rng);
            next += 64;
        }
    }
}

fn bench_lookups(index: &Arc<MemoryIndex>, engines: u32, all: &str, shared_keys: &[BlockKey], tail_engine_keys: &[BlockKey]) {
    println!("match_prefix:");
    bench_lookup(index, &format!("32 blocks, {all}"), &shared_keys[..32], 200_000);
    bench_lookup(index, &format!("512 blocks, {all} (worst)"), shared_keys, 20_000);
    bench_lookup(index, &format!("32 blocks, {engines} engines diverge after 8"), tail_engine_keys, 200_000);
    bench_lookup(index, "miss (first key unknown)", &[BlockKey(12345)], 200_000);

    // The same lookups while one thread ingests into another engine (2-core machine).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (index, stop) = (Arc::clone(index), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng::new(7);
            let payloads = encoded_batches(16_000, 16, 1, &mut rng);
            let mut batch = EventBatch::default();
            while !stop.load(Relaxed) {
                for p in &payloads {
                    if decode_batch_into(p, &mut batch).is_ok() {
                        index.apply(EngineSlot(engines + 1), MODEL, BS as u32, &batch.events);
                    }
                }
                index.clear_engine(EngineSlot(engines + 1));
            }
        })
    };
    println!("match_prefix with a concurrent writer thread:");
    bench_lookup(index, &format!("512 blocks, {all} (worst)"), shared_keys, 20_000);
    bench_lookup(index, &format!("32 blocks, {all}"), &shared_keys[..32], 100_000);
    stop.store(true, Relaxed);
    let _ = writer.join();
}
