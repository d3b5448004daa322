//! The packed-weight cache file, as `docs/cache-format.md` specifies it. Pure functions over
//! bytes: [`decode`] validates everything a warm launch relies on; [`Writer`] produces a file.
//!
//! ```text
//! [0, 128)            header: magic, version, CPU fingerprint, XNNPACK build id, checksum
//! [128, index)        packed regions, each at a multiple of 64
//! [index, sources)    entries, 104 bytes each
//! [sources, trailer)  data files whose keys were checked, 32 bytes each
//! [len - 48, len)     trailer: index offset, entry count, index checksum, source count, end magic
//! ```

use super::checksum::checksum64;
use super::identity::BlobId;
use crate::mmap::FileIdentity;
use std::io::{self, Write};

/// The first 8 bytes of every cache file: marks it as an xnnblob packed-weight cache.
pub const MAGIC: [u8; 8] = *b"XBPWCAC\x01";
/// The last 8 bytes of a complete cache file; their absence means a torn or truncated file.
pub const END_MAGIC: [u8; 8] = *b"XBPWEND\x01";
/// Bump on any change of layout or meaning; older or newer files are rebuilt.
pub const FORMAT_VERSION: u32 = 5;
/// Packed regions start at multiples of this (XNNPACK's largest SIMD alignment).
pub const REGION_ALIGNMENT: usize = 64;
/// The seed of an entry that holds a constant's own bytes, not packed weights: one XNNPACK
/// reads at every launch (a bias, a scale), kept so that a warm launch in a host whose data map
/// costs a system call per constant (ExecuTorch's) reads it from the cache file instead. Its
/// kernel is the constant's content identity, its bias [`KEPT_CONSTANT_BIAS`].
pub const KEPT_CONSTANT_SEED: u32 = 0x6b65_7074;
/// The bias of an entry that keeps a constant: no registered bias has this identity (every one
/// is a sha256, of bytes or of a description), so no look-up of XNNPACK's finds the entry and
/// no packed weight is found by it, without hashing anything at each launch.
pub const KEPT_CONSTANT_BIAS: BlobId = BlobId(*b"xnnblob: a kept constant, no sha");
/// The most bytes of the XNNPACK build identifier the header holds; longer identifiers are
/// truncated to this many, both when written and when compared.
pub const MAX_BUILD_ID: usize = 64;

// Header fields.
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const HEADER_SIZE_AT: usize = VERSION_AT + 4;
const CPU_AT: usize = HEADER_SIZE_AT + 4;
const BUILD_ID_LEN_AT: usize = CPU_AT + 8;
const RESERVED_AT: usize = BUILD_ID_LEN_AT + 4;
const BUILD_ID_AT: usize = RESERVED_AT + 4;
/// Size in bytes of the header at the start of the file; packed regions start after it.
pub const HEADER_SIZE: usize = 128;
/// Last in the header, covering every byte before it (reserved bytes must stay as written).
const HEADER_CHECKSUM_AT: usize = HEADER_SIZE - 8;
const _: () = assert!(BUILD_ID_AT + MAX_BUILD_ID <= HEADER_CHECKSUM_AT);

// Entry fields.
const KERNEL_AT: usize = 0;
const BIAS_AT: usize = KERNEL_AT + 32;
const SEED_AT: usize = BIAS_AT + 32;
const FLAGS_AT: usize = SEED_AT + 4;
const OFFSET_AT: usize = FLAGS_AT + 4;
const SIZE_AT: usize = OFFSET_AT + 8;
const CHECKSUM_AT: usize = SIZE_AT + 8;
const LAST_USED_AT: usize = CHECKSUM_AT + 8;
/// Size in bytes of one index entry (kernel id, bias id, seed, flags, offset, size, checksum,
/// last use).
pub const ENTRY_SIZE: usize = LAST_USED_AT + 8;

// Source fields.
const DEVICE_AT: usize = 0;
const INODE_AT: usize = DEVICE_AT + 8;
const FILE_SIZE_AT: usize = INODE_AT + 8;
const MODIFIED_AT: usize = FILE_SIZE_AT + 8;
/// Size in bytes of one source record (device, inode, size, modification time).
pub const SOURCE_SIZE: usize = MODIFIED_AT + 8;
/// The most source records a file keeps (the most recently checked first).
pub const MAX_SOURCES: usize = 256;

// Trailer fields.
const INDEX_OFFSET_AT: usize = 0;
const COUNT_AT: usize = INDEX_OFFSET_AT + 8;
const INDEX_CHECKSUM_AT: usize = COUNT_AT + 8;
const SOURCE_COUNT_AT: usize = INDEX_CHECKSUM_AT + 8;
const TRAILER_RESERVED_AT: usize = SOURCE_COUNT_AT + 8;
const END_MAGIC_AT: usize = TRAILER_RESERVED_AT + 8;
/// Size in bytes of the trailer at the end of the file (index offset, entry count, index
/// checksum, source count, reserved, end magic).
pub const TRAILER_SIZE: usize = END_MAGIC_AT + 8;

