//! Mutual TLS between nodes: every node has a certificate and key signed
//! by the cluster's certificate authority, serves its raft service over
//! TLS asking each client for a certificate of that authority, and shows
//! its own when it calls another node. A party without one is turned away
//! in the handshake, before it can send a byte of HTTP.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How long a TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// The files of a node's TLS identity.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The authority every node's certificate is signed by (PEM).
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    #[error("{0}")]
    Config(String),
}

/// A node's TLS configuration, for serving and for calling.
#[derive(Clone)]
pub struct NodeTls {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeTls")
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |message: String| TlsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl NodeTls {
    /// Loads the node's certificate, key and authority.
    pub fn load(files: &TlsFiles) -> Result<NodeTls, TlsError> {
        let chain = certificates(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::Read {
            path: files.key.clone(),
            message: e.to_string(),
        })?;
        let mut roots = RootCertStore::empty();
        for ca in certificates(&files.ca)? {
            roots.add(ca).map_err(|e| {
                TlsError::Config(format!(
                    "{} is not a usable authority: {e}",
                    files.ca.display()
                ))
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| TlsError::Config(format!("checking peers' certificates: {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| {
                TlsError::Config(format!(
                    "{} and {} do not make a TLS identity: {e}",
                    files.cert.display(),
                    files.key.display()
                ))
            })?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| TlsError::Config(format!("this node's client identity: {e}")))?;
        Ok(NodeTls {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// Serves `router` over TLS on `listener` until `stopped` completes; then
/// stops accepting and cuts the connections it served.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    tls: NodeTls,
    router: axum::Router,
    stopped: impl std::future::Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stopped);
    loop {
        let (stream, remote) = tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!("the raft service could not accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            // Reap finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!("refused a raft connection from {remote}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake with {remote} timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!("raft connection from {remote}: {e}");
            }
        });
    }
    connections.abort_all();
}
