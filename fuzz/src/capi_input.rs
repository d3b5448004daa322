//! The `capi` target's input: which C calls to make, the key, sizes and digest to pass them,
//! then the bytes of the file the C ABI opens (as named data, as a packed-weight cache, or both).

use crate::reader::Reader;

/// Open the file with `xnnblob_map_open` and walk its keys.
pub const MAP: u8 = 1;
/// Open the file as a packed-weight cache.
pub const CACHE: u8 = 2;
/// Before opening it as a cache, stamp the file with this build's XNNPACK identifier and CPU
/// fingerprint and fix its checksums, so that mutations reach past the header.
pub const FIX_HEADER: u8 = 4;
/// Open the cache through `xnnblob_backend_new` and `xnnblob_backend_cache`.
pub const VIA_BACKEND: u8 = 8;
/// Finalize the cache (a save) and wait for the save.
pub const FINALIZE: u8 = 16;
/// Register blob bytes under a digest the input gives, instead of hashing them.
pub const GIVEN_DIGEST: u8 = 32;
/// The top bit: the backend's thread count, 0 or 1 (the calling thread either way). A pool of
/// more threads parses nothing, and creating one per input halved the target's speed.
pub const THREADS_SHIFT: u8 = 7;

/// A decoded input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapiInput<'a> {
    /// The bits above.
    pub flags: u8,
    /// A key to look up (cut at its first NUL, as a C string would be).
    pub key: &'a [u8],
    /// The destination size for `xnnblob_map_load_into` with [`key`](Self::key).
    pub size: u16,
    /// An index for `xnnblob_map_key_at`, past the keys or not.
    pub index: u8,
    /// How many leading bytes of the file to register as a blob with the cache.
    pub register: u16,
    /// The digest to register them under (with [`GIVEN_DIGEST`]).
    pub digest: [u8; 32],
    /// The file's bytes.
    pub file: &'a [u8],
}

impl<'a> CapiInput<'a> {
    /// The input any bytes stand for.
    pub fn decode(bytes: &'a [u8]) -> CapiInput<'a> {
        let mut r = Reader::new(bytes);
        let flags = r.u8();
        let key_len = usize::from(r.u8());
        let key = r.take(key_len);
        let size = r.u16();
        let index = r.u8();
        let register = r.u16();
        let mut digest = [0u8; 32];
        if flags & GIVEN_DIGEST != 0 {
            let d = r.take(32);
            digest[..d.len()].copy_from_slice(d);
        }
        CapiInput {
            flags,
            key: key.split(|&b| b == 0).next().unwrap_or(&[]),
            size,
            index,
            register,
            digest,
            file: r.rest(),
        }
    }

    /// Bytes that [`decode`](Self::decode) to this input (the key must hold no NUL and at most
    /// 255 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.flags, self.key.len() as u8];
        out.extend_from_slice(self.key);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.push(self.index);
        out.extend_from_slice(&self.register.to_le_bytes());
        if self.flags & GIVEN_DIGEST != 0 {
            out.extend_from_slice(&self.digest);
        }
        out.extend_from_slice(self.file);
        out
    }

    /// The backend's thread count (0 or 1).
    pub fn threads(&self) -> u32 {
        u32::from(self.flags >> THREADS_SHIFT)
    }
}
