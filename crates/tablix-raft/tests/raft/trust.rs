//! Who may talk to whom: a node keeps to its own cluster (its id travels
//! with every request), and over mutual TLS only holders of a certificate
//! of the cluster's authority get a word in.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tablix_raft::cluster_id::{self, ClusterIdentity};
use tablix_raft::{ClusterError, ClusterNode, NodeTls, Start, TlsFiles, Transport, TransportError};
use tablix_store::{Stamp, Stamped, Store, Value};

use super::network::{eventually, start_with, stop, try_start_with};
use super::{rows, runtime, sql};

async fn start(
    id: u64,
    dir: &Path,
    how: Start,
    tls: Option<NodeTls>,
) -> Result<(ClusterNode, Arc<Store>), (ClusterError, Arc<Store>)> {
    try_start_with(id, dir, None, |c| {
        c.start = how;
        c.tls = tls;
        c.join_wait = Duration::from_secs(5);
    })
    .await
}

async fn started(
    id: u64,
    dir: &Path,
    how: Start,
    tls: Option<NodeTls>,
) -> (ClusterNode, Arc<Store>) {
    start_with(id, dir, None, |c| {
        c.start = how;
        c.tls = tls;
        c.join_wait = Duration::from_secs(5);
    })
    .await
}

/// Node 1, bootstrapped in `dir` without TLS, once it leads.
async fn lone_leader(dir: &Path) -> (ClusterNode, Arc<Store>) {
    let a = started(1, dir, Start::Bootstrap, None).await;
    eventually("node 1 leads", || a.0.status().leader == Some(1)).await;
    a
}

async fn write(node: &ClusterNode, n: i64, statements: &[&str]) {
    node.propose(Stamped::new(
        Stamp {
            unix_nanos: 1_700_000_000_000_000_000 + n,
            seed: 7_000 + n as u64,
        },
        sql(statements),
    ))
    .await
    .unwrap();
}

#[test]
fn a_node_keeps_to_its_cluster_and_a_data_directory_of_another_is_not_joined() {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let a = started(1, dirs[0].path(), Start::Bootstrap, None).await;
        let b = started(1, dirs[1].path(), Start::Bootstrap, None).await;
        eventually("both lead", || {
            a.0.status().leader == Some(1) && b.0.status().leader == Some(1)
        })
        .await;
        let (ida, idb) = (
            a.0.status().cluster_id.unwrap(),
            b.0.status().cluster_id.unwrap(),
        );
        assert_ne!(ida, idb, "two bootstraps drew one id");
        assert_eq!(
            std::fs::read_to_string(dirs[0].path().join(cluster_id::FILE))
                .unwrap()
                .trim(),
            ida
        );

        // A request naming cluster B is turned away by A's service.
        let foreign = ClusterIdentity::none();
        foreign.adopt(&idb).unwrap();
        let asked = Transport::with(None, foreign)
            .status(&a.0.addr().to_string(), Duration::from_secs(2))
            .await;
        match asked {
            Err(TransportError::Refused {
                status, message, ..
            }) => {
                assert_eq!(status, 409);
                assert!(
                    message.contains(&ida) && message.contains(&idb),
                    "{message}"
                );
            }
            other => panic!("A answered cluster B's request: {other:?}"),
        }

        // A's leader does not add B's node.
        let refused = a.0.add(2, &b.0.addr().to_string(), true).await.unwrap_err();
        assert!(refused.to_string().contains("another cluster"), "{refused}");
        assert_eq!(a.0.status().members.len(), 1);

        // B's node, restarted with --join A, refuses: its data directory
        // is cluster B's.
        let b_addr = b.0.addr();
        stop(b.0, b.1).await;
        let join_a = Start::Join(a.0.addr().to_string());
        let (e, store) = try_start_with(1, dirs[1].path(), Some(b_addr), |c| c.start = join_a)
            .await
            .err()
            .expect("a node of cluster B joined cluster A");
        assert!(e.to_string().contains("another cluster"), "{e}");
        store.close().unwrap();

        // A new node takes A's id when it joins, and one that holds B's id
        // (a data directory B's node left) is refused before it asks.
        let c = started(3, dirs[2].path(), Start::Join(a.0.addr().to_string()), None).await;
        assert_eq!(c.0.status().cluster_id.as_deref(), Some(ida.as_str()));
        std::fs::copy(
            dirs[1].path().join(cluster_id::FILE),
            dirs[3].path().join(cluster_id::FILE),
        )
        .unwrap();
        let (e, store) = start(4, dirs[3].path(), Start::Join(a.0.addr().to_string()), None)
            .await
            .err()
            .expect("a data directory of cluster B joined cluster A");
        assert!(e.to_string().contains("belongs to cluster"), "{e}");
        store.close().unwrap();
        assert_eq!(a.0.status().members.len(), 2);
        stop(c.0, c.1).await;
        stop(a.0, a.1).await;
    });
}

