//! Scrape-time metrics of the local tokenizers: whether each model's tokenizer is loaded,
//! load failures, and each piece cache's hits, misses and size.

use super::local::LocalTokenizers;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::Arc;

pub struct TokenizerCollector {
    pub local: Arc<LocalTokenizers>,
}

impl fmt::Debug for TokenizerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenizerCollector")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

fn family(enc: &mut DescriptorEncoder, name: &str, help: &str, kind: MetricType, values: &[(ModelLabel, u64)]) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in values {
        let target = m.encode_family(labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(*v).encode(target)?,
            _ => ConstGauge::new(*v as i64).encode(target)?,
        }
    }
    Ok(())
}

impl Collector for TokenizerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let statuses = self.local.statuses(Vec::new());
        let loaded: Vec<_> = statuses.iter().map(|(m, s)| (ModelLabel { model: m.clone() }, u64::from(s.status == "loaded"))).collect();
        family(&mut enc, "tokenizer_loaded", "1 when the model's local tokenizer is loaded", MetricType::Gauge, &loaded)?;
        let failures = enc.encode_descriptor("tokenizer_load_failures", "Tokenizer directories that failed to load", None, MetricType::Counter)?;
        ConstCounter::new(self.local.load_failures()).encode(failures)?;
        let caches: Vec<_> = statuses.iter().filter_map(|(m, s)| s.cache.map(|c| (ModelLabel { model: m.clone() }, c))).collect();
        let each = |f: fn(&kvroute_tokenize::CacheStats) -> u64| -> Vec<(ModelLabel, u64)> { caches.iter().map(|(l, c)| (l.clone(), f(c))).collect() };
        family(&mut enc, "tokenizer_cache_hits", "Prompt pieces found in the tokenizer cache", MetricType::Counter, &each(|c| c.hits))?;
        family(&mut enc, "tokenizer_cache_misses", "Prompt pieces encoded (not in the cache)", MetricType::Counter, &each(|c| c.misses))?;
        family(&mut enc, "tokenizer_cache_hit_bytes", "Prompt bytes served from the tokenizer cache", MetricType::Counter, &each(|c| c.hit_bytes))?;
        family(&mut enc, "tokenizer_cache_miss_bytes", "Prompt bytes encoded", MetricType::Counter, &each(|c| c.miss_bytes))?;
        family(&mut enc, "tokenizer_cache_bytes", "Bytes held by the tokenizer cache", MetricType::Gauge, &each(|c| c.bytes))?;
        family(&mut enc, "tokenizer_cache_entries", "Pieces held by the tokenizer cache", MetricType::Gauge, &each(|c| c.entries))
    }
}
