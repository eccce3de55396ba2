//! A small client of the daemon's HTTP API, over the daemon's Unix socket
//! (where it is known by its Unix credentials) or TCP (plain or TLS, with
//! an API user's credentials or, on loopback, again as its Unix user).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value as Json, json};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Ctrl-C gave the request up.
    #[error("Interrupted")]
    Interrupted,
    #[error("no tablix daemon is answering at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("the daemon refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
    #[error("{0}")]
    Setup(String),
}

/// The result of one statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Rows {
        columns: Vec<String>,
        types: Vec<String>,
        /// Values as JSON; blobs are arrays of byte values.
        values: Vec<Vec<Json>>,
    },
    Executed {
        last_insert_id: i64,
        rows_affected: u64,
    },
    Error(String),
}

enum Transport {
    /// HTTP over the daemon's Unix socket.
    Unix {
        path: PathBuf,
        runtime: tokio::runtime::Runtime,
    },
    /// HTTP or HTTPS over TCP; `base` is scheme://host:port. `others` are
    /// the other nodes of its cluster (their API URLs), tried in turn
    /// when `base` cannot be reached.
    Tcp {
        base: Mutex<String>,
        others: Mutex<Vec<String>>,
        agent: ureq::Agent,
        /// TLS for the interactive shell's own connections to an
        /// https:// address.
        tls: Arc<rustls::ClientConfig>,
    },
}

/// Whether a request failed before anything reached the daemon, so that
/// sending it elsewhere cannot apply a write twice.
fn never_sent(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::AddrNotAvailable
        ),
        _ => false,
    }
}

pub struct Client {
    transport: Transport,
    /// Set by SIGINT while the shell is interactive: a request under way
    /// is given up (the daemon sees its client go and stops the
    /// statement) and answered `Interrupted`.
    interrupt: Option<Arc<AtomicBool>>,
    /// HTTP Basic credentials, sent with every request.
    authorization: Option<String>,
    /// The read consistency level reads ask for (`.consistency`).
    level: Option<String>,
}

/// Largest response the client takes whole (the daemon bounds results).
const MAX_RESPONSE: u64 = 1 << 32;

