//! Errors of named data: reading files, looking keys up, merging maps, writing `.ptd` files.

use std::io;

/// Why the bytes of a `.ptd` or `.pte` file were rejected. Each check has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The file ends before a structure it must contain.
    #[error("truncated: {what} needs {needed} bytes, the file has {len}")]
    Truncated {
        /// The structure that did not fit (e.g. `"FH01 header"`, `"file identifier"`).
        what: &'static str,
        /// The file length in bytes the structure needs: the offset of its end.
        needed: u64,
        /// The file's actual length in bytes.
        len: u64,
    },
    /// Bytes 4..8 name neither a `.ptd` (`FT01`) nor a `.pte` (`ET12`).
    #[error(
        "not a .ptd (FT01) or .pte (ET12) file: identifier {:?}",
        String::from_utf8_lossy(.found)
    )]
    UnknownFormat {
        /// The four bytes found at offsets 4..8.
        found: [u8; 4],
    },
    /// Bytes 4..8 are not the format's flatbuffer file identifier.
    #[error(
        "wrong file identifier {:?}, expected {:?}",
        String::from_utf8_lossy(.found),
        String::from_utf8_lossy(.expected)
    )]
    WrongIdentifier {
        /// The identifier of the format being parsed (`FT01` or `ET12`).
        expected: [u8; 4],
        /// The four bytes found at offsets 4..8.
        found: [u8; 4],
    },
    /// The header does not start with its magic.
    #[error(
        "wrong header magic {:?}, expected {:?}",
        String::from_utf8_lossy(.found),
        String::from_utf8_lossy(.expected)
    )]
    WrongHeaderMagic {
        /// The magic the format's header starts with (`FH01` for a `.ptd`).
        expected: [u8; 4],
        /// The four bytes found at offsets 8..12.
        found: [u8; 4],
    },
    /// The header declares a length below the minimum of its version.
    #[error("header length {length} is below the minimum {min}")]
    HeaderTooShort {
        /// The header length the file declares, in bytes counted from the magic.
        length: u32,
        /// The shortest header, in bytes, this reader accepts for the format.
        min: u32,
    },
    /// A region the header declares lies (partly) outside the file or overlaps the header.
    #[error("{what} [{start}, {end}) lies outside the file ({len} bytes) or overlaps the header")]
    RegionOutOfBounds {
        /// The region: `"flatbuffer"`, `"program flatbuffer"` or `"segment data"`.
        what: &'static str,
        /// The region's start, as a byte offset in the file.
        start: u64,
        /// The region's end (exclusive), as a byte offset in the file.
        end: u64,
        /// The file's length in bytes.
        len: u64,
    },
    /// An offset plus a size does not fit in 64 bits.
    #[error("{what}: offset + size overflows")]
    Overflow {
        /// The region or segment whose end overflowed (e.g. `"segment"`, `"flatbuffer"`).
        what: &'static str,
    },
    /// The flatbuffer failed the flatbuffers verifier.
    #[error("flatbuffer failed verification: {0}")]
    Verifier(String),
    /// The program has non-empty segments but no extended header saying where they start.
    #[error("the program lists segments but has no extended header")]
    SegmentsWithoutHeader,
    /// A segment lies outside the segment data region.
    #[error("segment {index} [{offset}, +{size}) lies outside the {data_size}-byte segment data")]
    SegmentOutOfBounds {
        /// The segment's position in the flatbuffer's segment list.
        index: usize,
        /// The segment's offset in bytes, relative to the start of the segment data.
        offset: u64,
        /// The segment's size in bytes.
        size: u64,
        /// The size in bytes of the segment data the header declares (0 without a header).
        data_size: u64,
    },
    /// A named entry has no key.
    #[error("named data entry {entry} has no key")]
    MissingKey {
        /// The entry's position in the flatbuffer's named-data list.
        entry: usize,
    },
    /// A key is not valid UTF-8.
    #[error("named data entry {entry}: key is not valid UTF-8")]
    KeyNotUtf8 {
        /// The entry's position in the flatbuffer's named-data list.
        entry: usize,
    },
    /// Two entries share a key.
    #[error("key {key:?} appears twice")]
    DuplicateKey {
        /// The key that appears more than once.
        key: String,
    },
    /// A named entry refers to a segment that does not exist.
    #[error("key {key:?} refers to segment {index}, but there are {segments} segments")]
    SegmentIndexOutOfRange {
        /// The key of the entry.
        key: String,
        /// The segment index the entry names.
        index: u32,
        /// How many segments the file has.
        segments: usize,
    },
    /// A tensor layout is malformed (negative size, dim order not a permutation, ...).
    #[error("key {key:?}: bad tensor layout: {reason}")]
    BadLayout {
        /// The key whose layout was rejected.
        key: String,
        /// What is wrong with the layout, in words.
        reason: String,
    },
    /// A tensor layout needs more bytes than its segment holds.
    #[error(
        "key {key:?}: tensor layout needs {layout_bytes} bytes, its segment holds {segment_size}"
    )]
    LayoutLargerThanSegment {
        /// The key whose layout is too large.
        key: String,
        /// The bytes the layout needs: element size times the product of the sizes.
        layout_bytes: u64,
        /// The size in bytes of the segment the key points at.
        segment_size: u64,
    },
}

