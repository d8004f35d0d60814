//! Load scraping against a real HTTP server on loopback: health follows the scrapes.

mod common;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use kvroute_state::config::WorkerConfig;
use kvroute_state::load::HealthChange;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const METRICS: &str = "# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 7.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.42
vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0
";

/// Serves vLLM-shaped metrics, or a 500 while `failing` is set.
async fn metrics_server(failing: Arc<AtomicBool>) -> String {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let failing = failing.clone();
            async move {
                if failing.load(Ordering::SeqCst) {
                    Err(StatusCode::INTERNAL_SERVER_ERROR)
                } else {
                    Ok(METRICS)
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/metrics")
}

#[tokio::test]
async fn unhealthy_after_failed_scrapes_and_back_after_recovery() {
    let failing = Arc::new(AtomicBool::new(false));
    let url = metrics_server(failing.clone()).await;
    let (state, _) = common::state(&[]);
    let worker = state.membership.add_worker(&WorkerConfig { metrics_url: Some(url), ..WorkerConfig::new("w", "m") }).unwrap();
    let scraper = state.membership.scraper().clone();
    let target = worker.scrape_target().expect("a metrics URL");

    assert_eq!(scraper.scrape(&target).await, HealthChange::None);
    {
        let load = worker.load.lock();
        assert!(load.healthy);
        assert_eq!((load.load.running, load.load.waiting, load.load.block_size), (3, 7, Some(16)));
        assert!((load.load.kv_usage - 0.42).abs() < 1e-12);
    }

    failing.store(true, Ordering::SeqCst);
    assert_eq!(scraper.scrape(&target).await, HealthChange::None);
    assert_eq!(scraper.scrape(&target).await, HealthChange::None);
    assert_eq!(scraper.scrape(&target).await, HealthChange::BecameUnhealthy);
    assert!(!worker.load.lock().healthy);
    assert!(worker.load.lock().last_error.as_deref().is_some_and(|e| e.contains("500")));
    assert!(!state.fleet.ready(), "the only worker is out of the pool");

    failing.store(false, Ordering::SeqCst);
    assert_eq!(scraper.scrape(&target).await, HealthChange::Recovered);
    assert!(worker.load.lock().healthy && state.fleet.ready());
}

#[tokio::test]
async fn unreachable_worker_goes_unhealthy() {
    // Bind then drop a listener: nothing answers on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (state, _) = common::state(&[]);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let worker = state.membership.add_worker(&WorkerConfig { metrics_url: Some(url), ..WorkerConfig::new("w", "m") }).unwrap();
    let target = worker.scrape_target().expect("a metrics URL");
    for _ in 0..3 {
        state.membership.scraper().scrape(&target).await;
    }
    assert!(!worker.load.lock().healthy);
    let resp = state.picker.pick(&kvroute_core::wire::PickRequest { model: "m".into(), ..Default::default() }, kvroute_state::pick::Deadline::default()).await;
    assert_eq!(resp.degraded_reason().label(), "no_healthy_worker");
}