/// What a packed weight is looked up by: the identities of its unpacked kernel and bias, and
/// XNNPACK's seed (its packing parameters). Keys are ordered by kernel, then bias (their bytes
/// compared in order), then seed: the order of a file's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryKey {
    /// Content id of the unpacked kernel (the weights XNNPACK packs).
    pub kernel: BlobId,
    /// Content id of the unpacked bias; [`BlobId::NONE`] when the operator has none.
    pub bias: BlobId,
    /// XNNPACK's look-up seed: a hash of the operator's packing parameters (tiling,
    /// transposition, type), so another packing of the same weights is another entry.
    pub seed: u32,
}

impl std::hash::Hash for EntryKey {
    /// The whole key in one write (its fields one by one were five calls into the hasher, each
    /// identity's length among them): a launch hashes each entry of its file's index and each
    /// weight it looks up.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut bytes = [0u8; 68];
        bytes[..32].copy_from_slice(&self.kernel.0);
        bytes[32..64].copy_from_slice(&self.bias.0);
        bytes[64..].copy_from_slice(&self.seed.to_le_bytes());
        state.write(&bytes);
    }
}

impl EntryKey {
    /// Whether the entry keeps a constant's own bytes rather than packed weights (see
    /// [`KEPT_CONSTANT_SEED`]).
    pub fn keeps_constant(&self) -> bool {
        self.seed == KEPT_CONSTANT_SEED && self.bias == KEPT_CONSTANT_BIAS
    }
}

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileEntry {
    /// What the packed weights are looked up by.
    pub key: EntryKey,
    /// Byte offset of the packed region from the start of the cache file (a multiple of
    /// [`REGION_ALIGNMENT`]).
    pub offset: u64,
    /// Length of the packed region in bytes.
    pub size: u64,
    /// XXH3-64 (seed 0) of the region's packed bytes: checked when a file is rewritten or
    /// verified, not when it is loaded.
    pub checksum: u64,
    /// The number of the last save whose process used the entry (looked it up or packed it).
    /// Saves are numbered in the file, one more than the largest number in it, so the entry with
    /// the smallest number is the one not used for longest; evictions take those first.
    pub last_used: u64,
}

/// What must match for a file to be trusted at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compat {
    /// The identifier of the XNNPACK build the file must have been packed by
    /// (`xnn_experimental_get_build_identifier_data`); only its first [`MAX_BUILD_ID`] bytes are
    /// stored and compared.
    pub build_id: Vec<u8>,
    /// The CPU feature bits that select XNNPACK's microkernels (see
    /// [`cpu_fingerprint`](super::cpu_fingerprint)).
    pub cpu_fingerprint: u64,
}

/// Why a whole file was rejected (it is then rebuilt).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The file is too short to hold a header and a trailer.
    #[error("{len} bytes is shorter than header and trailer")]
    TooShort {
        /// Length of the file in bytes.
        len: usize,
    },
    /// The file does not start with [`MAGIC`]: it is not a packed-weight cache.
    #[error("not an xnnblob packed-weight cache (bad magic)")]
    BadMagic,
    /// The file is in another format version than [`FORMAT_VERSION`], older or newer.
    #[error("format version {found}, this build reads {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The format version the file's header states.
        found: u32,
    },
    /// The header states another header size than [`HEADER_SIZE`].
    #[error("header size {found}, expected {HEADER_SIZE}")]
    BadHeaderSize {
        /// The header size in bytes that the file's header states.
        found: u32,
    },
    /// The header's checksum does not match the header bytes before it (a damaged header).
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The file's XNNPACK build identifier is not the expected one (or its stated length exceeds
    /// [`MAX_BUILD_ID`]): its packing code may differ.
    #[error("packed by another XNNPACK build")]
    BuildMismatch,
    /// The file was packed for a CPU on which XNNPACK may select other microkernels: its
    /// fingerprint differs. The message says in what
    /// ([`cpu_fingerprint_difference`](super::cpu_fingerprint_difference)).
    #[error(
        "packed for CPU features {file:#x}, this CPU has {this:#x}: {}",
        super::cpu_fingerprint_difference(*.file, *.this)
    )]
    CpuMismatch {
        /// The CPU fingerprint recorded in the file's header.
        file: u64,
        /// The CPU fingerprint expected: this CPU's, unless the cache options override it.
        this: u64,
    },
    /// The file does not end with [`END_MAGIC`]: a torn, truncated or extended file.
    #[error("no valid trailer (torn or partial file)")]
    BadTrailer,
    /// The trailer's index offset and entry count do not describe an index that starts after the
    /// header and ends exactly where the trailer starts.
    #[error("index lies outside the file")]
    IndexOutOfBounds,
    /// The index bytes do not match the trailer's checksum (a damaged index).
    #[error("index checksum mismatch")]
    IndexChecksum,
}

/// Why one entry was dropped (it is then repacked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryProblem {
    /// Its offset is not a multiple of [`REGION_ALIGNMENT`].
    Misaligned,
    /// Its region does not lie between the header and the index (or offset plus size overflows).
    OutOfBounds,
    /// Its region overlaps the region of an entry earlier in the file, which is kept.
    Overlaps,
    /// An earlier entry in the index has the same key.
    Duplicate,
    /// Its flags field is not zero: it uses a feature this version does not know.
    Reserved,
}

