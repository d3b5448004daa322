//! Content identities of unpacked weights: what a packed weight is looked up by.

use crate::named_data::{FileDataMap, NamedDataError, NamedDataMap};
use crate::sha256::{Sha256, finish, sha256, to_hex};
use sha2::Digest;
use std::fmt;

/// The identity of an unpacked blob: the sha256 of its bytes (or of a combination of blobs that
/// together decide a packing, e.g. quantized weights and their scales). All zeros means "none"
/// (no bias).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlobId(pub [u8; 32]);

impl std::hash::Hash for BlobId {
    /// The 32 bytes in one write: an array's derived hash writes its length first, a second
    /// call into the hasher for each of the identities every look-up and every launch's index
    /// hashes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

impl BlobId {
    /// No blob (a null bias).
    pub const NONE: BlobId = BlobId([0; 32]);

    /// The identity of `bytes`: hashes them (a cold-path operation).
    pub fn of_bytes(bytes: &[u8]) -> BlobId {
        BlobId(sha256(bytes))
    }

    /// The identity of f32 data (the sha256 of its little-endian bytes).
    pub fn of_f32s(values: &[f32]) -> BlobId {
        let mut h = Sha256::new();
        let mut buf = [0u8; 4096];
        for chunk in values.chunks(1024) {
            for (b, v) in buf.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 4]);
        }
        BlobId(finish(h))
    }

    /// The identity a key already states: ExecuTorch keys XNNPACK constants by the lowercase
    /// sha256 hex of their bytes, so no hashing is needed. None for any other key, upper-case
    /// hex included (ExecuTorch never writes it; one spelling per identity keeps one rule).
    pub fn from_sha256_key(key: &str) -> Option<BlobId> {
        let hex = key.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        // Each character's value, or 16 for one that is not lowercase hex: asked several times
        // per constant at every launch, a table and one test per key, not one per character.
        const NIBBLE: [u8; 256] = {
            let mut t = [16u8; 256];
            let mut c = 0;
            while c < 10 {
                t[b'0' as usize + c] = c as u8;
                c += 1;
            }
            let mut c = 0;
            while c < 6 {
                t[b'a' as usize + c] = 10 + c as u8;
                c += 1;
            }
            t
        };
        let mut out = [0u8; 32];
        let mut invalid = 0u8;
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            let (high, low) = (NIBBLE[pair[0] as usize], NIBBLE[pair[1] as usize]);
            invalid |= high | low;
            *o = high << 4 | (low & 15);
        }
        (invalid & 16 == 0).then_some(BlobId(out))
    }

    /// The identity a named-data key states, in ExecuTorch's XNNPACK conventions: a bare
    /// sha256 hex of the bytes, or `scale_<sha256 hex>` for quantization scales. This is the one
    /// rule for "this key is a content key": the packed-weight cache, the shared data cache and
    /// `xnnblob inspect` all ask it.
    pub fn from_named_key(key: &str) -> Option<BlobId> {
        BlobId::from_sha256_key(key.strip_prefix("scale_").unwrap_or(key))
    }

    /// The identity of `content` read as `description` says: everything besides the bytes that
    /// decides what XNNPACK packs from them (datatype, shape, quantization, and the operands
    /// packed with them). The same bytes under two descriptions are two identities, so a
    /// weight and its transposed twin, or two zero-initialised layers of different shapes,
    /// are never served each other's packing. `description` is the caller's canonical
    /// encoding ([`Description`]); hashed under a prefix of its own, the result is neither the
    /// content's identity nor a [`combine`](Self::combine)d or [`converted`](Self::converted)
    /// one.
    pub fn described(content: BlobId, description: &Description) -> BlobId {
        let mut h = Sha256::new();
        h.update(b"xnnblob-described-id");
        h.update((description.0.len() as u64).to_le_bytes());
        h.update(&description.0);
        h.update(content.0);
        BlobId(finish(h))
    }

    /// One identity for blobs that are packed together (order matters).
    pub fn combine(parts: &[BlobId]) -> BlobId {
        let mut h = Sha256::new();
        h.update(b"xnnblob-combined-id");
        for p in parts {
            h.update(p.0);
        }
        BlobId(finish(h))
    }

    /// The identity of the blob made from `source` by `conversion` (for example `"f16->f32"`,
    /// fp16 weights widened to fp32 where XNNPACK has no fp16 kernels): derived from the
    /// source's identity and the conversion's name, so the converted bytes need neither be
    /// made nor hashed to be looked up (a warm launch reads nothing). Hashed under a prefix of
    /// its own, it is not the identity of the source, of a combination, or of any other
    /// conversion; equal to [`BlobId::of_bytes`] of genuine data only through a sha256 collision.
    pub fn converted(source: BlobId, conversion: &str) -> BlobId {
        let mut h = Sha256::new();
        h.update(b"xnnblob-converted-id");
        h.update((conversion.len() as u64).to_le_bytes());
        h.update(conversion.as_bytes());
        h.update(source.0);
        BlobId(finish(h))
    }

    /// True for [`BlobId::NONE`], the identity that stands for no blob (a null bias).
    pub fn is_none(&self) -> bool {
        *self == BlobId::NONE
    }
}

