//! In-process fixtures for testing the filter's protocol handling through real Envoy without
//! the real services: a fake state service (answers PickRequests as told, records picks and
//! reports) and fake workers (OpenAI-shaped answers, `x-sim-worker`, record what reached them).
//! The must-show end-to-end tests use the real `kvroute-state` and `kvroute-sim` instead.

use anyhow::Result;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvroute_core::wire::{DegradedReason, PickRequest, PickResponse, Report, ReportBatch};
use parking_lot::Mutex;
use prost::Message;
use std::sync::Arc;
use tokio::task::JoinHandle;

async fn serve(app: Router) -> Result<(u16, JoinHandle<()>)> {
    serve_until(0, app, std::future::pending()).await
}

/// Serves until `stop` resolves; hyper's graceful shutdown then closes idle keep-alive
/// connections too, so a stopped server looks like a dead process to Envoy's pool. Port 0
/// binds one the OS picks (no window for another test to take it between probe and bind);
/// the bound port is returned.
async fn serve_until(port: u16, app: Router, stop: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(u16, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let port = listener.local_addr()?.port();
    Ok((port, tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stop).await;
    })))
}

/// What the fake state service answers to a pick.
#[derive(Clone, Debug)]
pub enum PickBehavior {
    /// Choose this worker (its endpoint and cluster are filled in).
    Route { worker: String, endpoint: String, cluster: String },
    /// Answer with this HTTP status and an empty body.
    Status(u16),
    /// A 200 degraded decision without a worker, for this reason.
    Degraded(DegradedReason),
    /// A 200 without a worker whose `degraded_reason` is this raw value (one a newer state
    /// service might send).
    DegradedRaw(i32),
    /// 200 with bytes that are not a PickResponse.
    Garbage,
    /// Answer like `Route` to worker `worker`, but only after this many milliseconds.
    Slow { millis: u64, then: Box<PickBehavior> },
}

#[derive(Default)]
pub struct StateLog {
    pub picks: Vec<PickRequest>,
    pub reports: Vec<Report>,
}

struct StateShared {
    behavior: Mutex<PickBehavior>,
    log: Mutex<StateLog>,
    next_id: Mutex<u64>,
}

pub struct FakeState {
    pub port: u16,
    shared: Arc<StateShared>,
    task: Option<(JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>,
}

impl FakeState {
    pub async fn start(behavior: PickBehavior) -> Result<FakeState> {
        let shared = Arc::new(StateShared { behavior: Mutex::new(behavior), log: Mutex::default(), next_id: Mutex::new(0) });
        let mut s = FakeState { port: 0, shared, task: None };
        s.restart().await?;
        Ok(s)
    }