/// A validated file: entries whose regions lie inside the data area, aligned, disjoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The entries that passed every check, in the index's order: ascending by key in every
    /// file this build writes.
    pub entries: Vec<FileEntry>,
    /// The data files whose named keys were checked against their bytes: a key of one of these
    /// (same device, inode, size and mtime) is taken as its bytes' sha256 without hashing.
    pub sources: Vec<FileIdentity>,
    /// The entries that failed one: their position in the file's index (`usize::MAX` for
    /// [`EntryProblem::Overlaps`]) and why.
    pub dropped: Vec<(usize, EntryProblem)>,
}

// Every read below is of a range the caller checked is inside the file (header, index and
// trailer sizes are checked first).
fn u32_at(b: &[u8], at: usize) -> u32 {
    crate::le::u32_at(b, at).expect("a field inside a checked range")
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    crate::le::u64_at(b, at).expect("a field inside a checked range")
}

fn id_at(b: &[u8], at: usize) -> BlobId {
    BlobId(crate::le::array_at(b, at).expect("a field inside a checked range"))
}

/// The header bytes for `compat`.
pub fn encode_header(compat: &Compat) -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    let id = &compat.build_id[..compat.build_id.len().min(MAX_BUILD_ID)];
    h[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(&MAGIC);
    h[VERSION_AT..VERSION_AT + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[HEADER_SIZE_AT..HEADER_SIZE_AT + 4].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    h[CPU_AT..CPU_AT + 8].copy_from_slice(&compat.cpu_fingerprint.to_le_bytes());
    h[BUILD_ID_LEN_AT..BUILD_ID_LEN_AT + 4].copy_from_slice(&(id.len() as u32).to_le_bytes());
    h[BUILD_ID_AT..BUILD_ID_AT + id.len()].copy_from_slice(id);
    let sum = checksum64(&h[..HEADER_CHECKSUM_AT]);
    h[HEADER_CHECKSUM_AT..HEADER_CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    h
}

fn encode_entry(e: &FileEntry) -> [u8; ENTRY_SIZE] {
    let mut b = [0u8; ENTRY_SIZE];
    b[KERNEL_AT..KERNEL_AT + 32].copy_from_slice(&e.key.kernel.0);
    b[BIAS_AT..BIAS_AT + 32].copy_from_slice(&e.key.bias.0);
    b[SEED_AT..SEED_AT + 4].copy_from_slice(&e.key.seed.to_le_bytes());
    b[OFFSET_AT..OFFSET_AT + 8].copy_from_slice(&e.offset.to_le_bytes());
    b[SIZE_AT..SIZE_AT + 8].copy_from_slice(&e.size.to_le_bytes());
    b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&e.checksum.to_le_bytes());
    b[LAST_USED_AT..LAST_USED_AT + 8].copy_from_slice(&e.last_used.to_le_bytes());
    b
}

/// Where `bytes`' header, index and trailer claim to be, read from the trailer without checking
/// anything: for asking the kernel to read those bytes in, never for trusting them ([`decode`]
/// validates).
pub fn metadata_ranges(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let len = bytes.len();
    if len < HEADER_SIZE + TRAILER_SIZE {
        // Too short to hold the layout: the whole file is the metadata.
        return std::iter::once(0..len).collect();
    }
    // The index and the trailer after it as one range: one request for both.
    let index_offset = u64_at(&bytes[len - TRAILER_SIZE..], INDEX_OFFSET_AT);
    let tail = match usize::try_from(index_offset) {
        Ok(start) if (HEADER_SIZE..len - TRAILER_SIZE).contains(&start) => start,
        _ => len - TRAILER_SIZE,
    };
    vec![0..HEADER_SIZE, tail..len]
}

/// The XNNPACK build and CPU a file says it was packed for, read from its header (None if the
/// header is not one this build reads): what to [`decode`] it against to read a file of
/// another CPU (`xnnblob prepack`'s bundles, tools that compare files). Nothing else of the file
/// is checked here.
pub fn recorded_compat(bytes: &[u8]) -> Option<Compat> {
    let h = bytes.get(..HEADER_SIZE)?;
    if h[MAGIC_AT..MAGIC_AT + 8] != MAGIC
        || u32_at(h, VERSION_AT) != FORMAT_VERSION
        || u64_at(h, HEADER_CHECKSUM_AT) != checksum64(&h[..HEADER_CHECKSUM_AT])
    {
        return None;
    }
    let id_len = u32_at(h, BUILD_ID_LEN_AT) as usize;
    Some(Compat {
        build_id: h
            .get(BUILD_ID_AT..BUILD_ID_AT + id_len.min(MAX_BUILD_ID))?
            .to_vec(),
        cpu_fingerprint: u64_at(h, CPU_AT),
    })
}

/// Validates a whole file: header, trailer, index checksum, then each entry. Reads the header,
/// the index and the trailer only, never the packed bytes.
pub fn decode(bytes: &[u8], expect: &Compat) -> Result<Decoded, FileError> {
    decode_matching(bytes, expect, CpuMatch::Exact)
}

/// How a file's CPU fingerprint must match the one expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMatch {
    /// Equal: the file was packed on a CPU that reports what this one does, for everything
    /// XNNPACK's choice reads. A cache's own file.
    Exact,
    /// The same packing class ([`packing_class`](super::packing_class)): XNNPACK picks the same
    /// packed layouts on both, though the CPUs differ (other models of one kernel class). A
    /// read-only layer made ahead of time for a class of devices (`xnnblob prepack`).
    PackingClass,
}

