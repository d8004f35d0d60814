//! One worker's memory of Responses API responses, as vLLM's `OpenAIServingResponses` keeps
//! them: `response_store` (the response object `GET /v1/responses/{id}` returns and a
//! follow-up's `previous_response_id` reads) and `msg_store` (the chat messages that
//! response's request rendered, the follow-up's history), here one entry per id. vLLM keeps
//! them in process memory, never evicted (it warns of the leak), lost on restart; the
//! simulator bounds them (oldest evicted first) and forgets them on a simulated restart.
//!
//! A background request's entry also holds its generation task (cancel aborts it) and, when it
//! streams, its event log (vLLM's `event_store`), which `GET ...?stream=true` replays.

use axum::body::Bytes;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Responses kept per worker before the oldest are evicted.
pub const DEFAULT_CAPACITY: usize = 10_000;

pub struct Entry {
    /// The response object as `GET` returns it.
    pub response: Value,
    /// The chat messages the request rendered (`msg_store`): instructions, history, input.
    pub messages: Vec<Value>,
    /// A background generation still running.
    pub task: Option<AbortHandle>,
    /// A background stream's events.
    pub events: Option<EventLog>,
}

/// Why a cancel was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CancelError {
    NotFound,
    /// Not `queued` / `in_progress`: vLLM's "Cannot cancel a synchronous response."
    NotCancellable,
}

pub struct ResponseStore {
    enabled: bool,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Insertion order, for eviction.
    order: VecDeque<String>,
}

impl ResponseStore {
    /// `enabled`: whether `store: true` stores (vLLM: `VLLM_ENABLE_RESPONSES_API_STORE=1`).
    pub fn new(enabled: bool, capacity: usize) -> ResponseStore {
        ResponseStore { enabled, capacity: capacity.max(1), inner: Mutex::new(Inner::default()) }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores (or replaces) `id`'s entry, evicting the oldest beyond capacity.
    pub fn insert(&self, id: String, entry: Entry) {
        let mut inner = self.inner.lock();
        if inner.map.insert(id.clone(), entry).is_none() {
            inner.order.push_back(id);
        }
        while inner.map.len() > self.capacity {
            let Some(oldest) = inner.order.pop_front() else { break };
            inner.map.remove(&oldest);
        }
    }

    /// The stored response and its request's messages.
    pub fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        self.inner.lock().map.get(id).map(|e| (e.response.clone(), e.messages.clone()))
    }

    /// `Some(log)` for a stored background stream, `Some(None)` for another stored response.
    pub fn events(&self, id: &str) -> Option<Option<EventLog>> {
        self.inner.lock().map.get(id).map(|e| e.events.clone())
    }

    /// The task generating a background response (cancel aborts it), unless it already ended.
    pub fn set_task(&self, id: &str, task: AbortHandle) {
        if let Some(e) = self.inner.lock().map.get_mut(id) {
            if e.response["status"] == "queued" {
                e.task = Some(task);
            }
        }
    }

    /// A generation's final response, unless the stored one was cancelled meanwhile (vLLM
    /// keeps a cancelled response as it is).
    pub fn finish(&self, id: &str, response: Value, messages: Vec<Value>) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.map.get_mut(id) {
            if e.response["status"] != "cancelled" {
                e.response = response;
            }
            e.messages = messages;
            e.task = None;
            return;
        }
        drop(inner);
        self.insert(id.to_string(), Entry { response, messages, task: None, events: None });
    }

    /// Marks a background response failed (its generation died), unless it already ended.
    pub fn fail(&self, id: &str) {
        if let Some(e) = self.inner.lock().map.get_mut(id) {
            if !matches!(e.response["status"].as_str(), Some("completed" | "cancelled")) {
                e.response["status"] = "failed".into();
            }
            e.task = None;
        }
    }

    /// vLLM's `cancel_responses`: only a `queued` / `in_progress` response can be cancelled;
    /// it becomes `cancelled` and its generation is aborted. Returns the cancelled response.
    pub fn cancel(&self, id: &str) -> Result<Value, CancelError> {
        let mut inner = self.inner.lock();
        let e = inner.map.get_mut(id).ok_or(CancelError::NotFound)?;
        if !matches!(e.response["status"].as_str(), Some("queued" | "in_progress")) {
            return Err(CancelError::NotCancellable);
        }
        e.response["status"] = "cancelled".into();
        if let Some(task) = e.task.take() {
            task.abort();
        }
        Ok(e.response.clone())
    }

    /// A restarted server remembers nothing; running background generations die with it.
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        for e in inner.map.values() {
            if let Some(t) = &e.task {
                t.abort();
            }
        }
        inner.map.clear();
        inner.order.clear();
    }
}