/// A canonical encoding of what a blob is read as, for [`BlobId::described`]: named fields
/// of fixed-width little-endian numbers, each prefixed by its name and length, so that no two
/// different descriptions encode alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Description(Vec<u8>);

impl Description {
    /// An empty description, with room for a tensor's (a warm launch describes every value of
    /// every delegate: growing from empty was three or four allocations each).
    pub fn new() -> Description {
        Description(Vec::with_capacity(Self::TYPICAL_LEN))
    }

    /// Bytes a value's description takes, quantized with its scales' identity, at rank 4.
    const TYPICAL_LEN: usize = 224;

    /// Appends the field `name` with `value`'s bytes.
    pub fn bytes(&mut self, name: &str, value: &[u8]) -> &mut Description {
        self.field(name, value.len());
        self.0.extend_from_slice(value);
        self
    }

    /// Appends the field `name` with the numbers `values`, each as 8 little-endian bytes: the
    /// same encoding as [`bytes`](Self::bytes) of those bytes, written in place (a warm launch
    /// describes every constant it registers, so no buffer is made for them).
    pub fn numbers(&mut self, name: &str, values: &[u64]) -> &mut Description {
        self.numbers_from(name, values.iter().copied())
    }

    /// As [`numbers`](Self::numbers), from an iterator that knows its length (a tensor's
    /// dimensions, read from its flatbuffer without a copy).
    pub fn numbers_from(
        &mut self,
        name: &str,
        values: impl ExactSizeIterator<Item = u64>,
    ) -> &mut Description {
        self.field(name, values.len() * 8);
        for v in values {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// A field's head: its name, and the length of the value that follows.
    fn field(&mut self, name: &str, value_len: usize) {
        self.0.extend_from_slice(&(name.len() as u32).to_le_bytes());
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(&(value_len as u64).to_le_bytes());
    }

    /// Appends the field `name` with one number.
    pub fn number(&mut self, name: &str, value: u64) -> &mut Description {
        self.numbers(name, &[value])
    }

    /// The encoding so far.
    pub fn encoded(&self) -> &[u8] {
        &self.0
    }

    /// Appends the field `name` with an identity.
    pub fn id(&mut self, name: &str, id: BlobId) -> &mut Description {
        self.bytes(name, &id.0)
    }
}

impl fmt::Debug for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobId({})", &to_hex(&self.0)[..16])
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&to_hex(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_keys_parse_to_the_hash_of_the_bytes() {
        let bytes = b"weights";
        let key = to_hex(&sha256(bytes));
        assert_eq!(BlobId::from_sha256_key(&key), Some(BlobId::of_bytes(bytes)));
        assert_eq!(BlobId::from_sha256_key("layers.0.weight"), None);
        assert_eq!(BlobId::from_sha256_key(&key.to_uppercase()), None);
        assert_eq!(BlobId::from_sha256_key(&format!("scale_{key}")), None);
        assert_eq!(
            BlobId::from_named_key(&format!("scale_{key}")),
            Some(BlobId::of_bytes(bytes))
        );
        assert_eq!(BlobId::from_named_key(&key), Some(BlobId::of_bytes(bytes)));
        assert_eq!(BlobId::from_named_key(&format!("bias_{key}")), None);
        // One character that is not lowercase hex, anywhere, and the key states nothing.
        for at in 0..key.len() {
            for bad in ['g', 'G', 'A', '/', ':', '`', ' ', '\u{e9}'] {
                let mut k: Vec<char> = key.chars().collect();
                k[at] = bad;
                let k: String = k.into_iter().collect();
                assert_eq!(BlobId::from_sha256_key(&k), None, "{k}");
            }
        }
    }

    #[test]
    fn numbers_encode_as_the_bytes_of_their_little_endian_values() {
        let values = [0u64, 1, 0x0102_0304_0506_0708, u64::MAX];
        let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut by_numbers = Description::new();
        by_numbers.numbers("dims", &values).number("datatype", 7);
        let mut by_bytes = Description::new();
        by_bytes
            .bytes("dims", &le)
            .bytes("datatype", &7u64.to_le_bytes());
        assert_eq!(by_numbers, by_bytes);
        // The encoding identities are made of, spelled out: a change here re-packs every cache.
        let mut expected = Vec::new();
        expected.extend_from_slice(&4u32.to_le_bytes());
        expected.extend_from_slice(b"dims");
        expected.extend_from_slice(&32u64.to_le_bytes());
        expected.extend_from_slice(&le);
        expected.extend_from_slice(&8u32.to_le_bytes());
        expected.extend_from_slice(b"datatype");
        expected.extend_from_slice(&8u64.to_le_bytes());
        expected.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(by_numbers.encoded(), &expected[..]);
    }

    #[test]
    fn the_same_bytes_described_as_two_shapes_are_two_identities() {
        let content = BlobId::of_bytes(&[0u8; 64 * 128 * 4]);
        let shaped = |dims: &[u64]| {
            let mut d = Description::new();
            d.number("datatype", 1).numbers("dims", dims);
            BlobId::described(content, &d)
        };
        assert_ne!(shaped(&[64, 128]), shaped(&[128, 64]));
        assert_ne!(shaped(&[64, 128]), content);
        assert_eq!(shaped(&[64, 128]), shaped(&[64, 128]));
        // Field boundaries are part of the encoding: moving a byte across them changes it.
        let mut a = Description::new();
        a.bytes("ab", b"c");
        let mut b = Description::new();
        b.bytes("a", b"bc");
        assert_ne!(
            BlobId::described(content, &a),
            BlobId::described(content, &b)
        );
    }

    #[test]
    fn a_converted_identity_is_neither_its_source_nor_the_converted_bytes() {
        let fp16 = [0x00u8, 0x3c, 0x00, 0xc0]; // 1.0, -2.0
        let fp32: Vec<u8> = [1.0f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let source = BlobId::of_bytes(&fp16);
        let converted = BlobId::converted(source, "f16->f32");
        assert_ne!(converted, source);
        assert_ne!(converted, BlobId::of_bytes(&fp32));
        assert_ne!(converted, BlobId::combine(&[source]));
        assert_ne!(converted, BlobId::converted(source, "f16->bf16"));
        assert_ne!(
            converted,
            BlobId::converted(BlobId::of_bytes(&fp32), "f16->f32")
        );
        // Derived, not hashed from the converted bytes: the same at every launch.
        assert_eq!(converted, BlobId::converted(source, "f16->f32"));
    }
}

/// A key named by content whose bytes do not hash to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMismatch {
    /// The key, as the file names it.
    pub key: String,
    /// The sha256 of the bytes it holds, in hex.
    pub actual: String,
}

/// Checks every content-named key of `map` against the sha256 of its bytes (reading every such
/// blob: a by-hand check, `xnnblob inspect --verify-keys`). A packed-weight cache takes such a key
/// as the blob's identity without hashing, so a file edited after export under the same keys
/// would be served the old packing. Returns how many keys were checked and which did not match.
pub fn verify_keys(map: &FileDataMap) -> Result<(usize, Vec<KeyMismatch>), NamedDataError> {
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for i in 0..map.num_keys() {
        let key = map.key_at(i)?;
        // The one rule for content keys (`BlobId::from_named_key`), as the caches use it.
        let Some(claimed) = BlobId::from_named_key(key) else {
            continue;
        };
        checked += 1;
        let actual = BlobId::of_bytes(map.get_data(key)?.data());
        if actual != claimed {
            mismatches.push(KeyMismatch {
                key: key.to_string(),
                actual: actual.to_string(),
            });
        }
    }
    Ok((checked, mismatches))
}

#[cfg(test)]
mod verify_keys_tests {
    use super::*;
    use crate::named_data::{FileKind, NamedBlobStore};
    use crate::sha256::{sha256, to_hex};

    #[test]
    fn a_blob_edited_under_its_content_key_is_reported() {
        let weights = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let key = to_hex(&sha256(&weights));
        let scales = [9u8; 16];
        let scale_key = format!("scale_{}", to_hex(&sha256(&scales)));
        let build = |w: &[u8]| {
            let mut store = NamedBlobStore::new();
            store.add_named_blob(&key, w, 16, "t", None).unwrap();
            store
                .add_named_blob(&scale_key, &scales, 16, "t", None)
                .unwrap();
            store
                .add_named_blob("not_content_named", &[0u8; 4], 16, "t", None)
                .unwrap();
            FileDataMap::from_bytes(&store.serialize("t").unwrap(), Some(FileKind::Ptd), "t")
                .unwrap()
        };
        assert_eq!(verify_keys(&build(&weights)).unwrap(), (2, vec![]));
        let mut edited = weights;
        edited[3] = 0;
        let (checked, bad) = verify_keys(&build(&edited)).unwrap();
        assert_eq!(checked, 2);
        assert_eq!(
            bad,
            vec![KeyMismatch {
                key: key.clone(),
                actual: to_hex(&sha256(&edited))
            }]
        );
    }
}