/// As [`decode`], with the file's CPU fingerprint matched as `cpu` says.
pub fn decode_matching(bytes: &[u8], expect: &Compat, cpu: CpuMatch) -> Result<Decoded, FileError> {
    let len = bytes.len();
    if len < HEADER_SIZE + TRAILER_SIZE {
        return Err(FileError::TooShort { len });
    }
    let h = &bytes[..HEADER_SIZE];
    if h[MAGIC_AT..MAGIC_AT + 8] != MAGIC {
        return Err(FileError::BadMagic);
    }
    let version = u32_at(h, VERSION_AT);
    if version != FORMAT_VERSION {
        return Err(FileError::UnsupportedVersion { found: version });
    }
    let header_size = u32_at(h, HEADER_SIZE_AT);
    if header_size as usize != HEADER_SIZE {
        return Err(FileError::BadHeaderSize { found: header_size });
    }
    if u64_at(h, HEADER_CHECKSUM_AT) != checksum64(&h[..HEADER_CHECKSUM_AT]) {
        return Err(FileError::HeaderChecksum);
    }
    let id_len = u32_at(h, BUILD_ID_LEN_AT) as usize;
    let expected_id = &expect.build_id[..expect.build_id.len().min(MAX_BUILD_ID)];
    if id_len > MAX_BUILD_ID || &h[BUILD_ID_AT..BUILD_ID_AT + id_len] != expected_id {
        return Err(FileError::BuildMismatch);
    }
    let file_cpu = u64_at(h, CPU_AT);
    let matches = match cpu {
        CpuMatch::Exact => file_cpu == expect.cpu_fingerprint,
        CpuMatch::PackingClass => {
            super::packing_class(file_cpu) == super::packing_class(expect.cpu_fingerprint)
        }
    };
    let cpu = file_cpu;
    if !matches {
        return Err(FileError::CpuMismatch {
            file: cpu,
            this: expect.cpu_fingerprint,
        });
    }

    let t = &bytes[len - TRAILER_SIZE..];
    if t[END_MAGIC_AT..END_MAGIC_AT + 8] != END_MAGIC {
        return Err(FileError::BadTrailer);
    }
    let index_offset = u64_at(t, INDEX_OFFSET_AT);
    let count = u64_at(t, COUNT_AT);
    let source_count = u64_at(t, SOURCE_COUNT_AT);
    let entries_end = count
        .checked_mul(ENTRY_SIZE as u64)
        .and_then(|n| n.checked_add(index_offset));
    let index_end = source_count
        .checked_mul(SOURCE_SIZE as u64)
        .and_then(|n| n.checked_add(entries_end?));
    // The index and sources must end exactly where the trailer starts: a file cut or extended
    // anywhere fails here or at the magic.
    if index_offset < HEADER_SIZE as u64 || index_end != Some((len - TRAILER_SIZE) as u64) {
        return Err(FileError::IndexOutOfBounds);
    }
    let whole_index = &bytes[index_offset as usize..len - TRAILER_SIZE];
    if u64_at(t, INDEX_CHECKSUM_AT) != checksum64(whole_index)
        || u64_at(t, TRAILER_RESERVED_AT) != 0
    {
        return Err(FileError::IndexChecksum);
    }
    let (index, source_bytes) = whole_index.split_at(count as usize * ENTRY_SIZE);
    let sources = source_bytes
        .chunks_exact(SOURCE_SIZE)
        .map(|raw| FileIdentity {
            device: u64_at(raw, DEVICE_AT),
            inode: u64_at(raw, INODE_AT),
            size: u64_at(raw, FILE_SIZE_AT),
            modified_ns: u64_at(raw, MODIFIED_AT),
        })
        .collect();

    let mut entries: Vec<FileEntry> = Vec::with_capacity(count as usize);
    let mut dropped = Vec::new();
    // The kept keys' set, made only once they are found out of key order (see `repeats`).
    let mut seen = None;
    for (i, raw) in index.chunks_exact(ENTRY_SIZE).enumerate() {
        let e = FileEntry {
            key: EntryKey {
                kernel: id_at(raw, KERNEL_AT),
                bias: id_at(raw, BIAS_AT),
                seed: u32_at(raw, SEED_AT),
            },
            offset: u64_at(raw, OFFSET_AT),
            size: u64_at(raw, SIZE_AT),
            checksum: u64_at(raw, CHECKSUM_AT),
            last_used: u64_at(raw, LAST_USED_AT),
        };
        let end = e.offset.checked_add(e.size);
        let problem = if u32_at(raw, FLAGS_AT) != 0 {
            Some(EntryProblem::Reserved)
        } else if !e.offset.is_multiple_of(REGION_ALIGNMENT as u64) {
            Some(EntryProblem::Misaligned)
        } else if e.offset < HEADER_SIZE as u64 || end.is_none_or(|end| end > index_offset) {
            Some(EntryProblem::OutOfBounds)
        } else if repeats(&mut seen, &entries, e.key, count as usize) {
            Some(EntryProblem::Duplicate)
        } else {
            None
        };
        match problem {
            Some(p) => dropped.push((i, p)),
            None => entries.push(e),
        }
    }
    drop(seen);
    // Regions must not overlap: keep the first of any overlapping pair in file order, walking
    // the entries by offset; the kept ones stay in the index's order.
    // Offset and position in one integer each: sorted as plain numbers, ties in index order.
    let mut by_offset: Vec<u128> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (u128::from(e.offset) << 64) | i as u128)
        .collect();
    by_offset.sort_unstable();
    let mut overlapping = vec![false; entries.len()];
    let mut kept_end = 0u64;
    for i in by_offset.iter().map(|&o| o as u64 as usize) {
        let e = &entries[i];
        if e.offset < kept_end {
            overlapping[i] = true;
            dropped.push((usize::MAX, EntryProblem::Overlaps));
        } else {
            kept_end = e.offset + e.size;
        }
    }
    drop(by_offset);
    let mut at = 0;
    entries.retain(|_| {
        at += 1;
        !overlapping[at - 1]
    });
    Ok(Decoded {
        entries,
        sources,
        dropped,
    })
}

