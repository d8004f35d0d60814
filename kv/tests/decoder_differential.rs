//! The KV-event decoder against its previous version (`decoder_reference/`, kept verbatim):
//! the same batches, events, rejections (each error's kind and offset) and ranks, or the same
//! error, on the fuzz seeds, the local fuzz corpus when there is one (`fuzz/corpus/kv_events`,
//! not in git), and generated payloads that mix every integer form in token and hash lists
//! (fixint, uint 8-64, int 8-64, floats, nil, strings, bins), valid and invalid names,
//! positional events, truncations and flipped bytes. Each payload is also decoded into one
//! reused batch, as the ingest worker does (`decode_batch_into` keeps the previous batch's
//! lists).

#[path = "decoder_reference/mod.rs"]
mod reference;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use kvroute_kv::vllm::{decode_batch, decode_batch_into, DecodeError, EventBatch};
use std::path::Path;

/// Seeded, so a failure reproduces.
struct Rng(StdRng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// A msgpack writer that picks among the encodings a value has.
/// The flag: this event may hold values its fields reject.
struct W<'r>(Vec<u8>, &'r mut Rng, bool);
impl W<'_> {
    fn header(&mut self, n: usize, fix: u8, fix_max: usize, m16: u8) {
        if n <= fix_max && !self.1.one_in(8) {
            self.0.push(fix | n as u8);
        } else if n < 1 << 16 && !self.1.one_in(8) {
            self.0.push(m16);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(m16 + 1);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    fn arr(&mut self, n: usize) {
        self.header(n, 0x90, 15, 0xdc);
    }
    fn map(&mut self, n: usize) {
        self.header(n, 0x80, 15, 0xde);
    }
    fn bytes_str(&mut self, s: &[u8]) {
        match self.1.below(4) {
            0 if s.len() < 256 => self.0.extend_from_slice(&[0xd9, s.len() as u8]),
            1 => {
                self.0.push(0xda);
                self.0.extend_from_slice(&(s.len() as u16).to_be_bytes());
            }
            _ if s.len() < 32 => self.0.push(0xa0 | s.len() as u8),
            _ => {
                self.0.push(0xdb);
                self.0.extend_from_slice(&(s.len() as u32).to_be_bytes());
            }
        }
        self.0.extend_from_slice(s);
    }
    fn str(&mut self, s: &str) {
        self.bytes_str(s.as_bytes());
    }
    /// `v` in any form that holds it (unsigned or, when it fits, signed).
    fn uint(&mut self, v: u64) {
        let mut forms: Vec<u8> = vec![0xcf];
        if v < 0x80 {
            forms.push(0x00);
        }
        for (m, max) in [(0xcc, 0xff), (0xcd, 0xffff), (0xce, 0xffff_ffff)] {
            if v <= max {
                forms.push(m);
            }
        }
        for (m, max) in [(0xd0, 0x7f), (0xd1, 0x7fff), (0xd2, 0x7fff_ffff), (0xd3, i64::MAX as u64)] {
            if v <= max {
                forms.push(m);
            }
        }
        let m = forms[self.1.below(forms.len() as u64) as usize];
        let width = match m {
            0x00 => return self.0.push(v as u8),
            0xcc | 0xd0 => 1,
            0xcd | 0xd1 => 2,
            0xce | 0xd2 => 4,
            _ => 8,
        };
        self.0.push(m);
        self.0.extend_from_slice(&v.to_be_bytes()[8 - width..]);
    }
    fn neg(&mut self, v: i64) {
        if v >= -32 && self.1.one_in(2) {
            return self.0.push(v as i8 as u8);
        }
        self.0.push(0xd3);
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    /// Mostly a plausible scalar, sometimes something no field accepts.
    fn odd(&mut self) {
        match self.1.below(6) {
            0 => self.0.push(0xc0),
            1 => self.0.extend_from_slice(&[0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]),
            2 => self.0.extend_from_slice(&[0xca, 0x3f, 0x80, 0, 0]),
            3 => self.str("x"),
            4 => self.0.extend_from_slice(&[0xc4, 2, 1, 2]),
            _ => self.0.push(0xc3),
        }
    }
    fn token(&mut self) {
        match if self.2 { self.1.below(40) } else { 40 } {
            0 => {
                let v = u64::from(u32::MAX) + 1 + self.1.below(1 << 40);
                self.uint(v)
            }
            1 => {
                let v = -(self.1.below(1000) as i64) - 1;
                self.neg(v)
            }
            2 => self.odd(),
            3 => self.uint(u64::from(u32::MAX)),
            _ => {
                let v = self.1.below(160_000);
                self.uint(v)
            }
        }
    }
    fn hash(&mut self) {
        match self.1.below(if self.2 { 12 } else { 3 }) {
            0 => {
                let v = self.1.below(200);
                self.uint(v)
            }
            1 => {
                let v = (self.1.next() | (1 << 63)) as i64;
                self.neg(v)
            }
            2 => {
                let n = [3usize, 8, 32][self.1.below(3) as usize];
                let b: Vec<u8> = (0..n).map(|_| self.1.next() as u8).collect();
                self.0.extend_from_slice(&[0xc4, n as u8]);
                self.0.extend_from_slice(&b);
            }
            3 => self.odd(),
            _ => {
                let v = self.1.next();
                self.0.push(0xcf);
                self.0.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    fn list(&mut self, n: usize, each: fn(&mut Self)) {
        self.arr(n);
        for _ in 0..n {
            each(self);
        }
    }
    fn medium(&mut self) {
        match if self.2 { self.1.below(8) } else { 5 + self.1.below(3) } {
            0 => self.0.push(0xc0),
            1 => self.str("cpu"),
            2 => self.str("STORAGE"),
            3 => self.str("DISK"),
            4 => self.bytes_str(&[0xff, 0xfe]),
            _ => self.str("GPU"),
        }
    }
    fn type_name(&mut self) -> usize {
        let k = if self.2 { self.1.below(20) } else { 2 + self.1.below(18) } as usize;
        match k {
            0 => self.str("BlockMoved"),
            1 => self.bytes_str(&[b'B', 0xc3, 0x28]),
            2 => self.str("AllBlocksCleared"),
            3..=6 => self.str("BlockRemoved"),
            _ => self.str("BlockStored"),
        }
        k
    }
    fn map_event(&mut self) {
        self.2 = self.1.one_in(3);
        let blocks = self.1.below(5) as usize;
        let bs = [1u64, 2, 16][self.1.below(3) as usize];
        let mut fields: Vec<u8> = (0..13).filter(|&f| if self.2 { !self.1.one_in(7) } else { f != 11 }).collect();
        for i in (1..fields.len()).rev() {
            let j = self.1.below(i as u64 + 1) as usize;
            fields.swap(i, j);
        }
        self.map(fields.len());
        for f in fields {
            match f {
                0 => {
                    self.str("type");
                    self.type_name();
                }
                1 => {
                    self.str("block_hashes");
                    self.list(blocks, W::hash);
                }
                2 => {
                    self.str("parent_block_hash");
                    if self.1.one_in(2) { self.0.push(0xc0) } else { self.hash() }
                }
                3 => {
                    self.str("token_ids");
                    let n = blocks * bs as usize + usize::from(self.1.one_in(6));
                    self.list(n, W::token);
                }
                4 => {
                    self.str("block_size");
                    if self.2 && self.1.one_in(10) { self.neg(-1) } else { self.uint(bs) }
                }
                5 => {
                    self.str("lora_id");
                    self.0.push(0xc0);
                }
                6 => {
                    self.str("medium");
                    self.medium();
                }
                7 => {
                    self.str("lora_name");
                    if self.1.one_in(2) { self.0.push(0xc0) } else { self.str("ad") }
                }
                8 => {
                    self.str("extra_keys");
                    self.arr(2);
                    self.arr(3);
                    self.str("ad");
                    self.str("salt");
                    self.list(2, W::token);
                    self.0.push(0xc0);
                }
                9 => {
                    self.str("group_idx");
                    self.uint(0);
                }
                10 => {
                    self.str("kv_cache_spec_kind");
                    self.str("full_attention");
                }
                11 => {
                    self.bytes_str(&[0xa1, 0xff, b'k']);
                    self.uint(1);
                }
                _ => {
                    self.str("zzz");
                    self.list(2, W::token);
                }
            }
        }
    }
    fn positional_event(&mut self) {
        self.2 = self.1.one_in(3);
        let blocks = self.1.below(4) as usize;
        let n = 1 + self.1.below(10) as usize;
        self.arr(n);
        let kind = self.type_name();
        for i in 1..n {
            match (kind, i) {
                (_, 1) => self.list(blocks, W::hash),
                (_, 3) => self.list(blocks * 2, W::token),
                (_, 4) => self.uint(2),
                (_, 6) => self.medium(),
                _ => self.odd(),
            }
        }
    }
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    let mut w = W(Vec::new(), rng, false);
    let len = 2 + w.1.below(3) as usize;
    w.arr(len);
    if w.1.one_in(4) { w.uint(7) } else { w.0.extend_from_slice(&[0xcb, 0x41, 0xd9, 0, 0, 0, 0, 0, 0]) }
    let events = w.1.below(5) as usize;
    w.arr(events);
    for _ in 0..events {
        if w.1.one_in(5) { w.positional_event() } else { w.map_event() }
    }
    for _ in 2..len {
        if w.1.one_in(3) { w.neg(-2) } else { w.uint(1) }
    }
    let mut p = w.0;
    match rng.below(6) {
        0 if !p.is_empty() => p.truncate(rng.below(p.len() as u64) as usize),
        1 if !p.is_empty() => {
            let at = rng.below(p.len() as u64) as usize;
            p[at] ^= 1 << rng.below(8);
        }
        _ => {}
    }
    p
}

fn same(label: &str, p: &[u8], reused: &mut EventBatch) {
    let want = reference::decode_batch(p);
    let got = decode_batch(p);
    let into = decode_batch_into(p, reused);
    let view = |r: &Result<EventBatch, DecodeError>| {
        r.as_ref().map(|b| (b.ts.to_bits(), b.events.clone(), b.rejected.clone(), b.data_parallel_rank)).map_err(Clone::clone)
    };
    assert_eq!(view(&got), view(&want), "{label}: {p:02x?}");
    let into = into.map(|()| (reused.ts.to_bits(), reused.events.clone(), reused.rejected.clone(), reused.data_parallel_rank));
    assert_eq!(into, view(&want), "{label} (reused batch): {p:02x?}");
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<_> =
        entries.flatten().filter_map(|e| Some((e.path().display().to_string(), std::fs::read(e.path()).ok()?))).collect();
    out.sort();
    out
}

#[test]
fn agrees_with_the_previous_decoder_on_fuzz_seeds_and_corpus() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = files(&fuzz.join("seeds/kv_events"));
    assert!(!seeds.is_empty(), "fuzz/seeds/kv_events is in git");
    let corpus = files(&fuzz.join("corpus/kv_events"));
    let mut reused = EventBatch::default();
    for (name, p) in seeds.iter().chain(&corpus) {
        same(name, p, &mut reused);
    }
    println!("{} seeds and {} corpus files agree", seeds.len(), corpus.len());
}

#[test]
fn agrees_with_the_previous_decoder_on_generated_payloads() {
    let mut rng = Rng::new(18);
    let mut reused = EventBatch::default();
    let (mut ok, mut events, mut rejected) = (0, 0, 0);
    for i in 0..30_000 {
        let p = payload(&mut rng);
        same(&format!("payload {i}"), &p, &mut reused);
        if let Ok(b) = reference::decode_batch(&p) {
            ok += 1;
            events += b.events.len();
            rejected += b.rejected.len();
        }
    }
    // The generator must reach both sides: decoded events and rejected ones.
    println!("{ok} batches decoded, {events} events, {rejected} rejected");
    assert!(ok > 10_000 && events > 10_000 && rejected > 5_000, "{ok} batches, {events} events, {rejected} rejected");
}