    /// Binds a port the OS picks the first time, the same port after a stop.
    pub async fn restart(&mut self) -> Result<()> {
        let app = Router::new()
            .route("/v1/pick", post(pick))
            .route("/v1/report", post(report))
            // Ready, as Envoy's health check of the state cluster asks.
            .route("/readyz", get(|| async { "ready\n" }))
            .with_state(self.shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (port, task) = serve_until(self.port, app, async move {
            let _ = rx.await;
        })
        .await?;
        self.port = port;
        self.task = Some((task, tx));
        Ok(())
    }

    /// Stops accepting and closes every connection (waits up to 5 s for in-flight requests).
    pub async fn stop(&mut self) {
        if let Some((mut task, tx)) = self.task.take() {
            let _ = tx.send(());
            if tokio::time::timeout(std::time::Duration::from_secs(5), &mut task).await.is_err() {
                task.abort();
            }
        }
    }

    pub fn set_behavior(&self, b: PickBehavior) {
        *self.shared.behavior.lock() = b;
    }

    pub fn picks(&self) -> Vec<PickRequest> {
        self.shared.log.lock().picks.clone()
    }

    pub fn reports(&self) -> Vec<Report> {
        self.shared.log.lock().reports.clone()
    }
}

impl Drop for FakeState {
    fn drop(&mut self) {
        if let Some((task, _)) = self.task.take() {
            task.abort();
        }
    }
}

async fn pick(State(s): State<Arc<StateShared>>, body: Bytes) -> Response {
    let Ok(req) = PickRequest::decode(body) else { return StatusCode::BAD_REQUEST.into_response() };
    s.log.lock().picks.push(req);
    let mut behavior = s.behavior.lock().clone();
    while let PickBehavior::Slow { millis, then } = behavior {
        tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
        behavior = *then;
    }
    // `PickRequest.reports` is ignored and `reports_applied` left 0, as by a service from
    // before the field: the filter sends the reports it carried again in a ReportBatch, so
    // `reports()` sees each once (this is the compatibility path's test).
    let resp = match behavior {
        PickBehavior::Route { worker, endpoint, cluster } => {
            let mut id = s.next_id.lock();
            *id += 1;
            PickResponse { assignment_id: *id, worker_id: worker, endpoint, cluster, policy: "fake".into(), ..PickResponse::default() }
        }
        PickBehavior::Status(code) => return StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR).into_response(),
        PickBehavior::Degraded(reason) => PickResponse { degraded_reason: reason as i32, ..PickResponse::default() },
        PickBehavior::DegradedRaw(value) => PickResponse { degraded_reason: value, ..PickResponse::default() },
        PickBehavior::Garbage => return (StatusCode::OK, vec![0xff_u8, 0xff, 0xff]).into_response(),
        PickBehavior::Slow { .. } => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    ([("content-type", "application/x-protobuf")], resp.encode_to_vec()).into_response()
}

async fn report(State(s): State<Arc<StateShared>>, body: Bytes) -> StatusCode {
    match ReportBatch::decode(body) {
        Ok(b) => {
            s.log.lock().reports.extend(b.reports);
            StatusCode::NO_CONTENT
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// A request as a fake worker received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

struct WorkerShared {
    name: String,
    seen: Mutex<Vec<Seen>>,
    /// Keep what reached the worker (`seen`); benchmarks turn it off (megabyte bodies).
    record: bool,
}

pub struct FakeWorker {
    pub port: u16,
    pub name: String,
    shared: Arc<WorkerShared>,
    _task: JoinHandle<()>,
}

/// The exact bytes a fake worker streams for `"stream": true` (several chunks, usage last).
pub fn stream_chunks(worker: &str) -> Vec<String> {
    let mut chunks: Vec<String> = (0..5)
        .map(|i| format!("data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"text\":\"tok{i} from {worker} \\u00e9\"}}],\"usage\":null}}\n\n"))
        .collect();
    chunks.push("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":5}}\n\n".into());
    chunks.push("data: [DONE]\n\n".into());
    chunks
}

/// The exact JSON body a fake worker answers without streaming.
pub fn json_body(worker: &str) -> String {
    format!("{{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"hello from {worker}\"}}],\"usage\":{{\"prompt_tokens\":21,\"completion_tokens\":3}}}}")
}

impl FakeWorker {
    pub async fn start(name: &str) -> Result<FakeWorker> {
        FakeWorker::start_with(name, true).await
    }

    /// A worker that does not keep the requests it answers (for benchmarks).
    pub async fn start_unrecorded(name: &str) -> Result<FakeWorker> {
        FakeWorker::start_with(name, false).await
    }

    async fn start_with(name: &str, record: bool) -> Result<FakeWorker> {
        let shared = Arc::new(WorkerShared { name: name.to_string(), seen: Mutex::default(), record });
        let app = Router::new()
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .fallback(any_path)
            .with_state(shared.clone());
        let (port, task) = serve(app).await?;
        Ok(FakeWorker { port, name: name.to_string(), shared, _task: task })
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().clone()
    }
}

async fn models(State(s): State<Arc<WorkerShared>>) -> Response {
    ([("x-sim-worker", s.name.clone())], format!("{{\"object\":\"list\",\"data\":[{{\"id\":\"m\",\"owned_by\":\"{}\"}}]}}", s.name)).into_response()
}

/// vLLM-shaped `/metrics` of an idle engine (block size 16), enough for the real
/// `kvroute-state` scraper to count the worker healthy with zero load.
pub const IDLE_VLLM_METRICS: &str = "\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size=\"16\",engine=\"0\",enable_prefix_caching=\"True\",num_gpu_blocks=\"27000\"} 1.0
";

async fn metrics() -> Response {
    ([("content-type", "text/plain; version=0.0.4")], IDLE_VLLM_METRICS).into_response()
}

async fn any_path(State(s): State<Arc<WorkerShared>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    if s.record {
        s.seen.lock().push(Seen { path: path.clone(), headers, body: body.clone() });
    }
    let name = s.name.clone();
    if !path.starts_with("/v1/") {
        return ([("x-sim-worker", name.clone())], format!("other {path} on {name}")).into_response();
    }
    let streaming = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["stream"].as_bool()).unwrap_or(false);
    if streaming {
        let chunks = stream_chunks(&name).into_iter().map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
        let body = Body::from_stream(tokio_stream::iter(chunks));
        return ([("x-sim-worker", name), ("content-type", "text/event-stream".to_string())], body).into_response();
    }
    ([("x-sim-worker", name.clone()), ("content-type", "application/json".to_string())], json_body(&name)).into_response()
}