/// Whether `key` repeats a key of `kept`, the entries kept so far. Kept keys in ascending order
/// (every file this build writes) repeat none, as one comparison with the last shows; from the
/// first key out of that order on, they are hashed into `seen` (room for `count`).
fn repeats(
    seen: &mut Option<crate::fast_hash::FastSet<EntryKey>>,
    kept: &[FileEntry],
    key: EntryKey,
    count: usize,
) -> bool {
    if seen.is_none() && kept.last().is_none_or(|last| last.key < key) {
        return false;
    }
    let set = seen.get_or_insert_with(|| {
        let mut set = crate::fast_hash::FastSet::default();
        set.reserve(count);
        set.extend(kept.iter().map(|e| e.key));
        set
    });
    !set.insert(key)
}

/// Streams a cache file: header, then packed regions, then index and trailer.
pub struct Writer<W: Write> {
    out: W,
    pos: u64,
    entries: Vec<FileEntry>,
}

impl<W: Write> Writer<W> {
    /// Starts a cache file on `out`: writes the header for `compat`.
    pub fn new(mut out: W, compat: &Compat) -> io::Result<Writer<W>> {
        out.write_all(&encode_header(compat))?;
        Ok(Writer {
            out,
            pos: HEADER_SIZE as u64,
            entries: Vec::new(),
        })
    }

    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        let padded = self.pos.next_multiple_of(alignment);
        let zeros = [0u8; REGION_ALIGNMENT];
        while self.pos < padded {
            let n = ((padded - self.pos) as usize).min(zeros.len());
            self.out.write_all(&zeros[..n])?;
            self.pos += n as u64;
        }
        Ok(())
    }

    /// Appends one packed region with its checksum and the number of the save that last used
    /// it; returns its file offset.
    pub fn add(
        &mut self,
        key: EntryKey,
        data: &[u8],
        checksum: u64,
        last_used: u64,
    ) -> io::Result<u64> {
        self.pad_to(REGION_ALIGNMENT as u64)?;
        let offset = self.pos;
        self.out.write_all(data)?;
        self.pos += data.len() as u64;
        self.entries.push(FileEntry {
            key,
            offset,
            size: data.len() as u64,
            checksum,
            last_used,
        });
        Ok(offset)
    }

    /// Writes the index, the `sources` (at most [`MAX_SOURCES`], the first ones) and the
    /// trailer; returns the writer and the file length.
    pub fn finish(mut self, sources: &[FileIdentity]) -> io::Result<(W, u64)> {
        self.pad_to(8)?;
        // In key order: a launch searches the index in place (`docs/cache-format.md`).
        self.entries.sort_by_key(|e| e.key);
        let index_offset = self.pos;
        let index = encode_index(&self.entries, sources, index_offset);
        self.out.write_all(&index)?;
        Ok((self.out, index_offset + index.len() as u64))
    }
}

