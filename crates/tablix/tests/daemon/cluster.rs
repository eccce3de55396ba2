//! Three daemons on loopback as one cluster, each mounting the replicated
//! file system: files written through any mount read back the same on
//! every mount (kernel caches invalidated), SQL through any node's API is
//! seen by all, the cluster goes on when the leader is killed with
//! SIGKILL, the killed node catches up when it restarts, and `tablix fsck`
//! is clean on every node after they stop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tablix_testkit::command::Limited;

use crate::{BIN, Daemon, rows};

/// A free loopback address for a node's raft service, which keeps it
/// across restarts, so it is chosen before the node starts. The port lies
/// below the kernel's ephemeral range: a port bound with port 0 and
/// released would be free for every socket that binds port 0 (the
/// daemons' HTTP services of this and the tests beside it) until the
/// node binds it.
fn free_raft_addr() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000, low.saturating_sub(10_000).max(1));
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = first + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let addr = format!("127.0.0.1:{port}");
        if std::net::TcpListener::bind(&addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port between {first} and {low}");
}

pub(crate) struct Node {
    pub id: u64,
    pub data: PathBuf,
    pub mnt: PathBuf,
    pub raft: String,
}

impl Node {
    /// Nodes 1 to 3 with data directories and mount points in `dir`, each
    /// on a raft address of its own.
    pub fn three(dir: &Path) -> Vec<Node> {
        (1..=3u64)
            .map(|id| {
                let mnt = dir.join(format!("mnt{id}"));
                std::fs::create_dir(&mnt).unwrap();
                Node {
                    id,
                    data: dir.join(format!("data{id}")),
                    mnt,
                    raft: free_raft_addr(),
                }
            })
            .collect()
    }

    /// Starts `nodes` as one cluster, each with `extra` flags: the first
    /// founds it, the others join through it.
    pub fn start_cluster(nodes: &[Node], extra: &[&str]) -> Vec<Daemon> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut how = match i {
                    0 => vec!["--bootstrap"],
                    _ => vec!["--join", nodes[0].raft.as_str()],
                };
                how.extend_from_slice(extra);
                n.start(&how)
            })
            .collect()
    }

    pub fn start(&self, how: &[&str]) -> Daemon {
        let id = self.id.to_string();
        let mut args = vec!["--node-id", &id, "--raft", &self.raft];
        args.extend_from_slice(how);
        args.push(self.mnt.to_str().unwrap());
        Daemon::start_env(&self.data, &args, &[("TABLIX_LOG", "error")])
    }
}

