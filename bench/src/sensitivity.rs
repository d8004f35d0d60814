//! The sensitivity classifier measured: precision and recall per kind of finding on a
//! labelled corpus (bench/sensitivity/corpus.py writes one), and its cost per prompt size.
//!
//! Scoring is per prompt and kind: a prompt planted with a kind and found to hold it is a true
//! positive; found without being planted, a false positive; planted and missed, a false negative.

use anyhow::{Context, Result};
use kvroute_core::sensitive::{scan, Kind};
use serde::Deserialize;
use std::fmt::Write as _;
use std::time::Instant;

#[derive(Deserialize)]
pub struct Labelled {
    pub text: String,
    pub kinds: Vec<String>,
}

/// Reads a corpus of JSON lines.
pub fn read_corpus(jsonl: &str) -> Result<Vec<Labelled>> {
    jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("corpus line {}", i + 1)))
        .collect()
}

/// One kind's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    pub planted: u32,
    pub true_pos: u32,
    pub false_pos: u32,
    pub false_neg: u32,
}

impl Score {
    pub fn precision(&self) -> f64 {
        ratio(self.true_pos, self.true_pos + self.false_pos)
    }
    pub fn recall(&self) -> f64 {
        ratio(self.true_pos, self.true_pos + self.false_neg)
    }
}

fn ratio(a: u32, b: u32) -> f64 {
    if b == 0 { 1.0 } else { f64::from(a) / f64::from(b) }
}

/// Per kind, in [`Kind::ALL`] order, and how many prompts were read. A label the classifier
/// does not know is an error (a corpus from another version).
pub fn score(corpus: &[Labelled]) -> Result<Vec<(Kind, Score)>> {
    let mut out: Vec<(Kind, Score)> = Kind::ALL.iter().map(|k| (*k, Score::default())).collect();
    for p in corpus {
        let planted: Vec<Kind> = p.kinds.iter().map(|l| Kind::from_label(l).with_context(|| format!("unknown kind {l:?}"))).collect::<Result<_>>()?;
        let found = scan(&p.text);
        for (kind, s) in out.iter_mut() {
            let (was, is) = (planted.contains(kind), found.has(*kind));
            s.planted += u32::from(was);
            s.true_pos += u32::from(was && is);
            s.false_pos += u32::from(!was && is);
            s.false_neg += u32::from(was && !is);
        }
    }
    Ok(out)
}

/// The prompts scored wrong for `kind` (missed, then falsely found), at most `n` of each: for
/// working on the classifier against a synthetic corpus, never on real prompts.
pub fn errors(corpus: &[Labelled], kind: Kind, n: usize) -> (Vec<&str>, Vec<&str>) {
    let (mut missed, mut false_pos) = (Vec::new(), Vec::new());
    for p in corpus {
        let (was, is) = (p.kinds.iter().any(|l| l == kind.label()), scan(&p.text).has(kind));
        match (was, is) {
            (true, false) if missed.len() < n => missed.push(p.text.as_str()),
            (false, true) if false_pos.len() < n => false_pos.push(p.text.as_str()),
            _ => {}
        }
    }
    (missed, false_pos)
}

/// Precision and recall per kind, and over all kinds, as a Markdown table.
pub fn table(scores: &[(Kind, Score)], prompts: usize) -> String {
    let mut t = format!("{prompts} prompts\n\n| kind | planted | precision | recall | false pos | false neg |\n|---|---|---|---|---|---|\n");
    let mut all = Score::default();
    for (kind, s) in scores {
        let _ = writeln!(t, "| {} | {} | {:.4} | {:.4} | {} | {} |", kind.label(), s.planted, s.precision(), s.recall(), s.false_pos, s.false_neg);
        all.planted += s.planted;
        all.true_pos += s.true_pos;
        all.false_pos += s.false_pos;
        all.false_neg += s.false_neg;
    }
    let _ = writeln!(t, "| all | {} | {:.4} | {:.4} | {} | {} |", all.planted, all.precision(), all.recall(), all.false_pos, all.false_neg);
    t
}

/// The scan's time per prompt of about `tokens` tokens (4 bytes a token, the corpus's text
/// concatenated): median of `rounds` timed runs, and per KiB.
pub fn cost(corpus: &[Labelled], sizes: &[usize], rounds: usize) -> String {
    let text: String = corpus.iter().map(|p| p.text.as_str()).collect::<Vec<_>>().join("\n\n");
    let mut t = String::from("| prompt | bytes | scan p50 | per KiB |\n|---|---|---|---|\n");
    for tokens in sizes {
        let mut end = (tokens * 4).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let prompt = &text[..end];
        let mut times: Vec<f64> = (0..rounds.max(1))
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(scan(std::hint::black_box(prompt)));
                t0.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        let _ = writeln!(t, "| {}k tokens | {} | {:.1} µs | {:.2} µs |", tokens / 1000, prompt.len(), p50, p50 / (prompt.len() as f64 / 1024.0));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_count_per_prompt_and_kind() {
        let corpus = read_corpus(
            r#"{"text": "mail a@example.com", "kinds": ["email"]}
{"text": "nothing here", "kinds": ["card"]}
{"text": "4111111111111111", "kinds": []}
"#,
        )
        .unwrap();
        let s = score(&corpus).unwrap();
        let get = |k| s.iter().find(|(x, _)| *x == k).unwrap().1;
        assert_eq!(get(Kind::Email), Score { planted: 1, true_pos: 1, false_pos: 0, false_neg: 0 });
        assert_eq!(get(Kind::Card), Score { planted: 1, true_pos: 0, false_pos: 1, false_neg: 1 });
        assert_eq!(get(Kind::Card).precision(), 0.0);
        assert!(table(&s, 3).contains("| all | 2 | 0.5000 | 0.5000 | 1 | 1 |"));
        assert!(score(&read_corpus(r#"{"text": "x", "kinds": ["tattoo"]}"#).unwrap()).is_err());
    }
}