#[test]
fn a_node_turns_away_nodes_that_apply_entries_as_another_version() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let a = lone_leader(dirs[0].path()).await;
        let id = a.0.status().cluster_id.unwrap();
        let addr = a.0.addr().to_string();
        let ours = tablix_store::APPLY_VERSION;
        let ask = |identity: ClusterIdentity, version: u32| {
            let addr = addr.clone();
            async move {
                Transport::with(None, identity)
                    .applying(version)
                    .status(&addr, Duration::from_secs(2))
                    .await
            }
        };
        let member = || {
            let m = ClusterIdentity::none();
            m.adopt(&id).unwrap();
            m
        };
        // A member of the cluster on another build, and a node that has
        // no cluster yet (joining) on another build: both refused, saying
        // which versions.
        let joining = || ClusterIdentity::load(&dirs[1].path().join(cluster_id::FILE)).unwrap();
        for (who, identity) in [("a member", member()), ("a joining node", joining())] {
            match ask(identity, ours + 1).await {
                Err(TransportError::Refused {
                    status, message, ..
                }) => {
                    assert_eq!(status, 409, "{who}");
                    assert!(
                        message.contains(&format!("version {ours}"))
                            && message.contains(&format!("version {}", ours + 1)),
                        "{who}: {message}"
                    );
                }
                other => panic!(
                    "{who} of apply version {} was answered: {other:?}",
                    ours + 1
                ),
            }
        }
        // The same requests at this build's version are answered.
        ask(member(), ours).await.unwrap();
        ask(joining(), ours).await.unwrap();
        assert_eq!(a.0.status().members.len(), 1);
        stop(a.0, a.1).await;
    });
}

/// A certificate authority and what it signs.
struct Authority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Authority {
            issuer: rcgen::Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// Files for a node reached at 127.0.0.1, in `dir`.
    fn node(&self, dir: &Path, name: &str) -> TlsFiles {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            ca: dir.join("ca.crt"),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        std::fs::write(&files.ca, &self.pem).unwrap();
        files
    }
}

#[test]
fn a_joining_node_takes_the_cluster_id_only_when_the_leader_adds_it() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let a = lone_leader(dirs[0].path()).await;
        // A node that says it is node 1, from another address: the leader
        // refuses to add it. It learned the cluster's id while asking, but
        // must not hold it: with the id, the leader's replication to the
        // member it claims to be would reach its empty log.
        let refused = start(1, dirs[1].path(), Start::Join(a.0.addr().to_string()), None).await;
        let Err((e, store)) = refused else {
            panic!("a second node 1 was let in");
        };
        assert!(e.to_string().contains("member already"), "{e}");
        assert!(
            !dirs[1].path().join(cluster_id::FILE).exists(),
            "the refused node kept the cluster's id"
        );
        store.close().unwrap();
        stop(a.0, a.1).await;
    });
}

