//! The .ptd parser on arbitrary bytes: it must return an error or an index whose every entry
//! can be read, never panic or read out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xnnblob::named_data::{FileDataMap, FileKind, NamedDataMap, ptd_format};

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    if let Ok(index) = ptd_format::parse(data) {
        for e in index.entries() {
            assert!(e.offset + e.size <= data.len());
        }
        let map = FileDataMap::from_bytes(data, Some(FileKind::Ptd), "fuzz").expect("parsed once");
        for i in 0..map.num_keys() {
            let key = map.key_at(i).unwrap();
            let bytes = map.get_data(key).unwrap();
            assert_eq!(bytes.len(), map.data_size(key).unwrap());
            let _ = map.get_tensor_layout(key).unwrap();
        }
    }
});