impl Client {
    /// A client of the daemon listening on the Unix socket `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Result<Client, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Setup(format!("starting the client: {e}")))?;
        Ok(Client {
            transport: Transport::Unix {
                path: path.into(),
                runtime,
            },
            authorization: None,
            level: None,
            interrupt: None,
        })
    }

    /// A client of the daemon at `addr`: HOST:PORT (HTTP), or
    /// http://HOST:PORT or https://HOST:PORT; a missing port is 4001.
    /// `ca` is a PEM certificate to trust for HTTPS besides the usual roots.
    pub fn tcp(addr: &str, ca: Option<&Path>) -> Result<Client, ClientError> {
        let (scheme, rest) = match addr.split_once("://") {
            Some((s @ ("http" | "https"), rest)) => (s, rest),
            Some((other, _)) => {
                return Err(ClientError::Setup(format!(
                    "unknown scheme {other:?} in {addr:?}: use http:// or https://"
                )));
            }
            None => ("http", addr),
        };
        let rest = rest.trim_end_matches('/');
        let host_port = if rest
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            rest.to_string()
        } else {
            format!("{rest}:4001")
        };
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(3)));
        // The interactive shell's requests go over connections of their
        // own (a Ctrl-C closes them): they trust what ureq's do.
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = ca {
            let pem = std::fs::read(ca)
                .map_err(|e| ClientError::Setup(format!("reading {}: {e}", ca.display())))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(ClientError::Setup(format!(
                    "{} holds no PEM certificate",
                    ca.display()
                )));
            }
            for c in &certs {
                roots
                    .add(rustls::pki_types::CertificateDer::from(c.der().to_vec()))
                    .map_err(|e| {
                        ClientError::Setup(format!("a certificate of {}: {e}", ca.display()))
                    })?;
            }
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                    .build(),
            );
        }
        if ca.is_none() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Setup(format!("setting up TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Client {
            transport: Transport::Tcp {
                base: Mutex::new(format!("{scheme}://{host_port}")),
                others: Mutex::new(Vec::new()),
                agent: config.build().into(),
                tls: Arc::new(tls),
            },
            authorization: None,
            level: None,
            interrupt: None,
        })
    }

    /// Gives up a request under way when `flag` is set (SIGINT's), with
    /// `ClientError::Interrupted`; clears the flag then.
    pub fn interrupt_on(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }

    /// Whether the interrupt flag is set; clears it.
    fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.swap(false, Ordering::SeqCst))
    }

    /// Sends `user` and `password` (an API user's) with every request.
    pub fn with_credentials(mut self, user: &str, password: &str) -> Client {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.authorization = Some(format!("Basic {token}"));
        self
    }

    /// Where the daemon is, for messages.
    pub fn addr(&self) -> String {
        match &self.transport {
            Transport::Unix { path, .. } => path.display().to_string(),
            Transport::Tcp { base, .. } => base.lock().map(|b| b.clone()).unwrap_or_default(),
        }
    }

    /// Learns the other nodes of the daemon's cluster (rqlite's `/nodes`),
    /// to go on with one of them if this one cannot be reached. A daemon
    /// that is not a cluster node has none.
    pub fn learn_cluster(&self) {
        let Transport::Tcp { base, others, .. } = &self.transport else {
            return;
        };
        let Ok(seen) = self.get_json("/nodes?ver=2") else {
            return;
        };
        let current = base.lock().map(|b| b.clone()).unwrap_or_default();
        let found: Vec<String> = seen["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n["api_addr"].as_str())
                    .filter(|a| !a.is_empty() && *a != current)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        if let Ok(mut o) = others.lock() {
            *o = found;
        }
    }

    fn unreachable(&self, reason: impl ToString) -> ClientError {
        ClientError::Unreachable {
            addr: self.addr(),
            reason: reason.to_string(),
        }
    }

    /// Sends one request; the status and body of the answer.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, String), ClientError> {
        let (status, bytes) = self.send_bytes(method, path, body.map(String::into_bytes))?;
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Sends one request of bytes; the status and body of the answer. With
    /// an interrupt flag, the request can be given up: over the Unix
    /// socket its connection closes at once; over TCP it is left to end on
    /// a thread of its own.
    fn send_bytes(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        // A Ctrl-C typed while nothing ran is not this request's.
        self.interrupted();
        let Some(flag) = self.interrupt.clone() else {
            return self.send_now(method, path, body);
        };
        match &self.transport {
            Transport::Unix {
                path: socket,
                runtime,
            } => runtime.block_on(async {
                tokio::select! {
                    r = self.over_unix(socket, method, path, body) => r,
                    () = raised(&flag) => {
                        flag.store(false, Ordering::SeqCst);
                        Err(ClientError::Interrupted)
                    }
                }
            }),
            Transport::Tcp { .. } => {
                // Over a connection of its own, closed at a Ctrl-C: the
                // daemon sees its client go and stops the statement.
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| ClientError::Setup(format!("starting a request: {e}")))?;
                runtime.block_on(async {
                    tokio::select! {
                        r = self.over_tcp_anywhere(method, path, body) => r,
                        () = raised(&flag) => {
                            flag.store(false, Ordering::SeqCst);
                            Err(ClientError::Interrupted)
                        }
                    }
                })
            }
        }
    }

    /// One request over a connection of its own to this node, or, when
    /// it cannot be reached (nothing was sent), to the other nodes of
    /// its cluster in turn, as [`Client::send_now`] does.
    async fn over_tcp_anywhere(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let Transport::Tcp { others, tls, .. } = &self.transport else {
            return Err(ClientError::Setup("not a TCP client".into()));
        };
        let at = self.addr();
        let mut candidates = vec![at.clone()];
        candidates.extend(others.lock().map(|o| o.clone()).unwrap_or_default());
        let mut unreached = None;
        for url in candidates {
            let (secure, host_port) = match url.split_once("://") {
                Some(("https", rest)) => (true, rest),
                Some((_, rest)) => (false, rest),
                None => (false, url.as_str()),
            };
            let connect = tokio::net::TcpStream::connect(host_port);
            let stream = match tokio::time::timeout(Duration::from_secs(3), connect).await {
                Ok(Ok(s)) => s,
                // Nothing was sent: the next node may take it.
                Ok(Err(e)) => {
                    unreached.get_or_insert_with(|| e.to_string());
                    continue;
                }
                Err(_) => {
                    unreached.get_or_insert_with(|| "connecting timed out after 3 s".into());
                    continue;
                }
            };
            if url != at {
                self.go_on_with(&at, &url);
            }
            let tls = secure.then(|| Arc::clone(tls));
            return self
                .over_tcp(stream, host_port, tls, method, path, body)
                .await;
        }
        Err(self.unreachable(unreached.unwrap_or_default()))
    }

    /// `at` could not be reached and `other`, another node of its
    /// cluster, took the request: it is the node from now on, and `at`
    /// goes to the end of the others.
    fn go_on_with(&self, at: &str, other: &str) {
        eprintln!("({at} cannot be reached; going on with {other})");
        if let Transport::Tcp { base, others, .. } = &self.transport
            && let (Ok(mut b), Ok(mut o)) = (base.lock(), others.lock())
        {
            o.retain(|x| x != other);
            o.push(at.to_string());
            *b = other.to_string();
        }
    }

    /// Sends one request of bytes and waits for its answer.
    fn send_now(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        match &self.transport {
            Transport::Tcp { others, agent, .. } => {
                let send_to = |at: &str| {
                    tcp_call(
                        agent,
                        &format!("{at}{path}"),
                        self.authorization.as_deref(),
                        body.as_deref(),
                    )
                };
                let at = self.addr();
                let answer = match send_to(&at) {
                    Ok(r) => r,
                    Err(e) if never_sent(&e) => {
                        // The node is gone: another node of its cluster
                        // takes the request (it reached nobody).
                        let candidates = others.lock().map(|o| o.clone()).unwrap_or_default();
                        let mut found = None;
                        for other in candidates {
                            match send_to(&other) {
                                Ok(r) => {
                                    self.go_on_with(&at, &other);
                                    found = Some(r);
                                    break;
                                }
                                // Reached no one either: the next may do.
                                Err(e) if never_sent(&e) => {}
                                // It may have reached that node: sending it
                                // again elsewhere could apply it twice.
                                Err(e) => {
                                    return Err(ClientError::Unreachable {
                                        addr: other,
                                        reason: e.to_string(),
                                    });
                                }
                            }
                        }
                        found.ok_or_else(|| self.unreachable(e))?
                    }
                    Err(e) => return Err(self.unreachable(e)),
                };
                Ok(answer)
            }
            Transport::Unix {
                path: socket,
                runtime,
            } => runtime.block_on(self.over_unix(socket, method, path, body)),
        }
    }

    async fn over_unix(
        &self,
        socket: &Path,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| self.unreachable(e))?;
        self.over_stream(stream, "localhost", method, path, body)
            .await
    }

    /// One request on `stream`, a new connection to `host_port` (TLS
    /// with `tls`), which closes when the future is dropped.
    async fn over_tcp(
        &self,
        stream: tokio::net::TcpStream,
        host_port: &str,
        tls: Option<Arc<rustls::ClientConfig>>,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            return self
                .over_stream(stream, host_port, method, path, body)
                .await;
        };
        let host = match host_port.rsplit_once(':') {
            Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => host_port,
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| ClientError::Setup(format!("{host:?} is not a TLS server name: {e}")))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await
            .map_err(|e| self.unreachable(format!("TLS: {e}")))?;
        self.over_stream(stream, host_port, method, path, body)
            .await
    }

    /// One HTTP/1 request on `stream`.
    async fn over_stream<S>(
        &self,
        stream: S,
        host: &str,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        use http_body_util::BodyExt;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| self.unreachable(e))?;
        let driver = tokio::spawn(conn);
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("Host", host);
        if let Some(a) = &self.authorization {
            builder = builder.header("Authorization", a.as_str());
        }
        let body = match body {
            Some(b) => {
                builder = builder.header("Content-Type", "application/json");
                http_body_util::Full::new(hyper::body::Bytes::from(b))
            }
            None => http_body_util::Full::new(hyper::body::Bytes::new()),
        };
        let request = builder
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?
            .to_bytes();
        driver.abort();
        Ok((status, bytes.to_vec()))
    }

    fn post(&self, path: &str, body: &Json) -> Result<Json, ClientError> {
        let (status, text) = self.send("POST", path, Some(body.to_string()))?;
        let json: Json = serde_json::from_str(&text)
            .map_err(|_| ClientError::Protocol(format!("HTTP {status}: {text}")))?;
        if status != 200 {
            let message = json["error"].as_str().unwrap_or(&text).to_string();
            return Err(ClientError::Refused { status, message });
        }
        Ok(json)
    }

    /// A GET of `path`, as JSON.
    pub fn get_json(&self, path: &str) -> Result<Json, ClientError> {
        let (status, text) = self.send("GET", path, None)?;
        let json: Json = serde_json::from_str(&text)
            .map_err(|_| ClientError::Protocol(format!("HTTP {status}: {text}")))?;
        if status != 200 {
            let message = json["error"].as_str().unwrap_or(&text).to_string();
            return Err(ClientError::Refused { status, message });
        }
        Ok(json)
    }

    /// Runs statements through `/db/request` (reads on a snapshot, writes
    /// through the writer), optionally as one transaction.
    pub fn request(
        &self,
        statements: &[String],
        transaction: bool,
    ) -> Result<Vec<Reply>, ClientError> {
        let path = format!(
            "/db/request?blob_array{}{}",
            if transaction { "&transaction" } else { "" },
            self.level_option()
        );
        self.results(self.post(&path, &json!(statements))?)
    }

    /// Begins an interactive transaction (read-only: the snapshot alone);
    /// returns its id.
    pub fn begin(&self, readonly: bool) -> Result<String, ClientError> {
        let sql = if readonly { "BEGIN READONLY" } else { "BEGIN" };
        let path = format!("/db/request?blob_array{}", self.level_option());
        let json = self.post(&path, &json!([sql]))?;
        json["results"][0]["transaction"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| ClientError::Protocol(format!("BEGIN answered no transaction: {json}")))
    }

    /// Runs statements inside transaction `tx`.
    pub fn request_in(&self, tx: &str, statements: &[String]) -> Result<Vec<Reply>, ClientError> {
        let path = format!("/db/request?blob_array&tx={tx}");
        self.results(self.post(&path, &json!(statements))?)
    }

    /// Commits (or rolls back) transaction `tx`. A commit refused (a
    /// conflict) is `Ok(Some(why))`: nothing of it was applied.
    pub fn end(&self, tx: &str, commit: bool) -> Result<Option<String>, ClientError> {
        let sql = if commit { "COMMIT" } else { "ROLLBACK" };
        let json = self.post(&format!("/db/request?tx={tx}"), &json!([sql]))?;
        Ok(json["results"][0]["error"].as_str().map(String::from))
    }

    /// The user tables from `/db/backup`: SQL text (`sql`) or a SQLite
    /// database; only those of `only`, if any.
    pub fn backup(&self, sql: bool, only: &[String]) -> Result<Vec<u8>, ClientError> {
        let mut path = format!("/db/backup?fmt={}", if sql { "sql" } else { "binary" });
        if !only.is_empty() {
            path.push_str("&tables=");
            path.push_str(&only.join(","));
        }
        let (status, body) = self.send_bytes("GET", &path, None)?;
        if status != 200 {
            let text = String::from_utf8_lossy(&body);
            let message = serde_json::from_str::<Json>(&text)
                .ok()
                .and_then(|j| j["error"].as_str().map(String::from))
                .unwrap_or_else(|| text.trim().to_string());
            return Err(ClientError::Refused { status, message });
        }
        Ok(body)
    }

    /// Loads a SQLite database or SQL text through `/db/load`; what the
    /// daemon answered, or its error.
    pub fn load(&self, data: Vec<u8>) -> Result<String, ClientError> {
        let (status, body) = self.send_bytes("POST", "/db/load", Some(data))?;
        let text = String::from_utf8_lossy(&body).into_owned();
        let json: Json = serde_json::from_str(&text)
            .map_err(|_| ClientError::Protocol(format!("HTTP {status}: {text}")))?;
        if status != 200 {
            let message = json["error"].as_str().unwrap_or(&text).to_string();
            return Err(ClientError::Refused { status, message });
        }
        let r = &json["results"][0];
        match r["error"].as_str() {
            Some(e) => Err(ClientError::Refused {
                status,
                message: e.to_string(),
            }),
            None => Ok(format!(
                "restored: {} rows affected",
                r["rows_affected"].as_u64().unwrap_or(0)
            )),
        }
    }

    /// Runs read-only statements on one snapshot through `/db/query`.
    pub fn query(&self, statements: &[String]) -> Result<Vec<Reply>, ClientError> {
        let path = format!("/db/query?blob_array{}", self.level_option());
        self.results(self.post(&path, &json!(statements))?)
    }

    /// Asks for reads at rqlite's consistency `level` from now on (none:
    /// the daemon's default, weak).
    pub fn set_level(&mut self, level: Option<String>) {
        self.level = level;
    }

    pub fn level(&self) -> Option<&str> {
        self.level.as_deref()
    }

    fn level_option(&self) -> String {
        self.level
            .as_ref()
            .map(|l| format!("&level={l}"))
            .unwrap_or_default()
    }

    /// Checks that a daemon answers and takes this client's requests.
    pub fn ping(&self) -> Result<(), ClientError> {
        let (status, text) = self.send("GET", "/readyz", None)?;
        match status {
            200 => Ok(()),
            401 | 403 => Err(ClientError::Refused {
                status,
                message: serde_json::from_str::<Json>(&text)
                    .ok()
                    .and_then(|j| j["error"].as_str().map(String::from))
                    .unwrap_or(text),
            }),
            _ => Err(ClientError::Refused {
                status,
                message: "the daemon is not ready".into(),
            }),
        }
    }

    fn results(&self, json: Json) -> Result<Vec<Reply>, ClientError> {
        let list = json["results"]
            .as_array()
            .ok_or_else(|| ClientError::Protocol(format!("no results in {json}")))?;
        list.iter().map(reply).collect()
    }
}

