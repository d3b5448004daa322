//! A delegate's constant identities, kept in the packed-weight cache beside the weights they
//! find: a warm launch reads them back by its payload instead of describing every constant and
//! the nodes that pack it again (what [`super::weight_identities`]'s `plan` does, by far the
//! largest part of registering a small model's weights).
//!
//! The record holds the payload it was made for, and is found under the payload's length and
//! XXH3-128: a launch compares the bytes it was given with the record's, where a sha256 of the
//! payload would be read at every launch for the same certainty (a payload is tens of KiB; on a
//! CPU without SHA extensions its sha256 was a fifth of a small model's warm init). A record
//! of another payload that the fast hash confuses with this one is found, compared, and ignored.
//!
//! The identities are a function of the payload (its graph, and the bytes of its inline
//! constants), of the content keys its constants are named by, and of whether fp16 is computed
//! as fp32 here. So they are kept, and read back, only where nothing else decides them: every
//! named constant is named by its content, and no check found a key that lies about its bytes.
//! A constant named otherwise (a `.ptd` a user wrote with `linear.weight`) is identified by its
//! bytes, which the payload does not hold: such a delegate is described at each launch.
//!
//! They are kept as a constant of their own (see
//! [`KEPT_CONSTANT_SEED`](crate::cache::format::KEPT_CONSTANT_SEED)): saved with the weights,
//! checked with them, and, like them, never trusted for more than what they are: a record that
//! does not read as one is ignored, and the identities described again.

use super::constants::Loaded;
use super::error::DelegateError;
use super::graph::{Values, constant_index};
use super::weight_identities::{KeyCheck, Planned};
use crate::cache::{BlobId, PackedWeightsCache};

/// The record's first bytes; the last is its version. Then the payload's length (8 bytes, little
/// endian) and the payload, then one record per constant value.
const MAGIC: [u8; 8] = *b"XBIDS\0\0\x02";

/// Bytes per constant value: its state, then its identity.
const RECORD: usize = 1 + 32;

/// A constant value that is not registered (its bytes have no identity).
const NOT_REGISTERED: u8 = 0;
const REGISTERED: u8 = 1;
const AMBIGUOUS: u8 = 2;

/// Where a delegate's identities are kept: under its payload's length and fast hash, with the
/// payload, one record per constant value.
pub(super) struct Remembered<'p> {
    content: BlobId,
    /// The payload the identities are of, kept in the record and compared with it.
    payload: &'p [u8],
    /// Each constant value's index in the payload, ascending.
    constants: Vec<usize>,
}

impl<'p> Remembered<'p> {
    /// Where the identities of the delegate of `payload` are kept, if nothing outside it decides
    /// them (see the module's description). Asks `check` of each content key, as describing
    /// them would: a data file met for the first time is checked here.
    pub(super) fn for_payload(
        values: &Values<'_>,
        keep: &Loaded,
        check: &mut KeyCheck<'_>,
        payload: &'p [u8],
    ) -> Result<Option<Remembered<'p>>, DelegateError> {
        // Entry 0 stands for no constant; an empty key is data inline in the payload.
        for index in 1..values.constant_count() {
            if let Some(key) = values.named_key(index).filter(|k| !k.is_empty()) {
                let held_to = values
                    .stated_id(index)
                    .is_some_and(|claimed| check.identity(key, claimed) == claimed);
                if !held_to {
                    return Ok(None);
                }
            }
        }
        let mut constants = Vec::new();
        for each in values.each() {
            let (i, (t, _)) = each?;
            if constant_index(&t) != 0 {
                constants.push(i);
            }
        }
        Ok(Some(Remembered {
            content: record_key(payload, keep.fp16_as_fp32),
            payload,
            constants,
        }))
    }

    fn len(&self) -> usize {
        MAGIC.len() + 8 + self.payload.len() + RECORD * self.constants.len()
    }

    /// The identities kept for this payload, if the cache keeps a record of them that reads as
    /// one: each registered value is a constant value whose constant was loaded.
    pub(super) fn recall(
        &self,
        cache: &PackedWeightsCache,
        values: &Values<'_>,
        keep: &Loaded,
    ) -> Option<Vec<Planned>> {
        // Checked at each read (a few bytes): damaged identities would have this launch look
        // its weights up under the wrong names, and pack them under those.
        let kept = cache.kept_constant_checked(self.content, self.len())?;
        let records = read_records(kept.data(), self.payload, self.constants.len())?;
        let mut planned = Vec::with_capacity(records.len());
        for (&value, record) in self.constants.iter().zip(records) {
            let Some((id, ambiguous)) = record else {
                continue;
            };
            let (t, _) = values.tensor_at(value).ok()?;
            keep.constants.get(constant_index(&t))?;
            planned.push(Planned {
                value,
                id,
                ambiguous,
            });
        }
        Some(planned)
    }

    /// Keeps `planned` (this payload's identities, as described) for later launches.
    pub(super) fn keep(&self, cache: &PackedWeightsCache, planned: &[Planned]) {
        let mut bytes = Vec::with_capacity(self.len());
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(self.payload);
        let mut next = planned.iter().peekable();
        for &value in &self.constants {
            match next.next_if(|p| p.value == value) {
                Some(p) => {
                    bytes.push(if p.ambiguous { AMBIGUOUS } else { REGISTERED });
                    bytes.extend_from_slice(&p.id.0);
                }
                None => {
                    bytes.push(NOT_REGISTERED);
                    bytes.extend_from_slice(&BlobId::NONE.0);
                }
            }
        }
        // Every planned value is a constant value: a plan that names another is not kept.
        if next.peek().is_none() {
            cache.keep_constant(self.content, &bytes);
        }
    }
}

