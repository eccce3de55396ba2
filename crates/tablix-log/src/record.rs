//! The bytes of a segment: its header, and the records of its entries.
//!
//! ```text
//! segment header (40 bytes, little-endian):
//!   magic "TBXLOG02" | seq u64 | first_index u64 | prev_term u64 | crc32 u32 | 0 u32
//! record:
//!   crc32 u32 | len u32 | term u64 | index u64 | payload (len bytes)
//! ```
//!
//! A record's CRC-32 covers the segment's seq (its salt) and everything
//! after the CRC (length, term, index, payload), so a torn or zeroed
//! record never reads as an entry, an entry read back is the entry
//! written, and a record left from an earlier use of a recycled segment
//! (another seq) never checks. Segments of the first format
//! ("TBXLOG01") carry no salt and are still read.

/// The first bytes of every segment this build writes.
pub(crate) const MAGIC: &[u8; 8] = b"TBXLOG02";

/// The first format's magic: records without the salt.
const MAGIC_UNSALTED: &[u8; 8] = b"TBXLOG01";

/// Bytes of a segment header: magic, seq, first index, previous term,
/// CRC-32 of the preceding 32 bytes, and padding.
pub(crate) const HEADER_BYTES: u64 = 40;

/// Bytes of a record's header.
pub(crate) const RECORD_HEADER_BYTES: usize = 24;

/// What a segment header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Order of the segments: a segment started later has a larger seq.
    pub(crate) seq: u64,
    /// Index of its first entry.
    pub(crate) first_index: u64,
    /// Term of the entry before its first (0 when there is none): the log
    /// id of what precedes it, known even when that entry is purged.
    pub(crate) prev_term: u64,
    /// Whether its records' CRCs cover the seq (every segment this build
    /// starts; not those of the first format).
    pub(crate) salted: bool,
}

impl Header {
    pub(crate) fn new(seq: u64, first_index: u64, prev_term: u64) -> Header {
        Header {
            seq,
            first_index,
            prev_term,
            salted: true,
        }
    }

    /// What its records' CRCs start from.
    pub(crate) fn salt(&self) -> Salt {
        Salt(self.salted.then_some(self.seq))
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES as usize] {
        let mut b = [0u8; HEADER_BYTES as usize];
        b[0..8].copy_from_slice(if self.salted { MAGIC } else { MAGIC_UNSALTED });
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_index.to_le_bytes());
        b[24..32].copy_from_slice(&self.prev_term.to_le_bytes());
        let crc = crc32fast::hash(&b[0..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for anything but a header this crate wrote whole.
    pub(crate) fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_BYTES as usize {
            return None;
        }
        let salted = match &b[0..8] {
            m if m == MAGIC => true,
            m if m == MAGIC_UNSALTED => false,
            _ => return None,
        };
        let crc = u32::from_le_bytes(b[32..36].try_into().ok()?);
        if crc != crc32fast::hash(&b[0..32]) {
            return None;
        }
        Some(Header {
            seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
            first_index: u64::from_le_bytes(b[16..24].try_into().ok()?),
            prev_term: u64::from_le_bytes(b[24..32].try_into().ok()?),
            salted,
        })
    }
}

/// What a segment's record CRCs start from: its seq (none in the first
/// format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Salt(Option<u64>);

impl Salt {
    fn hasher(self) -> crc32fast::Hasher {
        let mut h = crc32fast::Hasher::new();
        if let Some(seq) = self.0 {
            h.update(&seq.to_le_bytes());
        }
        h
    }
}

/// Appends the record of one entry to `out`.
pub(crate) fn encode(out: &mut Vec<u8>, salt: Salt, term: u64, index: u64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(payload);
    let mut h = salt.hasher();
    h.update(&out[start + 4..]);
    let crc = h.finalize();
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A record's header, read before its payload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordHeader {
    pub(crate) crc: u32,
    pub(crate) len: u32,
    pub(crate) term: u64,
    pub(crate) index: u64,
}

impl RecordHeader {
    pub(crate) fn decode(b: &[u8; RECORD_HEADER_BYTES]) -> RecordHeader {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        RecordHeader {
            crc: u32_at(0),
            len: u32_at(4),
            term: u64_at(8),
            index: u64_at(16),
        }
    }

    /// Whether `payload` completes this header into the record written.
    pub(crate) fn checks(
        &self,
        salt: Salt,
        raw_header: &[u8; RECORD_HEADER_BYTES],
        payload: &[u8],
    ) -> bool {
        let mut h = salt.hasher();
        h.update(&raw_header[4..]);
        h.update(payload);
        h.finalize() == self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_any_flipped_bit_fails_its_check() {
        let salt = Header::new(4, 1, 0).salt();
        let mut out = Vec::new();
        encode(&mut out, salt, 3, 17, b"hello");
        let raw: [u8; RECORD_HEADER_BYTES] = out[..RECORD_HEADER_BYTES].try_into().unwrap();
        let h = RecordHeader::decode(&raw);
        assert_eq!((h.term, h.index, h.len), (3, 17, 5));
        assert!(h.checks(salt, &raw, &out[RECORD_HEADER_BYTES..]));
        // The same bytes under another segment's seq, or unsalted, do not.
        assert!(!h.checks(
            Header::new(5, 1, 0).salt(),
            &raw,
            &out[RECORD_HEADER_BYTES..]
        ));
        assert!(!h.checks(Salt(None), &raw, &out[RECORD_HEADER_BYTES..]));
        for bit in 0..out.len() * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let raw: [u8; RECORD_HEADER_BYTES] = bad[..RECORD_HEADER_BYTES].try_into().unwrap();
            let h = RecordHeader::decode(&raw);
            let payload = bad.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + h.len as usize);
            assert!(
                !payload.is_some_and(|p| h.checks(salt, &raw, p)),
                "bit {bit} flipped and the record still checks"
            );
        }
        // Zeros (a preallocated, never written region) are no record.
        let zeros = [0u8; RECORD_HEADER_BYTES];
        assert!(!RecordHeader::decode(&zeros).checks(salt, &zeros, &[]));
        assert!(!RecordHeader::decode(&zeros).checks(Salt(None), &zeros, &[]));
    }

    #[test]
    fn a_header_reads_back_and_a_damaged_one_does_not() {
        for h in [
            Header::new(9, 1000, 2),
            Header {
                salted: false,
                ..Header::new(9, 1000, 2)
            },
        ] {
            assert_eq!(Header::decode(&h.encode()), Some(h));
        }
        let h = Header::new(9, 1000, 2);
        let b = h.encode();
        let mut bad = b;
        bad[17] ^= 4;
        assert_eq!(Header::decode(&bad), None);
        assert_eq!(Header::decode(&[0u8; HEADER_BYTES as usize]), None);
    }
}