/// Encodes an index with `entries` and `sources` (at most [`MAX_SOURCES`], the first ones) and
/// its trailer, for an index at `index_offset`: what [`Writer::finish`] writes, and what tools
/// and tests that rewrite keys without moving data put at `index_offset`.
pub fn encode_index(entries: &[FileEntry], sources: &[FileIdentity], index_offset: u64) -> Vec<u8> {
    let sources = &sources[..sources.len().min(MAX_SOURCES)];
    let mut out =
        Vec::with_capacity(entries.len() * ENTRY_SIZE + sources.len() * SOURCE_SIZE + TRAILER_SIZE);
    for e in entries {
        out.extend_from_slice(&encode_entry(e));
    }
    for s in sources {
        for field in [s.device, s.inode, s.size, s.modified_ns] {
            out.extend_from_slice(&field.to_le_bytes());
        }
    }
    let mut t = [0u8; TRAILER_SIZE];
    t[INDEX_OFFSET_AT..INDEX_OFFSET_AT + 8].copy_from_slice(&index_offset.to_le_bytes());
    t[COUNT_AT..COUNT_AT + 8].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    t[INDEX_CHECKSUM_AT..INDEX_CHECKSUM_AT + 8].copy_from_slice(&checksum64(&out).to_le_bytes());
    t[SOURCE_COUNT_AT..SOURCE_COUNT_AT + 8].copy_from_slice(&(sources.len() as u64).to_le_bytes());
    t[END_MAGIC_AT..END_MAGIC_AT + 8].copy_from_slice(&END_MAGIC);
    out.extend_from_slice(&t);
    out
}

/// The file `bytes` with its index replaced by `entries` (its packed data and sources as they
/// were), each entry's checksum recomputed over the bytes its region now names where that lies
/// before the index: a file consistent in every checksum, whatever its entries claim. What
/// tools that rewrite keys in place, and the tests and fuzz target that craft lying files
/// (docs/cache-format.md, threat model), write. None if `bytes` has no index to replace.
pub fn reindexed(bytes: &[u8], entries: &[FileEntry], sources: &[FileIdentity]) -> Option<Vec<u8>> {
    let index = index_offset(bytes)?;
    let data = bytes.get(..usize::try_from(index).ok()?)?;
    let entries: Vec<FileEntry> = entries
        .iter()
        .map(|e| {
            let region = e
                .offset
                .checked_add(e.size)
                .filter(|&end| end <= index)
                .map(|end| &data[e.offset as usize..end as usize]);
            FileEntry {
                checksum: region.map_or(e.checksum, checksum64),
                ..*e
            }
        })
        .collect();
    let mut out = data.to_vec();
    out.extend_from_slice(&encode_index(&entries, sources, index));
    Some(out)
}

/// Where the index starts, per the trailer (no validation beyond the length).
pub fn index_offset(bytes: &[u8]) -> Option<u64> {
    let t = bytes.get(bytes.len().checked_sub(TRAILER_SIZE)?..)?;
    Some(u64_at(t, INDEX_OFFSET_AT))
}

/// The number `word` spells, if it is its one spelling (no sign, no leading zero), so that a
/// record is one line of text.
fn number<T: std::str::FromStr + ToString>(word: Option<&str>) -> Option<T> {
    let word = word?;
    let n: T = word.parse().ok()?;
    (n.to_string() == word).then_some(n)
}

/// What the record beside a cache file (`PATH.checked`) holds: the status of the file when
/// every packed byte of it was last checked against its checksum. A launch that finds the file
/// in this status hashes nothing (docs/cache-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedRecord {
    /// The device the file is on.
    pub device: u64,
    /// Its inode number.
    pub inode: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Its change time (`ctime`), in nanoseconds since the Unix epoch.
    pub changed_ns: i128,
}

impl CheckedRecord {
    /// The record's first word: a file that does not start with it is not a record.
    pub const MAGIC: &'static str = "xnnblob-cache-checked";

    /// The record as written: one line, `MAGIC 1 device inode size changed_ns`.
    pub fn to_text(&self) -> String {
        format!(
            "{} 1 {} {} {} {}\n",
            Self::MAGIC,
            self.device,
            self.inode,
            self.size,
            self.changed_ns
        )
    }

    /// The record `bytes` hold, or None for anything else: another version, a torn line, text
    /// around it.
    pub fn parse(bytes: &[u8]) -> Option<CheckedRecord> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.strip_suffix('\n')?.split(' ');
        if words.next()? != Self::MAGIC || words.next()? != "1" {
            return None;
        }
        let record = CheckedRecord {
            device: number(words.next())?,
            inode: number(words.next())?,
            size: number(words.next())?,
            changed_ns: number(words.next())?,
        };
        words.next().is_none().then_some(record)
    }
}

/// What is remembered of a cache file that cannot be written (an app's read-only bundle) once
/// its packed bytes were checked: the file's status, as [`CheckedRecord`] has it, and where in
/// the file the entries that failed their checksum lie. It is kept where the user can write
/// (docs/cache-format.md), so that a launch that finds the file in this status forgets those
/// entries before any look-up and hashes nothing: the damage is served at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamageRecord {
    /// The file's status when it was checked.
    pub file: CheckedRecord,
    /// The offsets of the entries whose packed bytes failed their checksum, ascending.
    pub damaged: Vec<u64>,
}

impl DamageRecord {
    /// The record's first word.
    pub const MAGIC: &'static str = "xnnblob-cache-damage";

    /// The most damaged entries a record lists: more than that and the file is not worth
    /// remembering piecemeal (it is checked again at each launch).
    pub const MAX_DAMAGED: usize = 256;

