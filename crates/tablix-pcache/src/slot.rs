//! Per-page bookkeeping, kept in an arena indexed by `u32`.

/// The "no slot" link value.
pub const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct Slot {
    pub key: u32,
    pub live: bool,
    pub pinned: bool,
    /// In some policy list.
    pub linked: bool,
    pub prev: u32,
    pub next: u32,
    /// Policy-specific reference history.
    pub freq: u8,
    /// Policy-specific: which list the slot is in.
    pub queue: u8,
    /// Next slot in the same hash chain.
    pub hnext: u32,
    /// The page allocation (header, buffer, extra), or null when free.
    pub mem: *mut u8,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            key: 0,
            live: false,
            pinned: false,
            linked: false,
            prev: NIL,
            next: NIL,
            freq: 0,
            queue: 0,
            hnext: NIL,
            mem: std::ptr::null_mut(),
        }
    }
}
