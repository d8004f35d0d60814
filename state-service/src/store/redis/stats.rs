//! Counters of the Redis store, exported at scrape time as `kvroute_store_*`.

use super::RedisStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;

#[derive(Debug, Default)]
pub struct StoreStats {
    /// Replicated writes (assignment records, events, calibration) sent.
    pub writes: AtomicU64,
    /// Replicated writes dropped: queue full, shard down, or the call failed.
    pub writes_dropped: AtomicU64,
    /// Events from other replicas applied.
    pub received: AtomicU64,
    /// Records or messages that did not decode.
    pub bad_messages: AtomicU64,
    /// (Re)subscriptions that reloaded a shard's assignment records.
    pub resyncs: AtomicU64,
    /// Mirror flushes written / failed.
    pub mirror_flushes: AtomicU64,
    pub mirror_failures: AtomicU64,
    /// Shards that came back after being down.
    pub recoveries: AtomicU64,
    /// Subscriptions that heard nothing (not even a heartbeat) for three `heartbeat_ms`, so
    /// were taken as dead (half-open) and renewed.
    pub subscription_timeouts: AtomicU64,
    /// Assignment records or events not adopted because they outlived their TTL.
    pub stale_records: AtomicU64,
    /// Adopted assignments a resync freed: their shard no longer held them (the `freed` event
    /// was lost while it was away, or it restarted empty).
    pub reconciled: AtomicU64,
    /// Frees written again, as tombstones, once the shard they missed was back.
    pub frees_resent: AtomicU64,
}

pub(super) struct StoreCollector {
    pub(super) store: Weak<RedisStore>,
}

impl fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreCollector")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShardLabel {
    shard: String,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: &AtomicU64) -> Result<(), fmt::Error> {
    let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v.load(Ordering::Relaxed)).encode(m)
}

impl Collector for StoreCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some(store) = self.store.upgrade() else { return Ok(()) };
        let s = &store.stats;
        counter(&mut enc, "store_writes", "Replicated writes sent to Redis", &s.writes)?;
        counter(&mut enc, "store_writes_dropped", "Replicated writes dropped (queue full, shard down, failed call)", &s.writes_dropped)?;
        counter(&mut enc, "store_events_received", "Events from other replicas applied", &s.received)?;
        counter(&mut enc, "store_bad_messages", "Undecodable records or messages", &s.bad_messages)?;
        counter(&mut enc, "store_resyncs", "Subscriptions that reloaded a shard's assignments", &s.resyncs)?;
        counter(&mut enc, "store_mirror_flushes", "Mirror changes written", &s.mirror_flushes)?;
        counter(&mut enc, "store_mirror_failures", "Mirror writes that failed (rewritten later)", &s.mirror_failures)?;
        counter(&mut enc, "store_shard_recoveries", "Shards that came back after being down", &s.recoveries)?;
        counter(&mut enc, "store_subscription_timeouts", "Subscriptions silent for 3 heartbeats, taken as dead and renewed", &s.subscription_timeouts)?;
        counter(&mut enc, "store_reconciled", "Adopted assignments freed by a resync: their shard no longer held them", &s.reconciled)?;
        counter(&mut enc, "store_frees_resent", "Frees written again (with a tombstone) once the shard they missed was back", &s.frees_resent)?;
        counter(&mut enc, "store_stale_records", "Assignment records or events not adopted: older than their TTL", &s.stale_records)?;
        let mut up = enc.encode_descriptor("store_shard_up", "1 while the shard answers", None, MetricType::Gauge)?;
        for id in store.shards.ids() {
            let node = store.shards.node(id);
            let label = ShardLabel { shard: node.url.clone() };
            ConstGauge::new(i64::from(store.shards.is_up(id))).encode(up.encode_family(&label)?)?;
        }
        let mut subscribed = enc.encode_descriptor("store_shard_subscribed", "1 while this replica's event subscription to the shard is live", None, MetricType::Gauge)?;
        for id in store.shards.ids() {
            let label = ShardLabel { shard: store.shards.node(id).url.clone() };
            ConstGauge::new(i64::from(store.shards.is_subscribed(id))).encode(subscribed.encode_family(&label)?)?;
        }
        Ok(())
    }
}
