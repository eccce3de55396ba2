//! Named points of the write path, where crash tests stop the process or
//! the machine to check that recovery applies every entry exactly once.

use std::sync::Arc;

/// A point of the write path, in the order a Command passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePoint {
    /// A group's entries are appended to the log, not yet synced.
    Appended,
    /// The group's entries are durable; nothing of it is applied.
    Synced,
    /// The group is applied in its transaction, which records its last
    /// entry, and not committed: the middle of a group.
    Applied,
    /// The group's transaction committed; its callers are not answered.
    Committed,
    /// Async mode: an operation is applied in the pending transaction and
    /// about to be acknowledged; its entry is not synced.
    PendingApplied,
    /// Async mode's flush: the pending entries are synced, the pending
    /// transaction not committed.
    FlushSynced,
}

impl WritePoint {
    pub const ALL: [WritePoint; 6] = [
        WritePoint::Appended,
        WritePoint::Synced,
        WritePoint::Applied,
        WritePoint::Committed,
        WritePoint::PendingApplied,
        WritePoint::FlushSynced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WritePoint::Appended => "appended",
            WritePoint::Synced => "synced",
            WritePoint::Applied => "applied",
            WritePoint::Committed => "committed",
            WritePoint::PendingApplied => "pending-applied",
            WritePoint::FlushSynced => "flush-synced",
        }
    }
}

impl std::str::FromStr for WritePoint {
    type Err = String;
    fn from_str(s: &str) -> Result<WritePoint, String> {
        WritePoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = WritePoint::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown write point {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// What runs at each [`WritePoint`]: nothing, unless a crash test set it.
#[derive(Clone, Default)]
pub struct WriteProbe(Option<Arc<dyn Fn(WritePoint) + Send + Sync>>);

impl WriteProbe {
    pub fn new(f: impl Fn(WritePoint) + Send + Sync + 'static) -> WriteProbe {
        WriteProbe(Some(Arc::new(f)))
    }

    pub(crate) fn at(&self, point: WritePoint) {
        if let Some(f) = &self.0 {
            f(point);
        }
    }
}

impl std::fmt::Debug for WriteProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "WriteProbe(set)"
        } else {
            "WriteProbe(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_parses_from_its_name_and_others_are_refused() {
        for p in WritePoint::ALL {
            assert_eq!(p.name().parse::<WritePoint>(), Ok(p));
        }
        let e = "halfway".parse::<WritePoint>().unwrap_err();
        assert!(
            e.contains("\"halfway\"") && e.contains("flush-synced"),
            "{e}"
        );
    }
}