/// The content identity a record of `payload`'s identities is kept under: the payload's XXH3-128
/// and length, the record's version and whether fp16 is computed as fp32, as they are (no
/// sha256 at each launch). It is the identity of no constant: those are sha256s, and this one
/// ends in bytes of its own.
fn record_key(payload: &[u8], fp16_as_fp32: bool) -> BlobId {
    let mut id = [0u8; 32];
    id[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(payload).to_le_bytes());
    id[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    id[24..30].copy_from_slice(b"XBIDS\0");
    id[30] = MAGIC[7];
    id[31] = u8::from(fp16_as_fp32);
    BlobId(id)
}

/// The `count` records of `bytes` (each constant value's identity and whether it is ambiguous,
/// or None where it is not registered), if `bytes` reads as a record of that many made for
/// `payload`.
fn read_records(bytes: &[u8], payload: &[u8], count: usize) -> Option<Vec<Option<(BlobId, bool)>>> {
    let rest = bytes.strip_prefix(&MAGIC[..])?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    if u64::from_le_bytes(*len) != payload.len() as u64 {
        return None;
    }
    let records = rest.strip_prefix(payload)?;
    if records.len() != RECORD * count {
        return None;
    }
    records
        .chunks_exact(RECORD)
        .map(|record| {
            let (&state, id) = record.split_first()?;
            let id = BlobId(id.try_into().ok()?);
            match state {
                NOT_REGISTERED => Some(None),
                REGISTERED => Some(Some((id, false))),
                AMBIGUOUS => Some(Some((id, true))),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYLOAD: &[u8] = b"XH00 a payload";

    fn record(states: &[u8]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&(PAYLOAD.len() as u64).to_le_bytes());
        bytes.extend_from_slice(PAYLOAD);
        for (i, &state) in states.iter().enumerate() {
            bytes.push(state);
            bytes.extend_from_slice(&[i as u8; 32]);
        }
        bytes
    }

    #[test]
    fn a_record_reads_back_what_it_holds() {
        let read = read_records(&record(&[1, 0, 2]), PAYLOAD, 3).unwrap();
        assert_eq!(read[0], Some((BlobId([0; 32]), false)));
        assert_eq!(read[1], None);
        assert_eq!(read[2], Some((BlobId([2; 32]), true)));
        assert_eq!(read_records(&record(&[]), PAYLOAD, 0).unwrap(), vec![]);
    }

    #[test]
    fn anything_else_reads_as_no_record() {
        let read = |bytes: &[u8], count| read_records(bytes, PAYLOAD, count);
        assert!(read(&record(&[1, 3]), 2).is_none(), "an unknown state");
        assert!(read(&record(&[1, 1]), 3).is_none(), "too few");
        assert!(read(&record(&[1, 1]), 1).is_none(), "too many");
        let mut other = record(&[1]);
        other[7] = 1;
        assert!(read(&other, 1).is_none(), "another version");
        assert!(read(&[], 0).is_none(), "no magic");
        assert!(
            read_records(&record(&[1]), b"XH00 a pAyload", 1).is_none(),
            "another payload of the same length"
        );
        assert!(
            read_records(&record(&[1]), b"XH00 a payload!", 1).is_none(),
            "a longer payload"
        );
        // Every cut and every byte value at every place: never a panic, and a record whose
        // length or payload was touched never reads.
        let whole = record(&[1, 0, 2]);
        for cut in 0..whole.len() {
            assert!(read(&whole[..cut], 3).is_none());
        }
        for at in 0..whole.len() {
            for value in [0u8, 1, 2, 3, 0x58, 0xff] {
                let mut bytes = whole.clone();
                bytes[at] = value;
                let read = read(&bytes, 3);
                if (8..16 + PAYLOAD.len()).contains(&at) && bytes[at] != whole[at] {
                    assert!(read.is_none(), "byte {at} set to {value}");
                }
            }
        }
    }
}
