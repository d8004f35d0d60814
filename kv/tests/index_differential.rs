//! Every index implementation equals the reference model on random vLLM-like event streams.
//!
//! `KVROUTE_DIFF_SEEDS=n` runs more seeds (default 100). A failure prints the seed and batch;
//! `differential::check_seed` replays exactly that stream.

use kvroute_kv::index::memory::MemoryIndex;
use kvroute_kv::index::reference::differential::check;
use kvroute_kv::index::KvIndex;

fn seeds() -> u64 {
    std::env::var("KVROUTE_DIFF_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(100)
}

#[test]
fn memory_index_equals_reference() {
    let make = || Box::new(MemoryIndex::new()) as Box<dyn KvIndex>;
    let cov = check(&make, 0..seeds(), 120).unwrap_or_else(|e| panic!("{e}"));
    // The streams must reach the interesting cases, or the comparison proves little.
    let t = cov.totals;
    assert!(t.blocks_stored > 1000 && t.blocks_removed > 300 && t.clears > 10, "{cov:?}");
    assert!(t.rejected_unknown_parent > 10 && t.rejected_unknown_hash > 10 && t.rejected_bad_block > 10, "{cov:?}");
    assert!(cov.clear_engine_calls > 10 && cov.nonempty_matches > 1000, "{cov:?}");
    assert!(cov.max_matched >= 4 && cov.max_engines >= 3, "{cov:?}");
    assert!(cov.split_matches > 100, "offloaded-only blocks inside matches: {cov:?}");
    eprintln!("{cov:?}");
}
