//! Where requests come in: a TCP address (plain or TLS) and the Unix
//! socket in the data directory. Each connection is attributed once, as it
//! is accepted (its [`Peer`]), and served by hyper with that peer attached
//! to every request; a slow TLS handshake holds only its own connection.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

use tablix_store::Cancel;

use crate::identity::Peer;

/// How long a TLS client may take to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A bound listening socket.
pub enum Endpoint {
    Tcp {
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
    },
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
}

/// Loads a PEM certificate chain and private key for HTTPS.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("reading the certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading the certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading the private key {}: {e}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl Endpoint {
    pub async fn tcp(addr: SocketAddr, tls: Option<TlsAcceptor>) -> std::io::Result<Endpoint> {
        Ok(Endpoint::Tcp {
            listener: TcpListener::bind(addr).await?,
            tls,
        })
    }

    /// Binds the Unix socket at `path`, replacing a file left by a daemon
    /// that died (the data directory's lock says none runs), connectable
    /// by every user: the peer's credentials decide what it may do. Within
    /// a tokio runtime.
    pub fn unix(path: &Path) -> std::io::Result<Endpoint> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        Ok(Endpoint::Unix {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Endpoint::Tcp { listener, .. } => listener.local_addr().ok(),
            Endpoint::Unix { .. } => None,
        }
    }
}

/// A TCP connection, plain or TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Serves `router` on every endpoint until `shutdown` completes; then
/// stops accepting, lets requests in flight finish for at most `grace`, and
/// returns. A Unix socket's file is removed.
pub async fn serve(
    endpoints: Vec<Endpoint>,
    router: Router,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let graceful = Arc::new(GracefulShutdown::new());
    let mut accepting = Vec::new();
    let mut sockets = Vec::new();
    for endpoint in endpoints {
        if let Endpoint::Unix { path, .. } = &endpoint {
            sockets.push(path.clone());
        }
        accepting.push(tokio::spawn(accept(
            endpoint,
            router.clone(),
            Arc::clone(&graceful),
        )));
    }
    shutdown.await;
    for task in &accepting {
        task.abort();
    }
    for task in accepting {
        let _ = task.await;
    }
    // The accept tasks are gone, and with them every other reference.
    let Ok(graceful) = Arc::try_unwrap(graceful) else {
        return;
    };
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "requests still running {} s after the shutdown began were cut off",
            grace.as_secs()
        );
    }
    for path in sockets {
        let _ = std::fs::remove_file(path);
    }
}

async fn accept(endpoint: Endpoint, router: Router, graceful: Arc<GracefulShutdown>) {
    loop {
        // Each connection is attributed in its own task: a slow user
        // database delays that connection, never the accepting of others.
        let (router, watcher) = (router.clone(), graceful.watcher());
        match &endpoint {
            Endpoint::Tcp { listener, tls } => {
                let (stream, remote) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        backoff(e).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let local = stream.local_addr().unwrap_or(remote);
                let probe = Probe::of(&stream);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let peer = tcp_peer(remote, local, tls.is_some()).await;
                    let Some(acceptor) = tls else {
                        return connection(Conn::Plain(stream), probe, peer, router, watcher).await;
                    };
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            connection(Conn::Tls(Box::new(s)), probe, peer, router, watcher).await
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {remote} failed: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {remote} timed out"),
                    }
                });
            }
            Endpoint::Unix { listener, .. } => {
                let (stream, _) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        backoff(e).await;
                        continue;
                    }
                };
                let Ok(cred) = stream.peer_cred() else {
                    continue;
                };
                let probe = Probe::of(&stream);
                tokio::spawn(async move {
                    let peer = unix_peer(cred.uid(), cred.gid(), cred.pid()).await;
                    connection(Conn::Unix(stream), probe, peer, router, watcher).await
                });
            }
        }
    }
}

/// Who is on the other end of a TCP connection; what may block (the user
/// database, the socket tables) runs off the async workers.
async fn tcp_peer(remote: SocketAddr, local: SocketAddr, tls: bool) -> Peer {
    if let Some(p) = Peer::tcp_cached(remote, local, tls) {
        return p;
    }
    tokio::task::spawn_blocking(move || Peer::tcp(remote, local, tls))
        .await
        .unwrap_or(Peer::Tcp {
            remote,
            owner: None,
            tls,
        })
}

/// Who is on the other end of a Unix-socket connection.
async fn unix_peer(uid: u32, gid: u32, pid: Option<i32>) -> Peer {
    if let Some(p) = Peer::unix_cached(uid, gid, pid) {
        return p;
    }
    tokio::task::spawn_blocking(move || Peer::unix(uid, gid, pid))
        .await
        .unwrap_or_else(|_| {
            Peer::Unix(crate::identity::Local {
                uid,
                gid,
                groups: Vec::new(),
                user: None,
            })
        })
}

/// Accept errors (out of descriptors, mostly) are retried after a pause.
async fn backoff(e: std::io::Error) {
    tracing::warn!("accepting a connection failed: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Cancelled when a connection's client has gone: every request on it
/// links its own cancellation to this.
#[derive(Clone, Debug)]
pub struct ConnectionGone(pub Cancel);

/// How often a connection is checked for a departed client.
const HANGUP_CHECK: Duration = Duration::from_millis(200);

/// A duplicate of a connection's socket, only ever peeked at.
struct Probe(std::os::fd::OwnedFd);

impl Probe {
    /// Duplicates `socket`'s descriptor (which stays registered with the
    /// reactor).
    fn of(socket: &impl std::os::fd::AsFd) -> Option<Probe> {
        socket.as_fd().try_clone_to_owned().ok().map(Probe)
    }

    /// Whether the client has closed its end (or the socket failed).
    fn hung_up(&self) -> bool {
        let mut byte = [0u8; 1];
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.0);
        let flags = nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT;
        match nix::sys::socket::recv(fd, &mut byte, flags) {
            Ok(0) => true,
            Ok(_) => false,
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(_) => true,
        }
    }
}

/// Watches a duplicate of the connection's socket for its client's end of
/// stream. (hyper notices a client that hangs up only when it next reads,
/// and a request that said `Connection: close` is not read again.)
async fn watch_hangup(probe: Probe, gone: Cancel) {
    loop {
        tokio::time::sleep(HANGUP_CHECK).await;
        if probe.hung_up() {
            gone.cancel();
            return;
        }
    }
}

async fn connection(
    conn: Conn,
    probe: Option<Probe>,
    peer: Peer,
    router: Router,
    watcher: Watcher,
) {
    let gone = Cancel::new();
    let hangup = probe.map(|p| tokio::spawn(watch_hangup(p, gone.clone())));
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(ConnectionGone(gone.clone()));
        router.clone().oneshot(req)
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(conn), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("connection ended: {e}");
    }
    if let Some(h) = hangup {
        h.abort();
    }
}
