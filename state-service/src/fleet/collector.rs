//! Scrape-time metrics of the fleet: per-worker load and health, per-engine index size and
//! KV-event feed counters. Read from the live state on every scrape.

use super::{Engine, FeedSnapshot, Fleet, WorkerEntry};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::Arc;

/// Registered once with the service's metrics; reads the fleet on every scrape.
pub struct FleetCollector(pub Arc<Fleet>);

impl fmt::Debug for FleetCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FleetCollector")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EngineLabel {
    worker: String,
    rank: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EngineKindLabel {
    worker: String,
    rank: u32,
    kind: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
    state: &'static str,
}

type Values<L> = Vec<(L, f64)>;

fn gauge<L: EncodeLabelSet>(enc: &mut DescriptorEncoder, name: &str, help: &str, values: &Values<L>) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in values {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn counter<L: EncodeLabelSet>(enc: &mut DescriptorEncoder, name: &str, help: &str, values: &[(L, u64)]) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in values {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl FleetCollector {
    fn encode_workers(&self, enc: &mut DescriptorEncoder, workers: &[Arc<WorkerEntry>]) -> fmt::Result {
        let assignments = self.0.assignments();
        let per = |f: &dyn Fn(&WorkerEntry) -> f64| -> Values<WorkerLabel> {
            workers.iter().map(|w| (WorkerLabel { worker: w.id.to_string() }, f(w))).collect()
        };
        gauge(enc, "worker_running", "Scraped vllm:num_requests_running", &per(&|w| f64::from(w.load.lock().load.running)))?;
        gauge(enc, "worker_waiting", "Scraped vllm:num_requests_waiting", &per(&|w| f64::from(w.load.lock().load.waiting)))?;
        gauge(enc, "worker_kv_usage", "Scraped vllm:kv_cache_usage_perc (0..1)", &per(&|w| w.load.lock().load.kv_usage))?;
        gauge(enc, "worker_healthy", "1 when the worker's scrapes succeed", &per(&|w| f64::from(u8::from(w.load.lock().healthy))))?;
        gauge(enc, "worker_takes_picks", "1 when the worker takes picks (healthy, not suspect, not draining)", &per(&|w| f64::from(u8::from(w.load.lock().takes_picks()))))?;
        let own = per(&|w| f64::from(assignments.pending(&w.id).in_flight));
        gauge(enc, "worker_assignments_in_flight", "Our unfinished assignments per worker", &own)?;
        let per_token = per(&|w| w.calibration.lock().per_token_ms());
        gauge(enc, "worker_per_token_ms", "Calibrated prefill cost per uncached token", &per_token)?;
        let overhead = per(&|w| w.calibration.lock().overhead_ms());
        gauge(enc, "worker_overhead_ms", "Calibrated fixed cost per scheduler step", &overhead)?;
        let failures: Vec<_> =
            workers.iter().map(|w| (WorkerLabel { worker: w.id.to_string() }, w.load.lock().scrapes_failed)).collect();
        counter(enc, "worker_scrape_failures", "Failed metrics scrapes", &failures)
    }

    fn encode_pools(&self, enc: &mut DescriptorEncoder, workers: &[Arc<WorkerEntry>]) -> fmt::Result {
        let pools = &self.0.config.pools;
        if pools.is_empty() {
            return Ok(());
        }
        let values: Values<PoolLabel> = pools
            .keys()
            .flat_map(|name| {
                let members: Vec<_> = workers.iter().filter(|w| crate::pools::member_of(pools, &w.config.labels).contains(&name.as_str())).collect();
                let taking = members.iter().filter(|w| w.load.lock().takes_picks()).count();
                [
                    (PoolLabel { pool: name.clone(), state: "registered" }, members.len() as f64),
                    (PoolLabel { pool: name.clone(), state: "taking_picks" }, taking as f64),
                ]
            })
            .collect();
        gauge(enc, "pool_workers", "Workers per configured pool: registered, and taking picks", &values)
    }

    fn encode_engines(&self, enc: &mut DescriptorEncoder, workers: &[Arc<WorkerEntry>]) -> fmt::Result {
        let engines: Vec<(&WorkerEntry, &Engine)> = workers.iter().flat_map(|w| w.engines.iter().map(move |e| (&**w, e))).collect();
        let label = |w: &WorkerEntry, e: &Engine| EngineLabel { worker: w.id.to_string(), rank: e.rank };
        let blocks: Values<EngineLabel> =
            engines.iter().map(|(w, e)| (label(w, e), self.0.index().engine_blocks(e.slot) as f64)).collect();
        gauge(enc, "index_blocks", "Blocks indexed per engine", &blocks)?;
        let feeds: Vec<_> = engines
            .iter()
            .filter_map(|(w, e)| e.feed.lock().as_ref().map(|f| (label(w, e), f.snapshot())))
            .collect();
        let kinds = |f: &dyn Fn(&FeedSnapshot) -> Vec<(&'static str, u64)>| -> Vec<(EngineKindLabel, u64)> {
            feeds
                .iter()
                .flat_map(|(l, s)| f(s).into_iter().map(|(kind, v)| (EngineKindLabel { worker: l.worker.clone(), rank: l.rank, kind }, v)))
                .collect()
        };
        let applied = kinds(&|s| vec![("stored", s.events_stored), ("removed", s.events_removed), ("cleared", s.events_cleared)]);
        counter(enc, "events_applied", "KV events applied, by kind", &applied)?;
        counter(enc, "events_rejected", "KV events or blocks rejected, by kind", &kinds(&|s| s.rejected.clone()))?;
        let each = |f: fn(&FeedSnapshot) -> u64| -> Vec<(EngineLabel, u64)> {
            feeds.iter().map(|(l, s)| (l.clone(), f(s))).collect()
        };
        counter(enc, "event_batches", "KV event batches received", &each(|s| s.batches))?;
        counter(enc, "event_sequence_gaps", "Sequence gaps detected", &each(|s| s.gaps))?;
        counter(enc, "event_gaps_recovered", "Sequence gaps recovered by replay", &each(|s| s.gaps_recovered))?;
        counter(enc, "event_replays", "Replay requests", &each(|s| s.replays))?;
        counter(enc, "event_replay_failures", "Failed replay requests", &each(|s| s.replay_failures))?;
        counter(enc, "event_resets", "Engine restarts (sequence resets) and cache clears", &each(|s| s.resets))
    }
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let workers = self.0.workers();
        let evicted = self.0.assignments().evicted();
        let m = encoder.encode_descriptor(
            "assignments_evicted",
            "Assignments freed because the table was full (resilience.max_assignments)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(evicted).encode(m)?;
        self.encode_workers(&mut encoder, &workers)?;
        self.encode_pools(&mut encoder, &workers)?;
        self.encode_engines(&mut encoder, &workers)
    }
}
