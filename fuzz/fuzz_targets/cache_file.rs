//! The packed-weight cache loader on arbitrary bytes: `decode` must reject or return entries
//! whose regions are inside the file, aligned and disjoint; never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xnnblob::cache::format::{self, Compat};

fuzz_target!(|data: &[u8]| {
    // Accept whatever build id and CPU the input claims, so the fuzzer gets past the header.
    let claimed = Compat {
        build_id: data
            .get(32..32 + 32)
            .map(<[u8]>::to_vec)
            .unwrap_or_default(),
        cpu_fingerprint: data
            .get(16..24)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(0),
    };
    for compat in [claimed] {
        if let Ok(decoded) = format::decode(data, &compat) {
            let index = format::index_offset(data).unwrap();
            let mut end = 0u64;
            for e in &decoded.entries {
                assert!(e.offset >= end, "sorted and disjoint");
                end = e.offset + e.size;
                assert!(end <= index);
                assert_eq!(e.offset % format::REGION_ALIGNMENT as u64, 0);
                let _ = xnnblob::cache::checksum64(&data[e.offset as usize..end as usize]);
            }
        }
    }
});
