//! Wiring: `app::start` attaches an ingest feed to every engine of a worker with an events
//! endpoint, and removing the worker stops it.

use kvroute_state::config::{Config, WorkerConfig};
use kvroute_kv::index::memory::MemoryIndex;
use std::sync::Arc;

#[tokio::test]
async fn workers_with_events_get_one_feed_per_engine() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let worker = WorkerConfig {
        events_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        dp_ranks: 2,
        ..WorkerConfig::new("w", "m")
    };
    let config = Config { workers: vec![worker, WorkerConfig::new("plain", "m")], ..Config::default() };
    let state = kvroute_state::app::App::start(config, kvroute_state::store::memory::MemoryStore::store(Arc::new(MemoryIndex::new()))).unwrap();
    let w = state.fleet.worker("w").unwrap();
    assert!(w.engines.iter().all(|e| e.feed.lock().is_some()));
    let snapshot = w.engines[1].feed.lock().as_ref().unwrap().snapshot();
    assert_eq!((snapshot.batches, snapshot.last_seq), (0, None));
    let plain = state.fleet.worker("plain").unwrap();
    assert!(plain.engines[0].feed.lock().is_none());
    assert!(state.membership.remove_worker("w"), "removal joins the ingest threads");
    assert!(state.fleet.worker("w").is_none());
}