    /// The record as written: one line, `MAGIC 1 device inode size changed_ns count offsets...`.
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "{} 1 {} {} {} {} {}",
            Self::MAGIC,
            self.file.device,
            self.file.inode,
            self.file.size,
            self.file.changed_ns,
            self.damaged.len()
        );
        for offset in &self.damaged {
            text.push_str(&format!(" {offset}"));
        }
        text.push('\n');
        text
    }

    /// The record `bytes` hold, or None for anything else (another version, a torn line,
    /// offsets out of order or too many).
    pub fn parse(bytes: &[u8]) -> Option<DamageRecord> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.strip_suffix('\n')?.split(' ');
        if words.next()? != Self::MAGIC || words.next()? != "1" {
            return None;
        }
        let file = CheckedRecord {
            device: number(words.next())?,
            inode: number(words.next())?,
            size: number(words.next())?,
            changed_ns: number(words.next())?,
        };
        let count: usize = number(words.next())?;
        if count > Self::MAX_DAMAGED {
            return None;
        }
        let damaged = (0..count)
            .map(|_| number::<u64>(words.next()))
            .collect::<Option<Vec<u64>>>()?;
        let ascending = damaged.windows(2).all(|w| w[0] < w[1]);
        (ascending && words.next().is_none()).then_some(DamageRecord { file, damaged })
    }
}

#[cfg(test)]
mod tests {
    use super::{
        CheckedRecord, Compat, DamageRecord, EntryKey, EntryProblem, FileEntry, Writer, decode,
        reindexed,
    };
    use crate::cache::BlobId;
    use std::hash::BuildHasher;

    fn key(n: u8) -> EntryKey {
        EntryKey {
            kernel: BlobId([n; 32]),
            bias: BlobId::NONE,
            seed: 1,
        }
    }

    fn test_compat() -> Compat {
        Compat {
            build_id: b"test".to_vec(),
            cpu_fingerprint: 7,
        }
    }

    #[test]
    fn the_first_of_overlapping_regions_and_of_duplicate_keys_is_kept() {
        let compat = test_compat();
        let mut w = Writer::new(Vec::new(), &compat).unwrap();
        for n in 1..=4u8 {
            w.add(key(n), &[n; 256], 0, 0).unwrap();
        }
        let (bytes, _) = w.finish(&[]).unwrap();
        let mut entries: Vec<FileEntry> = decode(&bytes, &compat).unwrap().entries;
        let offsets: Vec<u64> = entries.iter().map(|e| e.offset).collect();
        // Entry 2 moved to start inside region 1, entry 3 inside the moved 2, entry 4 given
        // 1's key; the index lists them 4, 3, 2, 1.
        entries[1].offset = offsets[0] + 64;
        entries[2].offset = offsets[0] + 128;
        entries[3].key = key(1);
        let index = vec![entries[3], entries[2], entries[1], entries[0]];
        let crafted = reindexed(&bytes, &index, &[]).unwrap();
        let decoded = decode(&crafted, &compat).unwrap();
        // Entry 1 is the later of key 1's two in the index: dropped. By offset, 2 comes first
        // and is kept; 3 starts inside it: dropped; 4 lies apart: kept. The kept ones stay in
        // the index's order.
        let kept: Vec<(EntryKey, u64)> =
            decoded.entries.iter().map(|e| (e.key, e.offset)).collect();
        assert_eq!(kept, vec![(key(1), offsets[3]), (key(2), offsets[0] + 64)]);
        assert_eq!(
            decoded.dropped,
            vec![
                (3, EntryProblem::Duplicate),
                (usize::MAX, EntryProblem::Overlaps),
            ]
        );
    }

    #[test]
    fn a_file_lists_its_entries_in_key_order_whatever_order_they_were_written_in() {
        let compat = test_compat();
        let mut w = Writer::new(Vec::new(), &compat).unwrap();
        let mut offsets = Vec::new();
        for n in [4u8, 2, 3, 1] {
            offsets.push((n, w.add(key(n), &[n; 100], 0, 0).unwrap()));
        }
        let (bytes, _) = w.finish(&[]).unwrap();
        let decoded = decode(&bytes, &compat).unwrap();
        let listed: Vec<(EntryKey, u64)> =
            decoded.entries.iter().map(|e| (e.key, e.offset)).collect();
        offsets.sort();
        let expected: Vec<(EntryKey, u64)> = offsets
            .iter()
            .map(|&(n, offset)| (key(n), offset))
            .collect();
        assert_eq!(listed, expected, "the regions stay where they were written");
        assert!(decoded.dropped.is_empty());
        // An index in key order whose regions overlap: the first by offset is kept, and the
        // kept ones stay in key order.
        let mut entries = decoded.entries.clone();
        entries[3].offset = entries[1].offset;
        let crafted = reindexed(&bytes, &entries, &[]).unwrap();
        let decoded = decode(&crafted, &compat).unwrap();
        let keys: Vec<EntryKey> = decoded.entries.iter().map(|e| e.key).collect();
        assert_eq!(keys, vec![key(1), key(2), key(3)]);
        assert_eq!(decoded.dropped, vec![(usize::MAX, EntryProblem::Overlaps)]);
        // An index in key order up to its third entry, whose fourth repeats its second: the
        // repeat is found though the keys before the break were never hashed.
        let original = decode(&bytes, &compat).unwrap().entries;
        let mut repeat = original[2];
        repeat.key = original[3].key;
        let index = vec![original[0], original[3], original[1], repeat];
        let decoded = decode(&reindexed(&bytes, &index, &[]).unwrap(), &compat).unwrap();
        let keys: Vec<EntryKey> = decoded.entries.iter().map(|e| e.key).collect();
        assert_eq!(keys, vec![key(1), key(4), key(2)]);
        assert_eq!(decoded.dropped, vec![(3, EntryProblem::Duplicate)]);
    }