/// One request over TCP: a POST of `body`, or a GET; the status and the
/// answer's bytes.
fn tcp_call(
    agent: &ureq::Agent,
    url: &str,
    authorization: Option<&str>,
    body: Option<&[u8]>,
) -> Result<(u16, Vec<u8>), ureq::Error> {
    let mut response = match body {
        Some(b) => {
            let mut req = agent.post(url).header("Content-Type", "application/json");
            if let Some(a) = authorization {
                req = req.header("Authorization", a);
            }
            req.send(b)?
        }
        None => {
            let mut req = agent.get(url);
            if let Some(a) = authorization {
                req = req.header("Authorization", a);
            }
            req.call()?
        }
    };
    let status = response.status().as_u16();
    let bytes = response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE)
        .read_to_vec()?;
    Ok((status, bytes))
}

/// Resolves once `flag` is set.
async fn raised(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn reply(r: &Json) -> Result<Reply, ClientError> {
    if let Some(e) = r.get("error") {
        return Ok(Reply::Error(e.as_str().unwrap_or_default().to_string()));
    }
    if let Some(cols) = r.get("columns") {
        let strings = |v: &Json| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| s.as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let values = r["values"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| row.as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        return Ok(Reply::Rows {
            columns: strings(cols),
            types: strings(&r["types"]),
            values,
        });
    }
    Ok(Reply::Executed {
        last_insert_id: r["last_insert_id"].as_i64().unwrap_or(0),
        rows_affected: r["rows_affected"].as_u64().unwrap_or(0),
    })
}
