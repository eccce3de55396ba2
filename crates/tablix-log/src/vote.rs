//! The vote: what this node promised in the current term, kept beside the
//! log and replaced atomically (write, fsync, rename, fsync the
//! directory). Opaque bytes to the log; replication gives them meaning.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::error::LogError;
use crate::log::Log;

const VOTE: &str = "vote";
const VOTE_TMP: &str = "vote.tmp";

impl Log {
    /// Replaces the saved vote; durable on return.
    pub fn save_vote(&mut self, vote: &[u8]) -> Result<(), LogError> {
        let tmp = self.dir().join(VOTE_TMP);
        let path = self.dir().join(VOTE);
        let mut bytes = Vec::with_capacity(vote.len() + 8);
        bytes.extend_from_slice(&crc32fast::hash(vote).to_le_bytes());
        bytes.extend_from_slice(&(vote.len() as u32).to_le_bytes());
        bytes.extend_from_slice(vote);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| LogError::io(&tmp, "writing the vote", e))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| LogError::io(&tmp, "writing the vote", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| LogError::io(&path, "replacing the vote", e))?;
        File::open(self.dir())
            .and_then(|d| d.sync_all())
            .map_err(|e| LogError::io(self.dir(), "syncing the directory", e))
    }

    /// The saved vote, if any.
    pub fn vote(&self) -> Result<Option<Vec<u8>>, LogError> {
        let path = self.dir().join(VOTE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LogError::io(&path, "reading the vote", e)),
        };
        let corrupt = || LogError::Corrupt {
            path: path.clone(),
            index: 0,
            offset: 0,
            detail: "the saved vote fails its checksum".into(),
        };
        if bytes.len() < 8 {
            return Err(corrupt());
        }
        let crc = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
        let vote = bytes.get(8..8 + len).ok_or_else(corrupt)?;
        if crc32fast::hash(vote) != crc {
            return Err(corrupt());
        }
        Ok(Some(vote.to_vec()))
    }
}