/// An error of the named-data API. `map` names the map (usually its file path).
#[derive(Debug, thiserror::Error)]
pub enum NamedDataError {
    /// The file could not be read.
    #[error("{map}: cannot be read")]
    Io {
        /// The map's name (usually the file path).
        map: String,
        /// The I/O error (`OutOfMemory` when an in-memory copy could not be allocated).
        #[source]
        error: io::Error,
    },
    /// The file's bytes were rejected.
    #[error("{map}: not a valid named-data file")]
    Format {
        /// The map's name (usually the file path).
        map: String,
        /// The check the bytes failed.
        #[source]
        error: FormatError,
    },
    /// No entry has this key.
    #[error("key {key:?} not found in {map}")]
    KeyNotFound {
        /// The key that was looked up.
        key: String,
        /// The name of the map it was looked up in.
        map: String,
    },
    /// `key_at` beyond `num_keys`.
    #[error("key index {index} out of range (the map has {len} keys)")]
    IndexOutOfRange {
        /// The key index that was asked for.
        index: usize,
        /// The number of keys in the map.
        len: usize,
    },
    /// `load_data_into` with a buffer of the wrong size.
    #[error("key {key:?} holds {data_size} bytes, the buffer has {buffer_size}")]
    SizeMismatch {
        /// The key whose data was to be copied.
        key: String,
        /// The size of the key's data, in bytes.
        data_size: usize,
        /// The size of the caller's buffer, in bytes.
        buffer_size: usize,
    },
    /// `key` was inserted into one map twice.
    #[error("key {key:?} is already in {map}")]
    DuplicateKey {
        /// The key inserted a second time.
        key: String,
        /// The name of the map it was inserted into.
        map: String,
    },
    /// Alignment must be a non-zero power of two.
    #[error("key {key:?}: alignment {alignment} is not a power of two")]
    BadAlignment {
        /// The key being inserted.
        key: String,
        /// The requested alignment, in bytes.
        alignment: usize,
    },
    /// A map implemented outside Rust (a C++ `NamedDataMap`) reported an error.
    #[error("{map}: {message}")]
    Backend {
        /// The name the map was given when it was wrapped.
        map: String,
        /// What the map reported (the C++ exception's `what()`).
        message: String,
    },
    /// Two merged maps both have `key`.
    #[error("key {key:?} is in both {first} and {second}")]
    DuplicateKeyAcrossMaps {
        /// The key found in both maps.
        key: String,
        /// The name of the earlier map that has the key.
        first: String,
        /// The name of the later map that has it too.
        second: String,
    },
}

/// An error of [`super::NamedBlobStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Alignment must be a non-zero power of two.
    #[error("key {key:?}: alignment {alignment} is not a power of two")]
    BadAlignment {
        /// The key being added.
        key: String,
        /// The requested alignment, in bytes.
        alignment: usize,
    },
    /// The key was added before with other bytes, another tag or another layout.
    #[error("key {key:?} was already added with {reason}")]
    KeyConflict {
        /// The key added a second time.
        key: String,
        /// What differs: `"different bytes"`, `"a different external tag"` or
        /// `"a different tensor layout"`.
        reason: &'static str,
    },
    /// A layout needs more bytes than the blob has.
    #[error("key {key:?}: layout needs {layout_bytes} bytes, the blob has {data_bytes}")]
    LayoutLargerThanData {
        /// The key being added.
        key: String,
        /// The bytes the layout needs: element size times the product of the sizes.
        layout_bytes: usize,
        /// The size of the blob, in bytes.
        data_bytes: usize,
    },
    /// No blob carries this external tag.
    #[error("no blob has external tag {tag:?}")]
    UnknownTag {
        /// The tag asked for.
        tag: String,
    },
    /// A tag must be usable as a file name.
    #[error("external tag {tag:?} cannot name a file (empty, '/', or '.'/'..')")]
    BadTag {
        /// The tag that cannot name a file.
        tag: String,
    },
    /// Writing a file failed.
    #[error("cannot write {path}")]
    Io {
        /// The file being written (the final path, not the temporary file).
        path: String,
        /// The I/O error.
        #[source]
        error: io::Error,
    },
}