/// The leader the node at `raft` knows of.
pub(crate) fn leader(raft: &str) -> Option<u64> {
    let out = tablix_testkit::command::output_within(
        std::process::Command::new(BIN).args(["cluster", "--raft", raft, "status", "--json"]),
        b"",
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    status["leader"].as_u64()
}

/// Waits until every node sees node `id` lead. A loaded machine may
/// elect another node in between (a heartbeat late by an election
/// timeout); leadership is then handed back, since the checks that follow
/// know which node leads.
fn led_by(nodes: &[Node], id: u64) {
    eventually(&format!("node {id} to lead all three"), || {
        let seen: Vec<Option<u64>> = nodes.iter().map(|n| leader(&n.raft)).collect();
        if seen.iter().all(|l| *l == Some(id)) {
            return true;
        }
        if let Some(Some(other)) = seen.iter().find(|l| l.is_some_and(|l| l != id)) {
            let _ = tablix_testkit::command::output_within(
                std::process::Command::new(BIN).args([
                    "cluster",
                    "--raft",
                    &nodes[*other as usize - 1].raft,
                    "transfer-leader",
                    &id.to_string(),
                ]),
                b"",
            );
        }
        false
    });
}

pub(crate) fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Like [`eventually`], but within 5 s: well under the 10 s a kernel
/// keeps a mount's attributes and entries, so that only the daemon
/// invalidating them makes a change made elsewhere show that soon.
fn soon(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 5 s (a kernel cache not invalidated?)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn three_daemons_serve_one_file_system_and_survive_kill_9_of_the_leader() {
    tablix_testkit::require::fuse(
        "three_daemons_serve_one_file_system_and_survive_kill_9_of_the_leader",
    );
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    // Node 3's mount reads at level weak: a file written through another
    // mount is there at once when that write returned.
    let mut daemons: Vec<Option<Daemon>> = vec![
        Some(nodes[0].start(&["--bootstrap"])),
        Some(nodes[1].start(&["--join", &nodes[0].raft])),
        Some(nodes[2].start(&["--join", &nodes[0].raft, "--mount-read", "weak"])),
    ];
    led_by(&nodes, 1);

    // rqlite's /nodes: every voter reachable, node 1 the leader, each
    // with its API address.
    let d2 = daemons[1].as_ref().unwrap();
    let nodes_seen: serde_json::Value = {
        let mut r = crate::http()
            .get(format!("http://{}/nodes?ver=2", d2.addr))
            .call()
            .unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    let listed = nodes_seen["nodes"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{nodes_seen}");
    for n in listed {
        assert_eq!(n["reachable"], true, "{nodes_seen}");
        assert_eq!(n["leader"], n["id"] == "1", "{nodes_seen}");
        assert!(
            n["api_addr"]
                .as_str()
                .unwrap()
                .starts_with("http://127.0.0.1:"),
            "{nodes_seen}"
        );
    }
    // A file written through a follower's mount reads back on every one.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(nodes[1].mnt.join("f"), &body).unwrap();
    for n in &nodes {
        eventually("the file on every mount", || {
            read(&n.mnt.join("f")).as_ref() == Some(&body)
        });
    }
    // Its metadata too: mode, owner, size, links, times, through the
    // leader's mount and the followers'.
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        std::fs::set_permissions(
            nodes[0].mnt.join("f"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let meta = |n: &Node| {
            let m = std::fs::metadata(n.mnt.join("f")).unwrap();
            (
                m.mode(),
                m.uid(),
                m.gid(),
                m.size(),
                m.nlink(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime_nsec(),
            )
        };
        soon("the same metadata on every mount", || {
            let first = meta(&nodes[0]);
            first.0 & 0o777 == 0o640 && nodes.iter().all(|n| meta(n) == first)
        });
    }
    // Changed through another mount after every kernel cached it: each
    // kernel is told, and shows the new content and size.
    std::fs::write(nodes[2].mnt.join("f"), b"shorter now").unwrap();
    for n in &nodes {
        soon("the changed file on every mount", || {
            read(&n.mnt.join("f")).as_deref() == Some(&b"shorter now"[..])
        });
    }
    for i in 0..20 {
        let name = format!("at-once-{i}");
        std::fs::write(nodes[1].mnt.join(&name), name.as_bytes()).unwrap();
        assert_eq!(
            read(&nodes[2].mnt.join(&name)).as_deref(),
            Some(name.as_bytes()),
            "a weak read on node 3's mount missed a write that returned on node 2's"
        );
    }
    std::fs::remove_file(nodes[0].mnt.join("f")).unwrap();
    for n in &nodes {
        soon("the file gone from every mount", || {
            !n.mnt.join("f").exists()
        });
    }

    // SQL through one node's API, read through another's.
    let d3 = daemons[2].as_ref().unwrap();
    let r = d3.post(
        "/db/execute",
        r#"["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]"#,
    );
    assert!(r["results"][1]["rows_affected"] == 1, "{r}");
    let d1 = daemons[0].as_ref().unwrap();
    eventually("the row on node 1", || {
        rows(d1, "SELECT count(*) FROM t") == vec![vec![serde_json::json!(1)]]
    });
    // A linearizable read on one follower right after a write through the
    // other sees it.
    for n in 2..=5 {
        let r = d3.post("/db/execute", &format!(r#"["INSERT INTO t VALUES ({n})"]"#));
        assert_eq!(r["results"][0]["rows_affected"], 1, "{r}");
        let q: serde_json::Value = {
            let mut r = crate::http()
                .get(format!(
                    "http://{}/db/query?level=linearizable&q=SELECT%20count(*)%20FROM%20t",
                    d2.addr
                ))
                .call()
                .unwrap();
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
        };
        assert_eq!(q["results"][0]["values"][0][0], n, "{q}");
    }
    led_by(&nodes, 1);
    // rqlite's redirect: a follower answers 301 to the leader's API, with
    // the path and query kept; a read at level none stays local.
    let no_follow: ureq::Agent = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into();
    let r = no_follow
        .post(format!("http://{}/db/execute?redirect&pretty", d2.addr))
        .send(r#"["INSERT INTO t VALUES (99)"]"#)
        .unwrap();
    assert_eq!(r.status(), 301);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    assert_eq!(
        location,
        format!("http://{}/db/execute?redirect&pretty", d1.addr)
    );
    let r = no_follow
        .get(format!(
            "http://{}/db/query?redirect&level=none&q=SELECT%201",
            d2.addr
        ))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    // rqlite's freshness: a follower's level-none read is stale when the
    // leader was heard from longer ago than the bound.
    let fresh = |bound: &str| -> serde_json::Value {
        let mut r = crate::http()
            .get(format!(
                "http://{}/db/query?level=none&freshness={bound}&q=SELECT%20count(*)%20FROM%20t",
                d2.addr
            ))
            .call()
            .unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    let stale = fresh("1ns");
    assert!(
        stale["error"].as_str().unwrap().starts_with("stale read"),
        "{stale}"
    );
    let ok = fresh("10s");
    assert_eq!(ok["results"][0]["values"][0][0], 5, "{ok}");

    // The shell's cluster dot-commands, through any node.
    led_by(&nodes, 1);
    let out = std::process::Command::new(BIN)
        .args(["sql", "--addr", &d3.addr, ".nodes", ".leader"])
        .output_limited();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains("voter")).count(),
        3,
        "{text}"
    );
    assert!(text.contains("node 1 (api http://"), "{text}");

    // The leader dies; a write through another mount goes on.
    // A shell talking to the leader goes on with another node.
    // (An election may be under way on a loaded machine: wait it out.)
    let mut dead = 0;
    eventually("a leader", || {
        dead = leader(&nodes[1].raft).unwrap_or(0);
        dead != 0
    });
    let dead_api = daemons[dead as usize - 1].as_ref().unwrap().addr.clone();
    let mut shell = std::process::Command::new(BIN)
        .args(["sql", "--addr", &dead_api])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It learns the cluster's nodes when it starts (its input, read
    // whole, runs after the leader is gone).
    std::thread::sleep(Duration::from_secs(2));
    // Writers through the other two nodes keep inserting while the leader
    // dies under them; what they were told is applied must survive.
    d3.post("/db/execute", r#"["CREATE TABLE w(x INTEGER)"]"#);
    let stop_writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = nodes
        .iter()
        .filter(|n| n.id != dead)
        .map(|n| {
            let api = daemons[n.id as usize - 1].as_ref().unwrap().addr.clone();
            let stop = std::sync::Arc::clone(&stop_writing);
            let base = n.id as i64 * 1_000_000;
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(15)))
                    .build()
                    .into();
                let mut acknowledged = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let body = format!(r#"[["INSERT INTO w VALUES (?)", {}]]"#, base + i);
                    let answer = agent
                        .post(format!("http://{api}/db/execute"))
                        .header("Content-Type", "application/json")
                        .send(body)
                        .ok()
                        .and_then(|mut r| r.body_mut().read_to_string().ok())
                        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
                    if answer.is_some_and(|a| a["results"][0]["rows_affected"] == 1) {
                        acknowledged.push(base + i);
                    }
                }
                acknowledged
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let survivor = nodes.iter().find(|n| n.id != dead).unwrap();
    if let Some(mut d) = daemons[dead as usize - 1].take() {
        d.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = d.child.wait();
    }
    let killed = Instant::now();
    std::fs::write(survivor.mnt.join("after"), b"written after the leader died").unwrap();
    eprintln!(
        "first write after killing the leader: {:?}",
        killed.elapsed()
    );
    {
        use std::io::Write as _;
        let mut to_shell = shell.stdin.take().unwrap();
        writeln!(
            to_shell,
            "CREATE TABLE s(x);\nINSERT INTO s VALUES (1), (2);\nSELECT 'rows:' || count(*) FROM s;"
        )
        .unwrap();
    }
    let out = shell.wait_with_output().unwrap();
    let (said, told) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(said.contains("rows:2"), "{said}\n{told}");
    assert!(told.contains("going on with"), "{told}");
    // It comes back (clearing its stale mount) and catches up.
    let back = &nodes[dead as usize - 1];
    daemons[dead as usize - 1] = Some(back.start(&[]));
    eventually("the restarted node caught up", || {
        read(&back.mnt.join("after")).as_deref() == Some(&b"written after the leader died"[..])
    });

    // Every insert a writer was told is applied is on every node.
    std::thread::sleep(Duration::from_millis(500));
    stop_writing.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged: Vec<i64> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    acknowledged.sort();
    assert!(
        acknowledged.len() > 10,
        "{} inserts acknowledged",
        acknowledged.len()
    );
    let expected = acknowledged.len();
    for d in daemons.iter().flatten() {
        eventually("every acknowledged insert on every node", || {
            let held: Vec<i64> = rows(d, "SELECT x FROM w ORDER BY x")
                .into_iter()
                .filter_map(|r| r[0].as_i64())
                .collect();
            acknowledged.iter().all(|x| held.binary_search(x).is_ok())
        });
        let dup = rows(d, "SELECT count(*) - count(DISTINCT x) FROM w");
        assert_eq!(
            dup,
            vec![vec![serde_json::json!(0)]],
            "an insert applied twice"
        );
    }
    eprintln!("{expected} inserts acknowledged across the leader's death, none lost");
    for d in daemons.into_iter().flatten() {
        d.stop();
    }
    for n in &nodes {
        let (code, out) = crate::fsck(&n.data, &[]);
        assert_eq!(code, Some(0), "fsck of node {}:\n{out}", n.id);
        assert!(out.contains("clean"), "{out}");
    }
}

/// Starts node `i + 1` of a cluster whose raft services listen on `raft`,
/// with its data in `dir/data{i}` and `extra` flags (how it comes in).
fn node(dir: &Path, raft: &[String], i: usize, extra: &[&str]) -> Daemon {
    let id = (i + 1).to_string();
    let mut args: Vec<&str> = vec!["--node-id", &id, "--raft", &raft[i]];
    args.extend(extra);
    Daemon::start_env(
        &dir.join(format!("data{i}")),
        &args,
        &[("TABLIX_LOG", "error")],
    )
}

/// A certificate authority and, for each of `names`, a certificate it
/// signed for 127.0.0.1, in `dir`: (cert, key, ca) files per name.
pub(crate) fn certificates(dir: &Path, names: &[&str]) -> Vec<(PathBuf, PathBuf, PathBuf)> {
    let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test cluster");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = params.self_signed(&ca_key).unwrap();
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    names
        .iter()
        .map(|name| {
            let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
            params.extended_key_usages = vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            let (c, k) = (
                dir.join(format!("{name}.crt")),
                dir.join(format!("{name}.key")),
            );
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (c, k, ca.clone())
        })
        .collect()
}

#[test]
fn daemons_over_mutual_tls_form_a_cluster_that_tablix_cluster_reaches_only_with_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let certs = certificates(&pki, &["node1", "node2", "operator"]);
    let raft: Vec<String> = (0..2).map(|_| free_raft_addr()).collect();
    let tls_args = |i: usize| {
        vec![
            "--raft-cert".to_string(),
            certs[i].0.display().to_string(),
            "--raft-key".to_string(),
            certs[i].1.display().to_string(),
            "--raft-ca".to_string(),
            certs[i].2.display().to_string(),
        ]
    };
    let start = |i: usize, how: &[&str]| {
        let tls = tls_args(i);
        let mut extra: Vec<&str> = how.to_vec();
        extra.extend(tls.iter().map(String::as_str));
        node(dir.path(), &raft, i, &extra)
    };
    let d1 = start(0, &["--bootstrap"]);
    let d2 = start(1, &["--join", &raft[0]]);
    let status = |with_certificate: bool| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["cluster", "--raft", &raft[1], "status", "--json"]);
        if with_certificate {
            cmd.args(tls_args(2));
        }
        cmd.output_limited()
    };
    eventually("two voters seen through TLS", || {
        let out = status(true);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|s| s["members"].as_array().is_some_and(|m| m.len() == 2))
    });
    let refused = status(false);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--raft-cert"), "{said}");
    // SQL through the follower reaches the leader over TLS.
    let r = d2.post(
        "/db/execute",
        r#"["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]"#,
    );
    assert_eq!(r["results"][1]["rows_affected"], 1, "{r}");
    eventually("the row on node 1", || {
        rows(&d1, "SELECT count(*) FROM t") == vec![vec![serde_json::json!(1)]]
    });
    d2.stop();
    d1.stop();
}

#[test]
fn the_shell_at_its_prompt_goes_on_with_another_node_when_its_node_dies() {
    let dir = tempfile::tempdir().unwrap();
    let raft: Vec<String> = (0..3).map(|_| free_raft_addr()).collect();
    let start = |i: usize, how: &[&str]| node(dir.path(), &raft, i, how);
    let d1 = start(0, &["--bootstrap"]);
    let d2 = start(1, &["--join", &raft[0]]);
    let mut d3 = start(2, &["--join", &raft[0]]);
    eventually("three voters", || {
        let r: Option<serde_json::Value> = crate::http()
            .get(format!("http://{}/nodes?ver=2", d1.addr))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json().ok());
        r.is_some_and(|r| {
            r["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().filter(|n| n["voter"] == true).count() == 3)
        })
    });
    let mut child = crate::in_terminal(&format!("{BIN} sql --addr {}", d3.addr), dir.path());
    let mut stdin = child.stdin.take().unwrap();
    // The shell learns the cluster's nodes when it starts.
    std::thread::sleep(Duration::from_millis(1500));
    {
        use std::io::Write as _;
        writeln!(stdin, "CREATE TABLE p(x);").unwrap();
        // Committed (node 1 has the table) and answered before its node
        // goes.
        eventually("the table on node 1", || {
            rows(&d1, "SELECT count(*) FROM sqlite_master WHERE name = 'p'")
                == vec![vec![serde_json::json!(1)]]
        });
        std::thread::sleep(Duration::from_millis(300));
        d3.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = d3.child.wait();
        crate::type_lines(
            &mut stdin,
            &[
                "INSERT INTO p VALUES (1);",
                "SELECT 'rows:' || count(*) FROM p;",
                ".quit",
            ],
            Duration::from_millis(500),
        );
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let screen = crate::screen(&out.stdout);
    assert!(screen.contains("going on with"), "{screen}");
    assert!(screen.contains("rows:1"), "{screen}");
    d2.stop();
    d1.stop();
}

/// The rows of `q` on node `d`'s own state (read level none).
fn local_rows(d: &Daemon, q: &str) -> serde_json::Value {
    let mut r = crate::http()
        .get(format!("http://{}/db/query", d.addr))
        .query("q", q)
        .query("level", "none")
        .call()
        .unwrap();
    let v: serde_json::Value = r.body_mut().read_json().unwrap();
    v["results"][0]["values"].clone()
}

#[test]
fn a_daemon_without_cluster_flags_starts_a_cluster_from_its_data_and_no_data_changes_sides() {
    let dir = tempfile::tempdir().unwrap();
    let raft: Vec<String> = (0..2).map(|_| free_raft_addr()).collect();
    // A daemon as the README starts it, killed once its second write is
    // in its own log and before that write is applied.
    let mut plain = Daemon::start_env(
        &dir.path().join("data0"),
        &[],
        &[("TABLIX_KILL_AT", "synced:2")],
    );
    let r = plain.post("/db/execute", r#"["CREATE TABLE t(x)"]"#);
    assert!(r["results"][0].get("error").is_none(), "{r}");
    let _ = crate::http()
        .post(format!("http://{}/db/execute", plain.addr))
        .header("Content-Type", "application/json")
        .send(r#"["INSERT INTO t VALUES (42)"]"#);
    plain.die(true);
    // Its data directory bootstraps a cluster with everything its log
    // held.
    let d1 = node(dir.path(), &raft, 0, &["--bootstrap"]);
    assert_eq!(
        rows(&d1, "SELECT x FROM t"),
        vec![vec![serde_json::json!(42)]]
    );
    let r = d1.post("/db/execute", r#"["INSERT INTO t VALUES (43)"]"#);
    assert_eq!(r["results"][0]["rows_affected"], 1, "{r}");
    // A node that joins gets the state the cluster started from.
    let d2 = node(dir.path(), &raft, 1, &["--join", &raft[0]]);
    eventually("both rows on node 2", || {
        local_rows(&d2, "SELECT x FROM t ORDER BY x") == serde_json::json!([[42], [43]])
    });
    // Another daemon's data never joins (it would be replaced), nor
    // resumes as a member it never was.
    let other = dir.path().join("other");
    let d = Daemon::start(&other, &[]);
    d.post("/db/execute", r#"["CREATE TABLE mine(x)"]"#);
    d.stop();
    let third = free_raft_addr();
    for how in [vec!["--join", raft[0].as_str()], vec![]] {
        let mut args = vec!["--node-id", "3", "--raft", third.as_str()];
        args.extend(how.iter().copied());
        let refused = Daemon::try_start(&other, &args).err().unwrap_or_default();
        assert!(
            refused.contains("ran without cluster flags"),
            "{how:?}: {refused}"
        );
        assert!(
            !other.join(tablix_raft::LOG_DIR).exists(),
            "{how:?}: a refused start left a raft log behind"
        );
    }
    // A member's data directory never runs without its cluster flags.
    d2.stop();
    let refused = Daemon::try_start(&dir.path().join("data1"), &[])
        .err()
        .unwrap_or_default();
    assert!(refused.contains("node of a tablix cluster"), "{refused}");
    d1.stop();
}

#[test]
fn a_join_through_a_member_that_is_down_says_why_it_waits_and_gives_up_after_the_join_wait() {
    let dir = tempfile::tempdir().unwrap();
    // Free addresses with nothing listening: the member is down.
    let dead = free_raft_addr();
    let raft = free_raft_addr();
    let began = Instant::now();
    let refused = Daemon::try_start(
        &dir.path().join("data"),
        &[
            "--node-id",
            "2",
            "--raft",
            &raft,
            "--join",
            &dead,
            "--join-wait",
            "2",
        ],
    )
    .err()
    .unwrap_or_default();
    assert!(
        refused.contains(&format!("cannot join through {dead} yet")),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("gave up joining through {dead} after "))
            && refused.contains("unreachable"),
        "{refused}"
    );
    // The default wait is a minute; --join-wait ended this one.
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn tablix_cluster_reports_a_refused_change_and_an_unreachable_node_as_errors_of_one_shape() {
    let dir = tempfile::tempdir().unwrap();
    let raft = vec![free_raft_addr()];
    let d1 = node(dir.path(), &raft, 0, &["--bootstrap"]);
    eventually("node 1 to lead", || leader(&raft[0]) == Some(1));
    let cluster = |args: &[&str]| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["cluster", "--raft"]).args(args);
        cmd.output_limited()
    };
    let refused = cluster(&[&raft[0], "remove", "1"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.starts_with("tablix: error: the cluster refused: ") && said.contains("last voter"),
        "{said}"
    );
    // Nothing was changed: node 1 still leads.
    assert_eq!(leader(&raft[0]), Some(1));
    d1.stop();
    let gone = cluster(&[&raft[0], "status"]);
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(!gone.status.success(), "{said}");
    assert!(said.starts_with("tablix: error: "), "{said}");
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_file_open_on_one_node_outlives_its_unlinking_on_another_and_goes_when_its_holder_restarts() {
    tablix_testkit::require::fuse(
        "a_file_open_on_one_node_outlives_its_unlinking_on_another_and_goes_when_its_holder_restarts",
    );
    use std::io::{Read, Seek};
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    let mut daemons: Vec<Daemon> = Node::start_cluster(&nodes, &[]);
    led_by(&nodes, 1);
    let body: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(nodes[0].mnt.join("held"), &body).unwrap();
    eventually("the file on node 2", || {
        read(&nodes[1].mnt.join("held")).as_ref() == Some(&body)
    });
    let mut open = std::fs::File::open(nodes[1].mnt.join("held")).unwrap();
    let read_all = |f: &mut std::fs::File| {
        f.rewind().unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).map(|_| got)
    };
    assert_eq!(read_all(&mut open).unwrap(), body);
    let unlinked = "SELECT count(*) FROM tablix_inode WHERE nlink = 0";
    // Unlinked through node 1, whose kernel lets it go at once; node 3
    // never held it. Both release it within a sweep of their releasers.
    std::fs::remove_file(nodes[0].mnt.join("held")).unwrap();
    for d in [&daemons[0], &daemons[2]] {
        eventually("nodes 1 and 3 to release it", || {
            local_rows(d, "SELECT count(*) FROM tablix_release") == serde_json::json!([[2]])
        });
    }
    assert_eq!(
        read_all(&mut open).expect("read after the unlinking"),
        body,
        "the file open on node 2 was freed by the others"
    );
    // Node 1 restarts: its mount releases what it held, nothing of node 2's.
    daemons.remove(0).stop();
    daemons.insert(0, nodes[0].start(&[]));
    eventually("node 1 back and applying", || {
        local_rows(&daemons[0], unlinked) == serde_json::json!([[1]])
    });
    assert_eq!(
        read_all(&mut open).expect("read after node 1's restart"),
        body
    );
    // A second file, open on node 2 when node 2 is killed.
    std::fs::write(nodes[0].mnt.join("held2"), b"second").unwrap();
    eventually("the second file on node 2", || {
        read(&nodes[1].mnt.join("held2")).as_deref() == Some(&b"second"[..])
    });
    let open2 = std::fs::File::open(nodes[1].mnt.join("held2")).unwrap();
    std::fs::remove_file(nodes[0].mnt.join("held2")).unwrap();
    // The first file's last close on node 2 frees it everywhere; the
    // second stays.
    drop(open);
    for d in &daemons {
        eventually("the first unlinked file freed on every node", || {
            local_rows(d, unlinked) == serde_json::json!([[1]])
        });
    }
    // Node 2 dies holding the second: when it mounts again, its kernel
    // holds nothing, and the file goes.
    daemons[1].die(false);
    drop(open2);
    daemons[1] = nodes[1].start(&[]);
    for d in &daemons {
        eventually("the second unlinked file freed on every node", || {
            local_rows(d, unlinked) == serde_json::json!([[0]])
                && local_rows(d, "SELECT count(*) FROM tablix_release") == serde_json::json!([[0]])
        });
    }
    for d in daemons {
        d.stop();
    }
    for n in &nodes {
        let (code, out) = crate::fsck(&n.data, &[]);
        assert_eq!(code, Some(0), "fsck of node {}:\n{out}", n.id);
        assert!(out.contains("clean"), "{out}");
    }
}

#[test]
fn removing_the_leader_through_itself_shows_the_cluster_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let raft: Vec<String> = (0..3).map(|_| free_raft_addr()).collect();
    let mut daemons = vec![node(dir.path(), &raft, 0, &["--bootstrap"])];
    for i in 1..3 {
        daemons.push(node(dir.path(), &raft, i, &["--join", &raft[0]]));
    }
    eventually("node 1 to lead three", || {
        raft.iter().all(|r| leader(r) == Some(1))
    });
    let out = std::process::Command::new(BIN)
        .args(["cluster", "--raft", &raft[0], "remove", "1"])
        .output_limited();
    let (said, told) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{said}\n{told}");
    // The status shown is a remaining member's: a leader among them, and
    // node 1 no longer listed.
    let first = said.lines().next().unwrap_or_default();
    assert!(
        (first.starts_with("node 2 ") || first.starts_with("node 3 "))
            && (first.contains("leader: node 2") || first.contains("leader: node 3")),
        "{said}"
    );
    assert!(
        !said.lines().any(|l| l.trim_start().starts_with("1 ")),
        "{said}"
    );
    // Node 1 itself says it was removed and names no leader, and a write
    // sent to it is refused saying so.
    let out = std::process::Command::new(BIN)
        .args(["cluster", "--raft", &raft[0], "status", "--json"])
        .output_limited();
    let own: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(own["state"], "removed", "{own}");
    assert_eq!(own["leader"], serde_json::Value::Null, "{own}");
    assert_eq!(leader(&raft[0]), None);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let asked = std::time::Instant::now();
    let mut r = agent
        .post(format!("http://{}/db/execute", daemons[0].addr))
        .send(r#"["CREATE TABLE after_removal(x)"]"#)
        .unwrap();
    let status = r.status();
    let body = r.body_mut().read_to_string().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no longer a member"), "{body}");
    // Refused at once, not after the leader wait (5 s) for a leader that
    // will never take it.
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "refused after {:?}",
        asked.elapsed()
    );
    for d in daemons {
        d.stop();
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn locks_hold_across_nodes_and_sqlite_databases_are_shared_through_them() {
    tablix_testkit::require::fuse(
        "locks_hold_across_nodes_and_sqlite_databases_are_shared_through_them",
    );
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    let daemons: Vec<Daemon> = Node::start_cluster(&nodes, &[]);
    led_by(&nodes, 1);
    let lk = |n: usize| nodes[n].mnt.join("lk");
    std::fs::write(lk(0), b"").unwrap();
    eventually("the lock file on node 2", || {
        lk(1).exists() && lk(2).exists()
    });
    let flock = |args: &[&str], file: &Path| {
        Command::new("flock")
            .args(args)
            .arg(file)
            .arg("true")
            .stdin(Stdio::null())
            .output_limited()
    };
    // flock(1) holds the file through node 1 for 2 s.
    let holder = Command::new("flock")
        .args(["-x"])
        .arg(lk(0))
        .args(["sleep", "2"])
        .spawn()
        .unwrap();
    // Each holder is known by its pid in the lock table, as the node
    // that will contend sees it.
    let held_by = |d: &Daemon, pid: u32| {
        local_rows(
            d,
            &format!("SELECT count(*) FROM tablix_lock WHERE pid = {pid}"),
        ) == serde_json::json!([[1]])
    };
    eventually("node 1's flock seen on node 2", || {
        held_by(&daemons[1], holder.id())
    });
    let refused = flock(&["-n", "-x"], &lk(1));
    assert_eq!(
        refused.status.code(),
        Some(1),
        "node 2 took a lock node 1 holds"
    );
    // A waiter on node 2 gets it once node 1's holder is done.
    let began = Instant::now();
    let waited = flock(&["-x", "-w", "20"], &lk(1));
    assert!(waited.status.success(), "{waited:?}");
    let mut holder = holder;
    assert!(
        holder.try_wait().unwrap().is_some(),
        "node 2 got the lock while node 1's holder ran"
    );
    eprintln!("node 2 waited {:?} for node 1's lock", began.elapsed());
    // A waiter that gets a signal is answered at once, not when the lock
    // frees.
    let holder = Command::new("flock")
        .args(["-x"])
        .arg(lk(0))
        .args(["sleep", "5"])
        .spawn()
        .unwrap();
    eventually("node 1's second flock seen on node 3", || {
        held_by(&daemons[2], holder.id())
    });
    let began = Instant::now();
    let interrupted = Command::new("timeout")
        .args(["-s", "INT", "1", "flock", "-x"])
        .arg(lk(2))
        .args(["true"])
        .output_limited();
    assert_eq!(interrupted.status.code(), Some(124), "{interrupted:?}");
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "the interrupted waiter took {:?}",
        began.elapsed()
    );
    let mut holder = holder;
    holder.wait().unwrap();
    // One SQLite database, written from every node at once through its
    // POSIX locks: no update is lost.
    let db = |n: usize| nodes[n].mnt.join("counter.db");
    let python = |script: &str, file: &Path| {
        Command::new("python3")
            .args(["-c", script])
            .arg(file)
            .stdin(Stdio::null())
            .output_limited()
    };
    let made = python(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
         c.execute('PRAGMA journal_mode=DELETE')\n\
         c.execute('CREATE TABLE c(n)')\n\
         c.execute('INSERT INTO c VALUES (0)')\n",
        &db(0),
    );
    assert!(made.status.success(), "{made:?}");
    for n in 1..3 {
        eventually("the database on every node", || db(n).exists());
    }
    let bump = "import sqlite3, sys\n\
                c = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n\
                for _ in range(40):\n\
                \x20   c.execute('UPDATE c SET n = n + 1')\n";
    let writers: Vec<_> = (0..3)
        .map(|n| {
            let file = db(n);
            std::thread::spawn(move || {
                Command::new("python3")
                    .args(["-c", bump])
                    .arg(file)
                    .stdin(Stdio::null())
                    .output_limited()
            })
        })
        .collect();
    for w in writers {
        let out = w.join().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    for n in 0..3 {
        let out = python(
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             print(c.execute('SELECT n FROM c').fetchone()[0], c.execute('PRAGMA integrity_check').fetchone()[0])\n",
            &db(n),
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "120 ok",
            "node {}: {out:?}",
            n + 1
        );
    }
    // WAL mode's index is shared memory, which no node shares with
    // another: mapping it is refused, so SQLite fails loudly instead of
    // losing updates. Without the shared index (exclusive locking) WAL
    // works, one connection at a time.
    let wal = python(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
         c.execute('PRAGMA journal_mode=WAL')\n\
         c.execute('CREATE TABLE w(x)')\n",
        &nodes[1].mnt.join("wal.db"),
    );
    assert!(!wal.status.success(), "{wal:?}");
    assert!(
        String::from_utf8_lossy(&wal.stderr).contains("disk I/O error"),
        "{wal:?}"
    );
    eventually("the WAL database on node 3", || {
        nodes[2].mnt.join("wal.db").exists()
    });
    let exclusive = python(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
         c.execute('PRAGMA locking_mode=EXCLUSIVE')\n\
         print(c.execute('PRAGMA journal_mode=WAL').fetchone()[0])\n\
         c.execute('CREATE TABLE IF NOT EXISTS w(x)')\n\
         c.execute('INSERT INTO w VALUES (1)')\n\
         print(c.execute('SELECT count(*) FROM w').fetchone()[0])\n",
        &nodes[2].mnt.join("wal.db"),
    );
    assert_eq!(
        String::from_utf8_lossy(&exclusive.stdout).trim(),
        "wal\n1",
        "{exclusive:?}"
    );
    // Every lock went with its holder's close, and every file SQLite
    // deleted while it had it open (its WAL) with its last close.
    for d in &daemons {
        eventually("no lock left", || {
            local_rows(d, "SELECT count(*) FROM tablix_lock") == serde_json::json!([[0]])
        });
        eventually("no unlinked file left", || {
            local_rows(d, "SELECT count(*) FROM tablix_inode WHERE nlink = 0")
                == serde_json::json!([[0]])
        });
    }
    for d in daemons {
        d.stop();
    }
    for n in &nodes {
        let (code, out) = crate::fsck(&n.data, &[]);
        assert_eq!(code, Some(0), "fsck of node {}:\n{out}", n.id);
    }
}

/// Runs `program` on node 3 with `args` and a directory: it takes a
/// lock, creates `locked` there, waits for `go`, then writes what
/// happened to `result`. Meanwhile node 3 stops answering
/// (its machine hangs) for longer than the lock lease, and `meanwhile`
/// runs; then node 3 goes on, `before_go` runs (given the script's
/// pid), `go` is given, and `after_go` runs. Returns the script's
/// result.
fn cut_off_past_the_lease_while_locked(
    daemons: &[Daemon],
    program: &[&str],
    args: &[&Path],
    meanwhile: impl FnOnce(),
    before_go: impl FnOnce(u32),
    after_go: impl FnOnce(),
) -> String {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let out = tempfile::tempdir().unwrap();
    // Its own process group, no descriptor of the test's output.
    let mut holder = Command::new(program[0])
        .args(&program[1..])
        .args(args)
        .arg(out.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = holder.id();
    eventually("node 3's process holds its lock", || {
        out.path().join("locked").exists()
            && local_rows(
                &daemons[0],
                "SELECT count(*) > 0 FROM tablix_lock WHERE node = 3",
            ) == serde_json::json!([[1]])
    });
    daemons[2].signal(nix::sys::signal::Signal::SIGSTOP);
    meanwhile();
    daemons[2].signal(nix::sys::signal::Signal::SIGCONT);
    before_go(pid);
    std::fs::write(out.path().join("go"), b"").unwrap();
    after_go();
    let result = out.path().join("result");
    eventually("node 3's process is done", || result.exists());
    let _ = holder.wait();
    std::fs::read_to_string(&result).unwrap()
}

/// A process holds a lock on node 3; node 3 stops answering for longer
/// than the lock lease, and node 1 takes the lock and writes; node 3
/// comes back. Its process must not write over what node 1 wrote: not
/// with its own writes, and not as SQLite committing a transaction.
#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_process_whose_lock_a_lease_took_gets_eio_until_it_closes_the_file() {
    tablix_testkit::require::fuse(
        "a_process_whose_lock_a_lease_took_gets_eio_until_it_closes_the_file",
    );
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    let daemons: Vec<Daemon> = Node::start_cluster(&nodes, &["--lock-lease", "2"]);
    led_by(&nodes, 1);
    // Node 1 takes the lock (waiting for the lease to free it) and
    // writes "node1" over the file.
    let node_1_takes_and_writes = |file: &Path| {
        let took = Command::new("flock")
            .args(["-x", "-w", "60"])
            .arg(file)
            .args(["sh", "-c", "printf node1 > \"$0\"", &file.to_string_lossy()])
            .stdin(Stdio::null())
            .output_limited();
        assert!(took.status.success(), "{took:?}");
    };
    let lk = |n: usize| nodes[n].mnt.join("lk");
    std::fs::write(lk(0), b"..........").unwrap();
    eventually("the file on node 3", || {
        std::fs::read(lk(2)).is_ok_and(|b| b.len() == 10)
    });
    // The write under the lost lock comes from another thread of the
    // process than the one that locked.
    let writer = "import fcntl, os, sys, threading, time\n\
        f, out = sys.argv[1], sys.argv[2]\n\
        fd = os.open(f, os.O_RDWR)\n\
        fcntl.lockf(fd, fcntl.LOCK_EX)\n\
        os.pwrite(fd, b'held', 0)\n\
        open(out + '/locked', 'w').close()\n\
        while not os.path.exists(out + '/go'):\n    time.sleep(0.05)\n\
        def put(fd, b, at):\n\
        \x20   try:\n\
        \x20       os.pwrite(fd, b, at)\n\
        \x20       return 'wrote'\n\
        \x20   except OSError as e:\n\
        \x20       return 'errno %d' % e.errno\n\
        got = []\n\
        t = threading.Thread(target=lambda: got.append(put(fd, b'late', 0)))\n\
        t.start()\n\
        t.join()\n\
        r = got[0]\n\
        os.close(fd)\n\
        fd = os.open(f, os.O_RDWR)\n\
        r += ' then ' + put(fd, b'again', 5)\n\
        os.close(fd)\n\
        open(out + '/result', 'w').write(r)\n";
    // Node 3 goes on once it learned that its lock was taken (by the
    // lock's process: the one started, or a helper of it).
    let learned = |_| {
        eventually("node 3 learns its lock was taken", || {
            local_rows(
                &daemons[2],
                "SELECT count(*) > 0 FROM tablix_lost_lock WHERE node = 3",
            ) == serde_json::json!([[1]])
        })
    };
    let forgotten = || {
        for d in &daemons {
            eventually("the lost lock forgotten on every node", || {
                local_rows(d, "SELECT count(*) FROM tablix_lost_lock") == serde_json::json!([[0]])
            });
        }
    };
    let result = cut_off_past_the_lease_while_locked(
        &daemons,
        &["python3", "-c", writer],
        &[&lk(2)],
        || {
            // Written under the lock (fenced, and let through) before node 3
            // was cut off.
            eventually("node 3's write under its lock, on node 1", || {
                std::fs::read(lk(0)).is_ok_and(|b| b == b"held......")
            });
            node_1_takes_and_writes(&lk(0));
        },
        learned,
        || {},
    );
    assert_eq!(
        result,
        format!("errno {} then wrote", libc::EIO),
        "its write under the lost lock fails, one after closing the file does not"
    );
    forgotten();
    // What node 1 wrote under the lock stands; node 3's write after it
    // closed the file follows it.
    eventually("node 1's bytes, then node 3's", || {
        std::fs::read(lk(0)).is_ok_and(|b| b == b"node1again")
    });

    // A shell script whose lock a helper took (`flock` on a descriptor
    // it handed down) writes through that descriptor: its open file's
    // lock was lost, so its write is refused too.
    let lk3 = |n: usize| nodes[n].mnt.join("lk3");
    std::fs::write(lk3(0), b"..........").unwrap();
    eventually("the third file on node 3", || {
        std::fs::read(lk3(2)).is_ok_and(|b| b.len() == 10)
    });
    let script = r#"exec 9<>"$0"
flock -x 9
: > "$1/locked"
while [ ! -e "$1/go" ]; do sleep 0.05; done
if printf late >&9 2>/dev/null; then r=wrote; else r=refused; fi
exec 9>&-
printf %s "$r" > "$1/result"
"#;
    let result = cut_off_past_the_lease_while_locked(
        &daemons,
        &["bash", "-c", script],
        &[&lk3(2)],
        || {
            node_1_takes_and_writes(&lk3(0));
        },
        learned,
        || {},
    );
    assert_eq!(result, "refused");
    forgotten();
    eventually("node 1's bytes stand", || {
        std::fs::read(lk3(0)).is_ok_and(|b| b == b"node1")
    });

    // SQLite (rollback journal) on node 3 is in a write transaction when
    // node 3 is cut off; node 1's SQLite commits a row meanwhile. Node
    // 3's COMMIT must fail rather than write its pages over node 1's.
    let db = |n: usize| nodes[n].mnt.join("t.db");
    let sql = |n: usize, body: &str| {
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import sqlite3, sys\n\
                 c = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n\
                 {body}"
            ))
            .arg(db(n))
            .stdin(Stdio::null())
            .output_limited();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    sql(
        0,
        "c.execute('CREATE TABLE t(x)'); c.execute(\"INSERT INTO t VALUES ('base')\")",
    );
    eventually("the database on node 3", || db(2).exists());
    let transaction = "import os, sqlite3, sys, time\n\
        f, out = sys.argv[1], sys.argv[2]\n\
        c = sqlite3.connect(f, timeout=60, isolation_level=None)\n\
        c.execute('BEGIN IMMEDIATE')\n\
        c.execute(\"INSERT INTO t VALUES ('n3')\")\n\
        open(out + '/locked', 'w').close()\n\
        while not os.path.exists(out + '/go'):\n    time.sleep(0.05)\n\
        try:\n\
        \x20   c.execute('COMMIT')\n\
        \x20   r = 'committed'\n\
        except sqlite3.Error as e:\n\
        \x20   r = 'failed: %s' % e\n\
        open(out + '/result', 'w').write(r)\n";
    let result = cut_off_past_the_lease_while_locked(
        &daemons,
        &["python3", "-c", transaction],
        &[&db(2)],
        || {
            sql(0, "c.execute(\"INSERT INTO t VALUES ('n1')\")");
        },
        learned,
        || {},
    );
    assert!(result.starts_with("failed"), "{result}");
    assert_eq!(
        sql(
            0,
            "print(c.execute('SELECT group_concat(x) FROM t').fetchone()[0]); print(c.execute('PRAGMA integrity_check').fetchone()[0])"
        ),
        "base,n1\nok",
        "node 1's commit stands"
    );

    // The race: node 3's process writes before node 3 heard of the
    // expiry (nodes 1 and 2 are stopped when node 3 goes on), and its
    // write reaches the log after it. The write was fenced: refused.
    let lk2 = |n: usize| nodes[n].mnt.join("lk2");
    std::fs::write(lk2(0), b"..........").unwrap();
    eventually("the second file on node 3", || {
        std::fs::read(lk2(2)).is_ok_and(|b| b.len() == 10)
    });
    let racer = "import fcntl, os, sys, time\n\
        f, out = sys.argv[1], sys.argv[2]\n\
        fd = os.open(f, os.O_RDWR)\n\
        fcntl.lockf(fd, fcntl.LOCK_EX)\n\
        open(out + '/locked', 'w').close()\n\
        while not os.path.exists(out + '/go'):\n    time.sleep(0.01)\n\
        try:\n\
        \x20   os.pwrite(fd, b'late', 0)\n\
        \x20   r = 'wrote'\n\
        except OSError as e:\n\
        \x20   r = 'errno %d' % e.errno\n\
        open(out + '/result', 'w').write(r)\n";
    let result = cut_off_past_the_lease_while_locked(
        &daemons,
        &["python3", "-c", racer],
        &[&lk2(2)],
        || {
            node_1_takes_and_writes(&lk2(0));
            for d in &daemons[..2] {
                d.signal(nix::sys::signal::Signal::SIGSTOP);
            }
        },
        |_| std::thread::sleep(Duration::from_millis(300)),
        || {
            // Well within the leader wait (5 s) of node 3's write.
            std::thread::sleep(Duration::from_secs(1));
            for d in &daemons[..2] {
                d.signal(nix::sys::signal::Signal::SIGCONT);
            }
        },
    );
    assert_eq!(result, format!("errno {}", libc::EIO));
    eventually("node 1's bytes stand", || {
        std::fs::read(lk2(0)).is_ok_and(|b| b == b"node1")
    });
    for d in daemons {
        d.stop();
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_lock_held_on_a_node_that_died_goes_when_its_lease_runs_out() {
    tablix_testkit::require::fuse("a_lock_held_on_a_node_that_died_goes_when_its_lease_runs_out");
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    let lease = ["--lock-lease", "2"];
    let mut daemons: Vec<Daemon> = Node::start_cluster(&nodes, &lease);
    led_by(&nodes, 1);
    let lk = |n: usize| nodes[n].mnt.join("lk");
    std::fs::write(lk(0), b"").unwrap();
    eventually("the lock file on node 3", || lk(2).exists());
    let flock = |args: &[&str], file: &Path| {
        Command::new("flock")
            .args(args)
            .arg(file)
            .arg("true")
            .stdin(Stdio::null())
            .output_limited()
    };
    // A process on node 3 holds the file, and keeps holding it while node 3
    // answers the leader: past several leases. It and the sleep it runs
    // are a process group of their own, killed together, and keep no
    // descriptor of the test's output (which a caller may wait to close).
    let mut holder = {
        use std::os::unix::process::CommandExt;
        Command::new("flock")
            .args(["-x"])
            .arg(lk(2))
            .args(["sleep", "120"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let holders = |d: &Daemon| {
        local_rows(
            d,
            &format!(
                "SELECT count(*) FROM tablix_lock WHERE node = 3 AND pid = {}",
                holder.id()
            ),
        )
    };
    eventually("node 3's flock seen on node 1", || {
        holders(&daemons[0]) == serde_json::json!([[1]])
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        flock(&["-n", "-x"], &lk(0)).status.code(),
        Some(1),
        "node 1 took the lock of a node that is alive"
    );
    // Node 3's machine dies with the lock held: a waiter on node 1 gets
    // it once the lease ran out.
    daemons[2].die(false);
    let waited = flock(&["-x", "-w", "60"], &lk(0));
    assert!(waited.status.success(), "{waited:?}");
    for d in &daemons[..2] {
        eventually("node 3's locks gone on nodes 1 and 2", || {
            local_rows(d, "SELECT count(*) FROM tablix_lock WHERE node = 3")
                == serde_json::json!([[0]])
        });
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = holder.wait();
    // Node 3 comes back and locks again.
    daemons[2] = nodes[2].start(&[lease[0], lease[1]]);
    eventually("a lock taken on node 3 after its return", || {
        flock(&["-n", "-x"], &lk(2)).status.success()
    });
    for d in daemons {
        d.stop();
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn appends_from_every_node_land_whole_at_the_end() {
    tablix_testkit::require::fuse("appends_from_every_node_land_whole_at_the_end");
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let nodes = Node::three(dir.path());
    let daemons: Vec<Daemon> = Node::start_cluster(&nodes, &[]);
    led_by(&nodes, 1);
    let log = |n: usize| nodes[n].mnt.join("shared.log");
    std::fs::write(log(0), b"").unwrap();
    for n in 1..3 {
        eventually("the log on every node", || log(n).exists());
    }
    // Three writers, one a node, each appending lines as a shell does
    // (`>>` opens with O_APPEND), at once.
    let writers: Vec<_> = (0..3)
        .map(|n| {
            Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "for i in $(seq 1 60); do echo \"node{} line $i\" >> \"$0\"; done",
                    n + 1
                ))
                .arg(log(n))
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().unwrap().success());
    }
    let expected: std::collections::BTreeSet<String> = (1..=3)
        .flat_map(|n| (1..=60).map(move |i| format!("node{n} line {i}")))
        .collect();
    for n in 0..3 {
        eventually("every line on every node", || {
            let text = std::fs::read_to_string(log(n)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines.len() == 180
                && lines
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<std::collections::BTreeSet<_>>()
                    == expected
        });
    }
    // What a node appended it reads back at once, through a descriptor
    // opened for appending and reading, and through a fresh open.
    let mut both = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(log(1))
        .unwrap();
    for i in 0..20 {
        let line = format!("tail {i}\n");
        std::io::Write::write_all(&mut both, line.as_bytes()).unwrap();
        let text = std::fs::read_to_string(log(1)).unwrap();
        assert!(text.ends_with(&line), "append {i} not at the end: {text:?}");
        let mut again = String::new();
        std::io::Seek::seek(&mut both, std::io::SeekFrom::Start(0)).unwrap();
        std::io::Read::read_to_string(&mut both, &mut again).unwrap();
        assert_eq!(again, text);
    }
    // Two nodes creating the same names at once, as `>>` does
    // (O_CREAT without O_EXCL): whoever comes second opens the file the
    // first made, as open(2) does, instead of failing with EEXIST.
    std::fs::create_dir(nodes[0].mnt.join("race")).unwrap();
    eventually("the race directory on node 3", || {
        nodes[2].mnt.join("race").exists()
    });
    let racers: Vec<_> = [0usize, 2]
        .iter()
        .map(|&n| {
            let dir = nodes[n].mnt.join("race");
            std::thread::spawn(move || {
                Command::new("bash")
                    .arg("-c")
                    .arg(format!(
                        "for i in $(seq 1 40); do echo node{} >> \"$0/f$i\" || exit 1; done",
                        n + 1
                    ))
                    .arg(dir)
                    .stdin(Stdio::null())
                    .output_limited()
            })
        })
        .collect();
    for r in racers {
        let out = r.join().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    for i in 1..=40 {
        eventually("both lines of a raced file", || {
            let text = std::fs::read_to_string(nodes[1].mnt.join(format!("race/f{i}")))
                .unwrap_or_default();
            let mut lines: Vec<&str> = text.lines().collect();
            lines.sort_unstable();
            lines == ["node1", "node3"]
        });
    }
    // O_APPEND set after opening (fcntl), so the write goes through the
    // page cache: it lands at the end all the same.
    let setfl = Command::new("python3")
        .args([
            "-c",
            "import fcntl, os, sys\n\
             fd = os.open(sys.argv[1], os.O_RDWR)\n\
             os.read(fd, 1 << 20)\n\
             os.lseek(fd, 0, os.SEEK_SET)\n\
             fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)\n\
             os.write(fd, b'set later\\n')\n\
             print(open(sys.argv[1]).read().endswith('tail 19\\nset later\\n'))\n",
        ])
        .arg(log(2))
        .stdin(Stdio::null())
        .output_limited();
    assert_eq!(
        String::from_utf8_lossy(&setfl.stdout).trim(),
        "True",
        "{setfl:?}"
    );
    for d in daemons {
        d.stop();
    }
    for n in &nodes {
        let (code, out) = crate::fsck(&n.data, &[]);
        assert_eq!(code, Some(0), "fsck of node {}:\n{out}", n.id);
    }
}
