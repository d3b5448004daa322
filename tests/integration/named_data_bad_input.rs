//! Bad files, one per failed check: each is its own typed error, none panics.
//!
//! The files are crafted here with the flatbuffers builder directly (field slots written by
//! hand from the format), independent of the generated code the parser uses.

use flatbuffers::{FlatBufferBuilder, WIPOffset};
use xnnblob::named_data::{
    FileDataMap, FileKind, FormatError, NamedDataError, ptd_format, pte_format,
};

/// A `.ptd` with the given segments (relative offset, size) and named entries (key, segment),
/// followed by `data_size` bytes of segment data.
fn craft_ptd(segments: &[(u64, u64)], named: &[(&str, u32)], data_size: u64) -> Vec<u8> {
    let mut b = FlatBufferBuilder::new();
    let segs: Vec<WIPOffset<_>> = segments
        .iter()
        .map(|&(offset, size)| {
            let t = b.start_table();
            b.push_slot::<u64>(4, offset, 0);
            b.push_slot::<u64>(6, size, 0);
            b.end_table(t)
        })
        .collect();
    let names: Vec<WIPOffset<_>> = named
        .iter()
        .map(|&(key, segment)| {
            let key = b.create_string(key);
            let t = b.start_table();
            b.push_slot_always(4, key);
            b.push_slot::<u32>(6, segment, 0);
            b.end_table(t)
        })
        .collect();
    let segs = b.create_vector(&segs);
    let names = b.create_vector(&names);
    let t = b.start_table();
    b.push_slot::<u32>(4, 0, 0);
    b.push_slot_always(6, segs);
    b.push_slot_always(8, names);
    let root = b.end_table(t);
    b.finish(root, Some("FT01"));
    let fb = b.finished_data();

    let fb_size = (fb.len() - 8) as u64;
    let base = (48 + fb_size).next_multiple_of(128);
    let mut out = Vec::new();
    out.extend_from_slice(&(u32::from_le_bytes(fb[0..4].try_into().unwrap()) + 40).to_le_bytes());
    out.extend_from_slice(&fb[4..8]);
    out.extend_from_slice(b"FH01");
    out.extend_from_slice(&40u32.to_le_bytes());
    for v in [48u64, fb_size, base, data_size] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&fb[8..]);
    out.resize((base + data_size) as usize, 0xAB);
    out
}

fn valid() -> Vec<u8> {
    craft_ptd(&[(0, 16), (128, 8)], &[("w", 0), ("b", 1)], 136)
}