/// A background stream's SSE events, appended by its generation and replayed to any number of
/// readers (`starting_after` = the last sequence number a reader already has).
#[derive(Clone)]
pub struct EventLog(Arc<LogInner>);

struct LogInner {
    state: Mutex<LogState>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct LogState {
    /// Encoded events, index = sequence number, and whether each ends the stream.
    events: Vec<(Bytes, bool)>,
    closed: bool,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog(Arc::new(LogInner { state: Mutex::new(LogState::default()), changed: watch::channel(0).0 }))
    }
}

impl EventLog {
    pub fn push(&self, event: Bytes, terminal: bool) {
        self.0.state.lock().events.push((event, terminal));
        self.0.changed.send_modify(|n| *n += 1);
    }

    /// No more events will come (the generation ended or was aborted).
    pub fn close(&self) {
        self.0.state.lock().closed = true;
        self.0.changed.send_modify(|n| *n += 1);
    }

    /// Events from index `from` on, as they come, until a terminal one (vLLM's
    /// `responses_background_stream_generator`) or until the log closes.
    pub fn replay(&self, from: usize) -> tokio::sync::mpsc::Receiver<Bytes> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let log = self.clone();
        tokio::spawn(async move {
            let mut changed = log.0.changed.subscribe();
            let mut next = from;
            loop {
                let (batch, closed) = {
                    let st = log.0.state.lock();
                    (st.events.get(next..).unwrap_or_default().to_vec(), st.closed)
                };
                for (event, terminal) in batch {
                    next += 1;
                    if tx.send(event).await.is_err() || terminal {
                        return;
                    }
                }
                if closed || changed.changed().await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}

/// Closes the log when the generation that writes it ends, however it ends (an aborted task
/// drops it too).
pub struct CloseOnDrop(pub EventLog);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(status: &str) -> Entry {
        Entry { response: json!({"id": "x", "status": status}), messages: vec![], task: None, events: None }
    }

    #[test]
    fn evicts_oldest_and_cancels_only_running() {
        let s = ResponseStore::new(true, 2);
        s.insert("a".into(), entry("completed"));
        s.insert("b".into(), entry("queued"));
        s.insert("a".into(), entry("completed")); // a replacement keeps a's place
        s.insert("c".into(), entry("completed"));
        assert!(s.get("a").is_none(), "oldest evicted");
        assert_eq!(s.len(), 2);
        assert_eq!(s.cancel("c"), Err(CancelError::NotCancellable));
        assert_eq!(s.cancel("zz"), Err(CancelError::NotFound));
        assert_eq!(s.cancel("b").unwrap()["status"], "cancelled");
        s.finish("b", json!({"status": "completed"}), vec![]);
        assert_eq!(s.get("b").unwrap().0["status"], "cancelled", "a cancelled response stays cancelled");
        s.clear();
        assert!(s.is_empty());
    }

    #[tokio::test]
    async fn replay_from_an_index_until_terminal() {
        let log = EventLog::default();
        log.push(Bytes::from_static(b"0"), false);
        log.push(Bytes::from_static(b"1"), false);
        let mut rx = log.replay(1);
        assert_eq!(rx.recv().await.unwrap(), "1");
        log.push(Bytes::from_static(b"2"), true);
        log.push(Bytes::from_static(b"3"), false);
        assert_eq!(rx.recv().await.unwrap(), "2");
        assert!(rx.recv().await.is_none(), "ends at the terminal event");
        let closed = EventLog::default();
        let mut rx = closed.replay(0);
        drop(CloseOnDrop(closed.clone()));
        assert!(rx.recv().await.is_none(), "ends when the writer is gone");
    }
}
