//! Stamps: the time and seed a Command carries.

use std::time::{SystemTime, UNIX_EPOCH};

use tablix_store::Stamp;

/// Stamps a Command proposed now. This is the place where the wall clock and
/// the random source enter tablix's state, so a replay never consults them.
pub fn stamp_now() -> Stamp {
    let unix_nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let seed = getrandom::u64().unwrap_or(unix_nanos as u64 ^ 0x5DEE_CE66_D1CE_4E5B);
    Stamp { unix_nanos, seed }
}