fn ptd_error(bytes: &[u8]) -> FormatError {
    let direct = ptd_format::parse(bytes).unwrap_err();
    // The map constructor reports the same error, naming the map.
    match FileDataMap::from_bytes(bytes, Some(FileKind::Ptd), "crafted.ptd") {
        Err(NamedDataError::Format { map, error }) => {
            assert_eq!(map, "crafted.ptd");
            assert_eq!(error, direct);
        }
        other => panic!("expected a format error, got {:?}", other.map(|_| ())),
    }
    direct
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn the_crafted_file_is_valid() {
    let map = FileDataMap::from_bytes(&valid(), None, "crafted.ptd").unwrap();
    assert_eq!(map.entries().len(), 2);
}

#[test]
fn truncated_file() {
    let bytes = valid();
    for cut in [0, 3, 7, 11, 20, 47] {
        assert!(
            matches!(ptd_error(&bytes[..cut]), FormatError::Truncated { .. }),
            "cut at {cut}"
        );
    }
    // Cut inside the segment data: the header's region no longer fits.
    let cut = bytes.len() - 1;
    assert!(matches!(
        ptd_error(&bytes[..cut]),
        FormatError::RegionOutOfBounds {
            what: "segment data",
            ..
        }
    ));
}

#[test]
fn wrong_identifier_and_wrong_magic() {
    let mut bytes = valid();
    bytes[4..8].copy_from_slice(b"XX01");
    assert!(
        matches!(ptd_error(&bytes), FormatError::WrongIdentifier { found, .. } if &found == b"XX01")
    );
    let mut bytes = valid();
    bytes[8..12].copy_from_slice(b"FH02");
    assert!(
        matches!(ptd_error(&bytes), FormatError::WrongHeaderMagic { found, .. } if &found == b"FH02")
    );
}

#[test]
fn a_file_of_neither_format_is_named_as_such() {
    let err = FileDataMap::from_bytes(b"root:x:0:0:root", None, "passwd")
        .err()
        .unwrap();
    assert!(matches!(
        err,
        NamedDataError::Format { error: FormatError::UnknownFormat { found }, .. } if &found == b":x:0"
    ));
}

#[test]
fn header_length_too_small() {
    let mut bytes = valid();
    bytes[12..16].copy_from_slice(&39u32.to_le_bytes());
    assert_eq!(
        ptd_error(&bytes),
        FormatError::HeaderTooShort {
            length: 39,
            min: 40
        }
    );
}

#[test]
fn longer_headers_are_accepted() {
    // A future header with extra fields: the flatbuffer starts later; 40 is only the minimum.
    let mut bytes = valid();
    bytes[12..16].copy_from_slice(&40u32.to_le_bytes());
    assert!(ptd_format::parse(&bytes).is_ok());
}

#[test]
fn offsets_past_the_end() {
    let mut bytes = valid();
    let len = bytes.len() as u64;
    set_u64(&mut bytes, 32, len); // segment base at the end, data size still 136
    assert!(matches!(
        ptd_error(&bytes),
        FormatError::RegionOutOfBounds {
            what: "segment data",
            ..
        }
    ));
    let mut bytes = valid();
    set_u64(&mut bytes, 24, len); // flatbuffer size past the end
    assert!(matches!(
        ptd_error(&bytes),
        FormatError::RegionOutOfBounds {
            what: "flatbuffer",
            ..
        }
    ));
    // A segment whose end lies beyond the segment data.
    let bytes = craft_ptd(&[(0, 16), (128, 9)], &[("w", 0)], 136);
    assert_eq!(
        ptd_error(&bytes),
        FormatError::SegmentOutOfBounds {
            index: 1,
            offset: 128,
            size: 9,
            data_size: 136
        }
    );
}

#[test]
fn offset_plus_size_overflow() {
    let bytes = craft_ptd(&[(u64::MAX - 4, 16)], &[("w", 0)], 136);
    assert_eq!(ptd_error(&bytes), FormatError::Overflow { what: "segment" });
    let mut bytes = valid();
    set_u64(&mut bytes, 32, u64::MAX - 8); // segment base + data size overflows
    assert_eq!(
        ptd_error(&bytes),
        FormatError::Overflow {
            what: "segment data"
        }
    );
    let mut bytes = valid();
    set_u64(&mut bytes, 16, u64::MAX); // flatbuffer offset + size overflows
    assert_eq!(
        ptd_error(&bytes),
        FormatError::Overflow { what: "flatbuffer" }
    );
}

#[test]
fn segment_index_out_of_range() {
    let bytes = craft_ptd(&[(0, 16)], &[("w", 0), ("b", 5)], 136);
    assert_eq!(
        ptd_error(&bytes),
        FormatError::SegmentIndexOutOfRange {
            key: "b".into(),
            index: 5,
            segments: 1
        }
    );
}

#[test]
fn duplicate_keys() {
    let bytes = craft_ptd(&[(0, 16)], &[("w", 0), ("w", 0)], 136);
    assert_eq!(
        ptd_error(&bytes),
        FormatError::DuplicateKey { key: "w".into() }
    );
}

#[test]
fn non_utf8_key() {
    let mut bytes = craft_ptd(&[(0, 16)], &[("fine", 0), ("MARK", 0)], 136);
    let at = bytes.windows(4).position(|w| w == b"MARK").unwrap();
    bytes[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
    assert_eq!(ptd_error(&bytes), FormatError::KeyNotUtf8 { entry: 1 });
}

#[test]
fn flatbuffer_failing_the_verifier() {
    // The root offset points outside the flatbuffer.
    let mut bytes = valid();
    bytes[0..4].copy_from_slice(&0xFFFF_FF00u32.to_le_bytes());
    assert!(matches!(ptd_error(&bytes), FormatError::Verifier(_)));
    // The root table's vtable offset points outside the buffer.
    let mut bytes = valid();
    let root = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    bytes[root..root + 4].copy_from_slice(&i32::MIN.to_le_bytes());
    assert!(matches!(ptd_error(&bytes), FormatError::Verifier(_)));
}

#[test]
fn missing_key() {
    // A NamedData table with only a segment index.
    let mut b = FlatBufferBuilder::new();
    let t = b.start_table();
    b.push_slot::<u32>(6, 0, 0);
    let nd = b.end_table(t);
    let names = b.create_vector(&[nd]);
    let t = b.start_table();
    b.push_slot_always(8, names);
    let root = b.end_table(t);
    b.finish(root, Some("FT01"));
    let fb = b.finished_data();
    let mut bytes = valid();
    // Reuse the valid header, with this flatbuffer spliced in.
    let fb_size = (fb.len() - 8) as u64;
    let mut out = Vec::new();
    out.extend_from_slice(&(u32::from_le_bytes(fb[0..4].try_into().unwrap()) + 40).to_le_bytes());
    out.extend_from_slice(&fb[4..8]);
    out.extend_from_slice(&bytes[8..48]);
    out.extend_from_slice(&fb[8..]);
    set_u64(&mut out, 24, fb_size);
    set_u64(&mut out, 32, 0);
    set_u64(&mut out, 40, 0);
    bytes = out;
    assert_eq!(ptd_error(&bytes), FormatError::MissingKey { entry: 0 });
}

#[test]
fn pte_bad_input() {
    let good = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/executorch/mlp_xnn_inline.pte"),
    )
    .unwrap();
    assert!(pte_format::parse(&good).is_ok());
    for cut in [0, 5, 20] {
        assert!(matches!(
            pte_format::parse(&good[..cut]).unwrap_err(),
            FormatError::Truncated { .. }
        ));
    }
    assert!(matches!(
        pte_format::parse(&good[..good.len() - 1]).unwrap_err(),
        FormatError::RegionOutOfBounds {
            what: "segment data",
            ..
        }
    ));
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(b"ET11");
    assert!(matches!(
        pte_format::parse(&bad).unwrap_err(),
        FormatError::WrongIdentifier { .. }
    ));
    let mut bad = good.clone();
    bad[12..16].copy_from_slice(&16u32.to_le_bytes());
    assert_eq!(
        pte_format::parse(&bad).unwrap_err(),
        FormatError::HeaderTooShort {
            length: 16,
            min: 24
        }
    );
    let mut bad = good.clone();
    set_u64(&mut bad, 24, u64::MAX - 2);
    assert_eq!(
        pte_format::parse(&bad).unwrap_err(),
        FormatError::Overflow {
            what: "segment data"
        }
    );
    let mut bad = good.clone();
    set_u64(&mut bad, 16, good.len() as u64 + 1);
    assert!(matches!(
        pte_format::parse(&bad).unwrap_err(),
        FormatError::RegionOutOfBounds {
            what: "program flatbuffer",
            ..
        }
    ));
    let mut bad = good;
    bad[0..4].copy_from_slice(&0xFFFF_0000u32.to_le_bytes());
    assert!(matches!(
        pte_format::parse(&bad).unwrap_err(),
        FormatError::Verifier(_)
    ));
}
