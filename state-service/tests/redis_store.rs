//! The Redis store with real `redis-server`s: the mirror against the reference model,
//! replicas sharing assignments and runtime-registered workers, warm restarts from the
//! mirror, shard outages, the shared budget ledger.

#[path = "redis_store/support.rs"]
mod support;
#[path = "redis_store/differential.rs"]
mod differential;
#[path = "redis_store/replicas.rs"]
mod replicas;
#[path = "redis_store/sims.rs"]
mod sims;
#[path = "redis_store/warm_start.rs"]
mod warm_start;
#[path = "redis_store/outage.rs"]
mod outage;
#[path = "redis_store/runtime_workers.rs"]
mod runtime_workers;
#[path = "redis_store/proxy.rs"]
mod proxy;
#[path = "redis_store/slow_shard.rs"]
mod slow_shard;
#[path = "redis_store/half_open.rs"]
mod half_open;
#[path = "redis_store/stale_records.rs"]
mod stale_records;
#[path = "redis_store/tls.rs"]
mod tls;
#[path = "redis_store/lost_frees.rs"]
mod lost_frees;
#[path = "redis_store/late_cancels.rs"]
mod late_cancels;
#[path = "redis_store/ledger.rs"]
mod ledger;
#[path = "redis_store/responses.rs"]
mod responses;
