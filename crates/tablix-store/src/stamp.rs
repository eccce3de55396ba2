//! Stamping: where the wall clock and the random source enter tablix.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::command::Stamp;

impl Stamp {
    /// Stamps a Command proposed now. Proposers (the HTTP API, the FUSE
    /// mount) call this; applying a Command never does, so a replay never
    /// consults the clock or the random source.
    pub fn now() -> Stamp {
        let unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let seed = getrandom::u64().unwrap_or(unix_nanos as u64 ^ 0x5DEE_CE66_D1CE_4E5B);
        Stamp { unix_nanos, seed }
    }
}
