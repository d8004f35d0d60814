//! Cold encode of plain text (no special tokens: one piece), the case the piece cache cannot
//! help: `tokenizers` directly vs kvroute-tokenize's `encode_text`.
//!
//! KVROUTE_TOKENIZER_DIR=<dir> cargo run -p kvroute-tokenize --release --example plain_text_bench
//!
//! It runs on mimalloc, as `kvroute-state` does; the glibc figures quoted in the docs were
//! measured with the `#[global_allocator]` lines below removed.

use kvroute_tokenize::ModelTokenizer;
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WORDS: &[&str] = &["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or"];

fn main() -> anyhow::Result<()> {
    let dir = std::path::PathBuf::from(std::env::var("KVROUTE_TOKENIZER_DIR")?);
    let tok = ModelTokenizer::from_dir(&dir)?;
    let raw = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| anyhow::anyhow!("{e}"))?;
    for n in [1024usize, 8192, 32768] {
        let mut times = (Vec::new(), Vec::new());
        for round in 0..10 {
            let text: String = (0..n).map(|i| WORDS[(i * 7 + round * 13 + i / 3) % WORDS.len()]).collect::<Vec<_>>().join(" ") + &format!(" {round}");
            let t = Instant::now();
            let a = raw.encode_fast(text.as_str(), false).map_err(|e| anyhow::anyhow!("{e}"))?.get_ids().len();
            times.0.push(t.elapsed().as_secs_f64() * 1e3);
            let text = text + " x";
            let t = Instant::now();
            let b = tok.encode_text(&text)?.len();
            times.1.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(b >= a, "{a} {b}");
        }
        times.0.sort_by(f64::total_cmp);
        times.1.sort_by(f64::total_cmp);
        println!("{n} words: tokenizers encode_fast median {:.2} ms, encode_text median {:.2} ms", times.0[5], times.1[5]);
    }
    Ok(())
}
