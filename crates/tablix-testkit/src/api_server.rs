//! A store and the HTTP API serving it, as the daemon serves them, for
//! tests that talk to the API as clients do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tablix_api::{ApiConfig, AuthFile, Endpoint, ServerInfo, router, serve, tls_acceptor};
use tablix_store::{Store, StoreConfig};

/// How a test server is set up; the default is the daemon's.
#[derive(Default)]
pub struct Setup {
    /// Largest request body (`--body-limit`); 1 MiB by default.
    pub body_limit: Option<usize>,
    /// API users, in rqlite's auth-file format (`--auth`).
    pub auth: Option<String>,
    /// Serve TLS with this PEM certificate chain and key.
    pub tls: Option<(String, String)>,
    /// User SQL's readers (`--readers`).
    pub readers: Option<usize>,
    /// Also serve the data directory's Unix socket, `DATA/tablix.sock`.
    pub socket: bool,
}

/// A store in a temporary data directory and the API serving it on
/// 127.0.0.1 at an ephemeral port, until dropped.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    /// The Unix socket, when [`Setup::socket`] asked for it.
    pub socket: Option<PathBuf>,
    /// The temporary directory; the data directory is `data` in it.
    pub dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

impl ApiServer {
    pub fn start(setup: Setup) -> ApiServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = StoreConfig::new(dir.path().join("data"));
        if let Some(n) = setup.readers {
            config.readers = n;
        }
        let store = Arc::new(Store::open(config).expect("opening the store"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let tls = setup.tls.as_ref().map(|(cert, key)| {
            let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&c, cert).expect("writing the certificate");
            std::fs::write(&k, key).expect("writing the key");
            tls_acceptor(&c, &k).expect("a TLS acceptor")
        });
        let tcp = rt
            .block_on(Endpoint::tcp(
                "127.0.0.1:0".parse().expect("an address"),
                tls,
            ))
            .expect("binding 127.0.0.1");
        let addr = tcp.local_addr().expect("the bound address");
        let mut endpoints = vec![tcp];
        let socket = setup.socket.then(|| dir.path().join("data/tablix.sock"));
        if let Some(path) = &socket {
            let _in_runtime = rt.enter();
            endpoints.push(Endpoint::unix(path).expect("binding the Unix socket"));
        }
        let info = ServerInfo {
            version: "test".into(),
            pid: std::process::id(),
            http_addr: addr.to_string(),
            pcache: "sqlite".into(),
            socket: socket.as_ref().map(|p| p.display().to_string()),
            mount: None,
            tls: setup.tls.is_some(),
        };
        let auth = match &setup.auth {
            Some(text) => AuthFile::parse(text.as_bytes()).expect("an auth file"),
            None => AuthFile::default(),
        };
        let app = router(
            Arc::clone(&store),
            info,
            ApiConfig {
                body_limit: setup.body_limit.unwrap_or(1 << 20),
                ..ApiConfig::default()
            },
            Arc::new(auth),
        );
        rt.spawn(serve(
            endpoints,
            app,
            std::future::pending(),
            Duration::from_secs(1),
        ));
        ApiServer {
            addr,
            store,
            socket,
            dir,
            _rt: rt,
        }
    }
}
