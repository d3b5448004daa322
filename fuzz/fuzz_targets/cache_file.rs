//! The packed-weight cache loader on arbitrary bytes (and the check record beside a cache
//! file, `CheckedRecord`): `decode` must reject or return entries
//! whose regions are inside the file, aligned and disjoint; never panic. What a header says the
//! file was packed for (`recorded_compat`, which read-only layers and tools read) must decode it
//! alike matched exactly or by packing class. Each input is also
//! tried with its header and index checksums fixed up, so mutations reach the entry checks
//! instead of stopping at a checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xnnblob::cache::checksum64;
use xnnblob::cache::format::{self, CheckedRecord, Compat, CpuMatch};

fn check(data: &[u8]) {
    // Accept whatever build id and CPU the input claims, so the fuzzer gets past the header.
    let compat = Compat {
        build_id: data.get(32..64).map(<[u8]>::to_vec).unwrap_or_default(),
        cpu_fingerprint: data
            .get(16..24)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0),
    };
    if let Some(recorded) = format::recorded_compat(data) {
        let exact = format::decode(data, &recorded).map(|d| d.entries.len());
        let by_class = format::decode_matching(data, &recorded, CpuMatch::PackingClass)
            .map(|d| d.entries.len());
        assert_eq!(exact, by_class, "a file matches its own packing class");
    }
    if let Ok(decoded) = format::decode(data, &compat) {
        let index = format::index_offset(data).unwrap();
        // The entries come in the index's order (key order), their regions anywhere in the
        // file: disjoint once sorted by offset.
        let mut regions: Vec<(u64, u64)> =
            decoded.entries.iter().map(|e| (e.offset, e.size)).collect();
        regions.sort_unstable();
        let mut end = 0u64;
        for (offset, size) in regions {
            assert!(offset >= end, "disjoint");
            end = offset + size;
            assert!(end <= index);
            assert_eq!(offset % format::REGION_ALIGNMENT as u64, 0);
            let _ = checksum64(&data[offset as usize..end as usize]);
        }
    }
}

/// The same bytes with valid header and index checksums, where the layout allows.
fn fixed_up(data: &[u8]) -> Option<Vec<u8>> {
    let mut d = data.to_vec();
    let len = d.len();
    if len < format::HEADER_SIZE + format::TRAILER_SIZE {
        return None;
    }
    let sum = checksum64(&d[..format::HEADER_SIZE - 8]);
    d[format::HEADER_SIZE - 8..format::HEADER_SIZE].copy_from_slice(&sum.to_le_bytes());
    let index = format::index_offset(&d)? as usize;
    let trailer = len - format::TRAILER_SIZE;
    if index >= format::HEADER_SIZE && index <= trailer {
        let sum = checksum64(&d[index..trailer]);
        d[trailer + 16..trailer + 24].copy_from_slice(&sum.to_le_bytes());
    }
    Some(d)
}

/// The record beside a cache file (`PATH.checked`) is read from the same disk: it parses to a
/// record that writes back as the same bytes, or to nothing.
fn check_record(data: &[u8]) {
    if let Some(record) = CheckedRecord::parse(data) {
        assert_eq!(record.to_text().as_bytes(), data, "one spelling per record");
    }
}

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    check_record(data);
    check(data);
    if let Some(d) = fixed_up(data) {
        check(&d);
    }
});