    #[test]
    fn the_metadata_to_read_ahead_is_the_header_and_the_index_with_its_trailer() {
        let compat = test_compat();
        let mut w = Writer::new(Vec::new(), &compat).unwrap();
        w.add(key(1), &[1; 300], 0, 0).unwrap();
        let (bytes, _) = w.finish(&[]).unwrap();
        let index = super::index_offset(&bytes).unwrap() as usize;
        assert_eq!(
            super::metadata_ranges(&bytes),
            vec![0..super::HEADER_SIZE, index..bytes.len()]
        );
        // A trailer whose index offset is nonsense: the trailer alone after the header.
        let mut lying = bytes.clone();
        let at = lying.len() - super::TRAILER_SIZE + super::INDEX_OFFSET_AT;
        lying[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let len = lying.len();
        assert_eq!(
            super::metadata_ranges(&lying),
            vec![0..super::HEADER_SIZE, len - super::TRAILER_SIZE..len]
        );
        assert_eq!(super::metadata_ranges(&bytes[..100]), vec![0..100]);
    }

    #[test]
    fn a_keys_hash_is_of_every_byte_of_it() {
        let hasher = foldhash::quality::FixedState::with_seed(7);
        let key = EntryKey {
            kernel: BlobId([3; 32]),
            bias: BlobId([5; 32]),
            seed: 0x0102_0304,
        };
        let same = EntryKey {
            kernel: BlobId([3; 32]),
            bias: BlobId([5; 32]),
            seed: 0x0102_0304,
        };
        assert_eq!(hasher.hash_one(same), hasher.hash_one(key));
        // A change anywhere in the key, each byte of it in turn, changes its hash (one write of
        // the whole key: a field left out of it would leave the hash as it was).
        for at in 0..68 {
            let mut changed = key;
            match at {
                0..32 => changed.kernel.0[at] ^= 1,
                32..64 => changed.bias.0[at - 32] ^= 1,
                _ => changed.seed ^= 1 << (8 * (at - 64)),
            }
            assert_ne!(hasher.hash_one(changed), hasher.hash_one(key), "byte {at}");
        }
        // Kernel and bias are not interchangeable.
        let swapped = EntryKey {
            kernel: key.bias,
            bias: key.kernel,
            seed: key.seed,
        };
        assert_ne!(hasher.hash_one(swapped), hasher.hash_one(key));
        let id = BlobId([9; 32]);
        let mut other = id;
        other.0[31] ^= 0x80;
        assert_ne!(hasher.hash_one(id), hasher.hash_one(other));
    }

    #[test]
    fn a_damage_record_reads_back_and_nothing_else_parses() {
        let r = DamageRecord {
            file: CheckedRecord {
                device: 2049,
                inode: 77,
                size: 4096,
                changed_ns: 1_795_586_801_276_556_200,
            },
            damaged: vec![128, 1024],
        };
        assert_eq!(DamageRecord::parse(r.to_text().as_bytes()), Some(r.clone()));
        let clean = DamageRecord {
            damaged: vec![],
            ..r.clone()
        };
        assert_eq!(DamageRecord::parse(clean.to_text().as_bytes()), Some(clean));
        for bad in [
            "xnnblob-cache-damage 1 2049 77 4096 5 2 1024 128\n",
            "xnnblob-cache-damage 1 2049 77 4096 5 3 128 1024\n",
            "xnnblob-cache-damage 1 2049 77 4096 5 1 128",
            "xnnblob-cache-damage 2 2049 77 4096 5 0\n",
        ] {
            assert_eq!(DamageRecord::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_checked_record_reads_back_and_nothing_else_parses() {
        let r = CheckedRecord {
            device: 2049,
            inode: 77,
            size: 4096,
            changed_ns: 1_700_000_000_123_456_789,
        };
        let text = r.to_text();
        assert_eq!(CheckedRecord::parse(text.as_bytes()), Some(r));
        for cut in 0..text.len() {
            assert_eq!(
                CheckedRecord::parse(&text.as_bytes()[..cut]),
                None,
                "cut at {cut}"
            );
        }
        for other in [
            text.replace(" 1 ", " 2 "),
            format!("x{text}"),
            text.replace('\n', " 5\n"),
            text.replace(" 77 ", " +77 "),
            text.replace(" 77 ", " 077 "),
        ] {
            assert_eq!(CheckedRecord::parse(other.as_bytes()), None, "{other}");
        }
    }
}
