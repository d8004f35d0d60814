//! Cost of what the filter does per request, natively: parse a body, cut block keys,
//! encode the pick. `cargo run -p kvroute-core --release --example parse_bench`
use kvroute_core::keys::{token_block_keys, KeyRoot};
use kvroute_core::request::{parse, Api, Prompt};
use std::time::Instant;

fn main() {
    for n in [1024usize, 8192, 32768] {
        let ids: Vec<String> = (0..n).map(|i| ((i * 7919) % 150_000).to_string()).collect();
        let body = format!(r#"{{"model":"m","prompt":[{}],"max_tokens":16,"stream":true}}"#, ids.join(","));
        let reps = 2000 * 1024 / n;
        let mut parse_ns = Vec::with_capacity(reps);
        let mut keys_ns = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            let req = parse(Api::Completions, body.as_bytes()).expect("valid body");
            parse_ns.push(t.elapsed().as_nanos());
            let Prompt::Tokens(tokens) = &req.prompt else { panic!("token prompt") };
            let t = Instant::now();
            let keys = token_block_keys(&KeyRoot::new(&req.model, &req.cache_salt), tokens, 16);
            keys_ns.push(t.elapsed().as_nanos());
            std::hint::black_box(keys);
        }
        parse_ns.sort();
        keys_ns.sort();
        println!("{n:>6} tokens ({:>6} B body): parse p50 {:>7.1} us, keys p50 {:>6.1} us",
            body.len(), parse_ns[reps / 2] as f64 / 1e3, keys_ns[reps / 2] as f64 / 1e3);
    }
}
