//! Block checksums: CRC-32 (IEEE) of a block's bytes, stored beside them.
//!
//! A write that patches bytes inside a stored block does not read the whole
//! block to recompute its checksum. CRC-32 is affine over GF(2): for two
//! messages of one length, `crc(a) ^ crc(b) = raw(a ^ b)`, where `raw` is
//! the CRC with a zero start value and no final inversion, and leading zero
//! bytes do not change `raw`. A patch that replaces the window `old` by
//! `new`, with `after` bytes of the block behind it, therefore changes the
//! checksum by `raw((old ^ new) || 0^after)`, which costs a pass over the
//! window and a combine, whatever the block's length.

use std::sync::OnceLock;

use crate::schema::BLOCK_SIZE;

/// The checksum of a block's bytes, as stored (4 bytes, big-endian).
pub fn of(data: &[u8]) -> [u8; 4] {
    crc32fast::hash(data).to_be_bytes()
}

/// The stored form back to the CRC.
pub fn from_stored(stored: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(stored).ok().map(u32::from_be_bytes)
}

/// `crc(0^n)` for every n a block can hold.
fn zeros(n: usize) -> u32 {
    static TABLE: OnceLock<Vec<u32>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut out = Vec::with_capacity(BLOCK_SIZE as usize + 1);
        let mut h = crc32fast::Hasher::new();
        out.push(h.clone().finalize());
        for _ in 0..BLOCK_SIZE {
            h.update(&[0]);
            out.push(h.clone().finalize());
        }
        out
    });
    match table.get(n) {
        Some(&z) => z,
        None => crc32fast::hash(&vec![0; n]),
    }
}

/// The CRC of a block after bytes `old` of it became `new` (equal lengths),
/// with `after` bytes of the block following the window.
pub fn patched(crc: u32, old: &[u8], new: &[u8], after: usize) -> u32 {
    debug_assert_eq!(old.len(), new.len());
    let diff: Vec<u8> = old.iter().zip(new).map(|(a, b)| a ^ b).collect();
    let mut h = crc32fast::Hasher::new_with_initial_len(crc32fast::hash(&diff), diff.len() as u64);
    h.combine(&crc32fast::Hasher::new_with_initial_len(
        zeros(after),
        after as u64,
    ));
    // h holds crc(diff || 0^after); without the constant of its length it
    // is raw(diff || 0^after).
    crc ^ h.finalize() ^ zeros(diff.len() + after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Patching the checksum gives what hashing the patched block gives.
        #[test]
        fn a_patched_checksum_matches_a_full_one(
            block in prop::collection::vec(any::<u8>(), 1..4096),
            window in prop::collection::vec(any::<u8>(), 1..512),
            at in any::<prop::sample::Index>(),
        ) {
            let len = window.len().min(block.len());
            let start = at.index(block.len() - len + 1);
            let new = &window[..len];
            let mut patched_block = block.clone();
            patched_block[start..start + len].copy_from_slice(new);
            let got = patched(
                crc32fast::hash(&block),
                &block[start..start + len],
                new,
                block.len() - start - len,
            );
            prop_assert_eq!(got, crc32fast::hash(&patched_block));
        }
    }

    #[test]
    fn stored_form_round_trips_and_zeros_agree() {
        let c = of(b"tablix");
        assert_eq!(from_stored(&c), Some(crc32fast::hash(b"tablix")));
        assert_eq!(from_stored(b"abc"), None);
        assert_eq!(zeros(1000), crc32fast::hash(&[0u8; 1000]));
        assert_eq!(zeros(0), crc32fast::hash(&[]));
    }
}
