//! Closed-loop HTTP load: `clients` keep-alive connections, each with one
//! request outstanding at a time, all driven by one thread's event loop.
//!
//! One thread rather than a thread per client: with a blocking client
//! each answer wakes a thread of its own, and at 64 clients on this
//! two-core machine the load generator took about a quarter of the CPU
//! the systems it measures compete for (`tablix bench cluster`, three
//! nodes). An event loop reads the answers that arrived together in one
//! wake-up. `insert.rs` keeps its blocking clients: its figures are
//! compared with those earlier builds measured with the same clients.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

/// Runs `clients` futures, `client(c)` for c in 0..clients, on one
/// thread's event loop until all end; their results in order.
pub(crate) fn on_one_thread<T, F, Fut>(clients: usize, client: F) -> anyhow::Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<T>> + 'static,
    T: 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the load generator's event loop")?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let tasks: Vec<_> = (0..clients)
            .map(|c| tokio::task::spawn_local(client(c)))
            .collect();
        let mut results = Vec::with_capacity(clients);
        for t in tasks {
            results.push(t.await.context("a load client stopped")??);
        }
        Ok(results)
    })
}

/// A keep-alive HTTP/1 connection to `addr` (`host:port`), opened when
/// first used and again after it broke.
pub(crate) struct Conn {
    addr: String,
    sender: Option<Sender>,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Conn {
    pub(crate) fn new(addr: &str) -> Conn {
        Conn {
            addr: addr.to_string(),
            sender: None,
        }
    }

    /// POSTs the JSON `body` to `path`: the answer's status and body.
    pub(crate) async fn post(&mut self, path: &str, body: String) -> anyhow::Result<(u16, Bytes)> {
        let sender = match self.sender.as_mut() {
            Some(s) => s,
            None => self.sender.insert(connect(&self.addr).await?),
        };
        let request = hyper::Request::post(path)
            .header("Host", self.addr.as_str())
            .header("Content-Type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .context("building a request")?;
        let answer = async {
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        }
        .await;
        if answer.is_err() {
            self.sender = None;
        }
        answer.with_context(|| format!("POST {path} to {}", self.addr))
    }
}

async fn connect(addr: &str) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP/1 handshake with {addr}"))?;
    // The connection's driver ends when the sender is dropped.
    tokio::task::spawn_local(connection);
    Ok(sender)
}

/// What a load run saw: each successful request's latency in seconds
/// (unsorted), how many failed, and how long the run took.
pub(crate) struct Seen {
    pub took: Vec<f64>,
    pub failed: u64,
    pub elapsed: f64,
}

/// POSTs to `path` on `addr` from `clients` connections, each with one
/// request outstanding at a time, for `seconds`; `body(client, i)` is
/// the JSON body of client `client`'s `i`-th request, and `ok(answer)`
/// says whether an answer counts as done.
pub(crate) fn post_for(
    addr: &str,
    path: &str,
    clients: usize,
    seconds: f64,
    body: fn(usize, u64) -> String,
    ok: fn(&str) -> bool,
) -> anyhow::Result<Seen> {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let each = on_one_thread(clients, |c| {
        let mut conn = Conn::new(addr);
        let path = path.to_string();
        async move {
            let (mut took, mut failed, mut i) = (Vec::new(), 0u64, 0u64);
            while Instant::now() < until {
                let t = Instant::now();
                match conn.post(&path, body(c, i)).await {
                    Ok((200, answer)) if std::str::from_utf8(&answer).is_ok_and(ok) => {
                        took.push(t.elapsed().as_secs_f64());
                    }
                    _ => failed += 1,
                }
                i += 1;
            }
            Ok((took, failed))
        }
    })?;
    let mut seen = Seen {
        took: Vec::new(),
        failed: 0,
        elapsed: started.elapsed().as_secs_f64(),
    };
    for (took, failed) in each {
        seen.took.extend(took);
        seen.failed += failed;
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers `{"n":K,...}` to its K-th request on each
    /// connection, except that its tenth, twentieth, ... answer is a body
    /// the check refuses and its fifth, fifteenth, ... is an error status
    /// with a body the check would take.
    async fn serve(listener: tokio::net::TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                let service =
                    hyper::service::service_fn(move |r: hyper::Request<hyper::body::Incoming>| {
                        let count = std::sync::Arc::clone(&count);
                        async move {
                            let body = r.into_body().collect().await?.to_bytes();
                            let k = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let text = match k % 10 {
                                9 => "refused".to_string(),
                                _ => format!("{{\"n\":{k},\"len\":{}}}", body.len()),
                            };
                            let mut answer = hyper::Response::new(Full::new(Bytes::from(text)));
                            if k % 10 == 4 {
                                *answer.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                            }
                            Ok::<_, hyper::Error>(answer)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    #[test]
    fn every_request_is_counted_once_as_done_or_failed() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        runtime.spawn(serve(listener));
        let seen = post_for(
            &addr,
            "/x",
            3,
            0.3,
            |c, i| format!("[{c},{i}]"),
            |a| a.starts_with("{\"n\":"),
        )
        .unwrap();
        let done = seen.took.len() as u64;
        assert!(done > 30, "only {done} requests done");
        // Each connection fails two of every ten requests: one refused
        // body, one error status.
        let total = done + seen.failed;
        let expected = total / 5;
        assert!(
            seen.failed + 6 >= expected && seen.failed <= expected + 6,
            "{} failed of {total}",
            seen.failed
        );
        assert!(seen.took.iter().all(|&t| t > 0.0 && t < seen.elapsed));
        assert!(seen.elapsed >= 0.3);
    }

    #[test]
    fn a_refused_connection_is_an_error_not_a_hang() {
        let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = unused.local_addr().unwrap().to_string();
        drop(unused);
        let r = on_one_thread(1, |_| {
            let mut conn = Conn::new(&addr);
            async move { conn.post("/x", "[]".into()).await }
        });
        let e = r.expect_err("nothing listens there");
        assert!(format!("{e:#}").contains("connecting to"), "{e:#}");
    }
}