#[test]
fn nodes_over_mutual_tls_replicate_and_turn_away_parties_without_the_clusters_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let other_pki = tempfile::tempdir().unwrap();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let ca = Authority::new("tablix test cluster");
    let tls: Vec<NodeTls> = (1..=3)
        .map(|n| NodeTls::load(&ca.node(pki.path(), &format!("node{n}"))).unwrap())
        .collect();
    let stranger =
        NodeTls::load(&Authority::new("someone else").node(other_pki.path(), "x")).unwrap();
    runtime().block_on(async {
        let first = started(1, dirs[0].path(), Start::Bootstrap, Some(tls[0].clone())).await;
        let seed = first.0.addr().to_string();
        eventually("node 1 to lead", || first.0.status().leader == Some(1)).await;
        let mut nodes = vec![first];
        for n in 2..=3u64 {
            let i = n as usize - 1;
            nodes.push(
                started(
                    n,
                    dirs[i].path(),
                    Start::Join(seed.clone()),
                    Some(tls[i].clone()),
                )
                .await,
            );
        }
        // Written through a follower: forwarded over TLS, applied
        // everywhere.
        write(
            &nodes[2].0,
            1,
            &["CREATE TABLE t(x)", "INSERT INTO t VALUES (42)"],
        )
        .await;
        for (_, store) in &nodes {
            let store = Arc::clone(store);
            eventually("the row on every node", move || {
                store
                    .query(
                        &tablix_store::Principal::root(),
                        &[tablix_store::Statement::new("SELECT x FROM t")],
                    )
                    .map(|r| {
                        matches!(&r[0].result, tablix_store::StatementResult::Rows(r)
                            if r.values == vec![vec![Value::Integer(42)]])
                    })
                    .unwrap_or(false)
            })
            .await;
        }

        // Plain HTTP gets no answer, and neither does a certificate of
        // another authority; a node's own certificate does.
        let plain = Transport::new().status(&seed, Duration::from_secs(2)).await;
        assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
        let foreign = Transport::with(Some(&stranger), ClusterIdentity::none())
            .status(&seed, Duration::from_secs(2))
            .await;
        assert!(
            matches!(
                foreign,
                Err(TransportError::Unreachable { .. } | TransportError::NoAnswer { .. })
            ),
            "a certificate of another authority was answered: {foreign:?}"
        );
        let own = Transport::with(Some(&tls[1]), ClusterIdentity::none())
            .status(&seed, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(own.members.len(), 3);

        // A node with another authority's certificate cannot join.
        let refused = start(
            4,
            dirs[3].path(),
            Start::Join(seed.clone()),
            Some(stranger.clone()),
        )
        .await;
        match refused {
            Ok(_) => panic!("a node without the cluster's certificate joined"),
            Err((e, store)) => {
                assert!(!e.to_string().is_empty());
                store.close().unwrap();
            }
        }
        assert_eq!(nodes[0].0.status().members.len(), 3);
        assert_eq!(
            rows(&nodes[1].1, "SELECT x FROM t"),
            vec![vec![Value::Integer(42)]]
        );
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

#[test]
fn tls_files_that_are_missing_or_wrong_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let files = Authority::new("ca").node(dir.path(), "n");
    let missing = TlsFiles {
        cert: dir.path().join("nowhere.crt"),
        ..files.clone()
    };
    let e = NodeTls::load(&missing).unwrap_err();
    assert!(e.to_string().contains("nowhere.crt"), "{e}");
    std::fs::write(dir.path().join("empty.pem"), "not pem\n").unwrap();
    let no_ca = TlsFiles {
        ca: dir.path().join("empty.pem"),
        ..files.clone()
    };
    let e = NodeTls::load(&no_ca).unwrap_err();
    assert!(e.to_string().contains("empty.pem"), "{e}");
    let swapped = TlsFiles {
        key: files.cert.clone(),
        ..files
    };
    assert!(NodeTls::load(&swapped).is_err());
}
