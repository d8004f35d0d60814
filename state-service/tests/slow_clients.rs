//! Slow and silent clients (issue 33): the state service closes a connection that has not
//! sent a complete request head within its deadline, and still answers the ones that do.

use axum::routing::get;
use axum::Router;
use kvroute_state::api::serve;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads until the server closes the connection (or 5 s pass): what it sent, and when.
async fn until_closed(name: &str, stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!("{name}: still open after 5 s; got {:?}", String::from_utf8_lossy(&seen)),
        }
    }
    (String::from_utf8_lossy(&seen).into_owned(), started.elapsed())
}

#[tokio::test]
async fn connections_without_a_request_head_in_time_are_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router, Duration::from_millis(300), async {
        let _ = stopped.await;
    }));

    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: state\r\n").await.unwrap();
    for (name, stream) in [("silent", &mut silent), ("slow", &mut slow)] {
        let (_, after) = until_closed(name, stream).await;
        assert!(after < Duration::from_secs(3), "{name}: closed after {after:?}");
    }

    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: state\r\nConnection: close\r\n\r\n").await.unwrap();
    let (answer, _) = until_closed("complete", &mut ok).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server).await.expect("stops").unwrap();
}
