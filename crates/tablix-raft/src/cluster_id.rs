//! A cluster's identity: a random id drawn when a node bootstraps it, kept
//! in a file of every member's data directory and sent on every request
//! between nodes, so a node never takes entries, votes or members from
//! another cluster, and a data directory of one cluster is never joined
//! to another.
//!
//! A node that has no id yet takes it from the leader that adds it (a
//! data directory from before ids, whose log holds entries, takes the
//! first one a node-to-node request names). From then on the id never
//! changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The header that carries the sender's cluster id.
pub const HEADER: &str = "x-tablix-cluster";

/// Where in a data directory a node keeps its cluster's id.
pub const FILE: &str = "cluster-id";

/// The header that carries, beside the cluster id, the version of the
/// sender's apply (`tablix_store::APPLY_VERSION`): nodes that would apply
/// an entry differently refuse each other.
pub const APPLY_HEADER: &str = "x-tablix-apply";

/// The apply version of builds from before the header, which send none:
/// they apply entries as version 1 does, so a cluster moves onto builds
/// with the header node by node.
pub const UNNAMED_APPLY_VERSION: u32 = 1;

/// Why a node's request is refused for its apply version, if it is: `theirs`
/// is the header's value (none from a build before the header).
pub fn apply_refusal(theirs: Option<&str>, ours: u32) -> Option<String> {
    match theirs {
        Some(v) if v.trim().parse::<u32>().ok() == Some(ours) => None,
        Some(v) => Some(format!(
            "this node applies entries as version {ours} and the other side as version {v}: the nodes of a cluster must apply every entry alike, or their states would part; run one build's apply version on every node"
        )),
        None if ours == UNNAMED_APPLY_VERSION => None,
        None => Some(format!(
            "this node applies entries as version {ours} and the other side, a tablix build from before versions, as version {UNNAMED_APPLY_VERSION}: the nodes of a cluster must apply every entry alike, or their states would part; run one build's apply version on every node"
        )),
    }
}

/// Why an id was refused or could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "this node belongs to cluster {ours}, and the other side to cluster {theirs}: a node serves one cluster (a data directory that was part of another cluster must be replaced, not joined)"
    )]
    Other { ours: String, theirs: String },
    #[error("{0:?} is not a cluster id (32 hexadecimal digits)")]
    Malformed(String),
    #[error("keeping the cluster id in {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// A node's cluster id, shared by its transport (which sends it) and its
/// raft service (which checks it).
#[derive(Clone, Debug)]
pub struct ClusterIdentity {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `None` for a client that is not a node (the CLI): it sends no id
    /// and keeps none.
    path: Option<PathBuf>,
    id: RwLock<Option<String>>,
}

fn well_formed(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl ClusterIdentity {
    /// The identity kept in `path`: the id the file holds, or none yet.
    pub fn load(path: &Path) -> Result<ClusterIdentity, IdentityError> {
        let io = |cause| IdentityError::Io {
            path: path.to_path_buf(),
            cause,
        };
        let id = match std::fs::read_to_string(path) {
            Ok(text) => {
                let id = text.trim().to_string();
                if !well_formed(&id) {
                    return Err(IdentityError::Malformed(id));
                }
                Some(id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        Ok(ClusterIdentity {
            inner: Arc::new(Inner {
                path: Some(path.to_path_buf()),
                id: RwLock::new(id),
            }),
        })
    }

    /// No identity: a client of the raft service that is not a node.
    pub fn none() -> ClusterIdentity {
        ClusterIdentity {
            inner: Arc::new(Inner {
                path: None,
                id: RwLock::new(None),
            }),
        }
    }

    /// Whether this is a node's identity (kept in its data directory),
    /// even before it has an id, rather than a tool's.
    pub fn is_node(&self) -> bool {
        self.inner.path.is_some()
    }

    pub fn get(&self) -> Option<String> {
        self.inner.id.read().ok().and_then(|id| id.clone())
    }

    /// Draws a new id and keeps it, unless this node has one already
    /// (bootstrapping).
    pub fn create(&self) -> Result<String, IdentityError> {
        if let Some(id) = self.get() {
            return Ok(id);
        }
        self.adopt(&random_id())?;
        self.get()
            .ok_or_else(|| IdentityError::Malformed(String::new()))
    }

    /// Takes `theirs` as this node's id when it has none; refuses it when
    /// it has another.
    pub fn adopt(&self, theirs: &str) -> Result<(), IdentityError> {
        if !well_formed(theirs) {
            return Err(IdentityError::Malformed(theirs.to_string()));
        }
        let Ok(mut id) = self.inner.id.write() else {
            return Err(IdentityError::Malformed(theirs.to_string()));
        };
        match id.as_deref() {
            Some(ours) if ours.eq_ignore_ascii_case(theirs) => return Ok(()),
            Some(ours) => {
                return Err(IdentityError::Other {
                    ours: ours.to_string(),
                    theirs: theirs.to_string(),
                });
            }
            None => {}
        }
        if let Some(path) = &self.inner.path {
            write_durably(path, theirs).map_err(|cause| IdentityError::Io {
                path: path.clone(),
                cause,
            })?;
        }
        *id = Some(theirs.to_ascii_lowercase());
        Ok(())
    }
}

/// Writes `id` to `path` so that a crash leaves the old file or the new
/// one, never a torn one.
fn write_durably(path: &Path, id: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{id}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// 128 random bits from the kernel, as hex.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        // No /dev/urandom: the clock and the process's hasher keys still
        // make two clusters' ids differ.
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_nodes_own_apply_version_is_let_through() {
        assert_eq!(apply_refusal(Some("7"), 7), None);
        assert_eq!(apply_refusal(Some(" 7 "), 7), None);
        for theirs in [
            Some("8"),
            Some("6"),
            Some(""),
            Some("seven"),
            Some("7.0"),
            None,
        ] {
            let why = apply_refusal(theirs, 7).unwrap_or_else(|| panic!("{theirs:?} let through"));
            assert!(why.contains("version 7"), "{why}");
            let t = theirs.map_or(UNNAMED_APPLY_VERSION.to_string(), str::to_string);
            if !t.is_empty() {
                assert!(why.contains(&format!("version {t}")), "{why}");
            }
        }
        // A build from before the header applies as the unnamed version.
        assert_eq!(apply_refusal(None, UNNAMED_APPLY_VERSION), None);
        assert!(apply_refusal(Some("2"), UNNAMED_APPLY_VERSION).is_some());
    }

    #[test]
    fn an_id_is_kept_adopted_once_and_refused_when_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let a = ClusterIdentity::load(&path).unwrap();
        assert_eq!(a.get(), None);
        let id = a.create().unwrap();
        assert!(well_formed(&id), "{id}");
        assert_eq!(a.create().unwrap(), id, "create keeps an existing id");
        let again = ClusterIdentity::load(&path).unwrap();
        assert_eq!(again.get().as_deref(), Some(id.as_str()));
        again.adopt(&id.to_ascii_uppercase()).unwrap();
        let other = random_id();
        assert_ne!(other, id);
        assert!(matches!(
            again.adopt(&other),
            Err(IdentityError::Other { .. })
        ));
        assert!(matches!(
            again.adopt("not an id"),
            Err(IdentityError::Malformed(_))
        ));
        std::fs::write(&path, "garbage\n").unwrap();
        assert!(matches!(
            ClusterIdentity::load(&path),
            Err(IdentityError::Malformed(_))
        ));
        let client = ClusterIdentity::none();
        client.adopt(&other).unwrap();
        assert_eq!(client.get().as_deref(), Some(other.as_str()));
    }
}
