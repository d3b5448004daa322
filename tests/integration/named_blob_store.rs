//! NamedBlobStore writes .ptd files that read back identically, laid out as ExecuTorch does.

use crate::common;

use common::scratch as scratch_dir;

use std::path::Path;
use std::sync::Arc;
use xnnblob::named_data::{
    FileDataMap, InMemoryMap, MergedMap, NamedBlobStore, NamedDataError, NamedDataMap, ScalarType,
    StoreError, TensorLayout, ptd_format,
};

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn blobs_read_back_identically_with_alignment_and_dedup() {
    let dir = scratch_dir("roundtrip");
    let a = bytes(1000, 1);
    let b = bytes(77, 2);
    let layout = TensorLayout::contiguous(ScalarType::Float, vec![10, 25]).unwrap();
    let mut store = NamedBlobStore::new();
    store
        .add_named_blob("a", &a, 16, "weights", Some(layout.clone()))
        .unwrap();
    store
        .add_named_blob("b", &b, 4096, "weights", None)
        .unwrap();
    store
        .add_named_blob("a_again", &a, 256, "weights", None)
        .unwrap();
    // Same key, same bytes, same tag and layout: accepted, nothing new stored.
    store.add_named_blob("b", &b, 16, "weights", None).unwrap();
    assert_eq!(store.unique_blobs(), 2);

    let written = store.write_all(&dir).unwrap();
    assert_eq!(written, vec![dir.join("weights.ptd")]);
    let map = FileDataMap::open_ptd(&written[0]).unwrap();
    assert_eq!(map.num_keys(), 3);
    assert_eq!(&*map.get_data("a").unwrap(), &a[..]);
    assert_eq!(&*map.get_data("a_again").unwrap(), &a[..]);
    assert_eq!(&*map.get_data("b").unwrap(), &b[..]);
    assert_eq!(map.get_tensor_layout("a").unwrap(), Some(layout));
    assert_eq!(map.get_tensor_layout("b").unwrap(), None);

    let entry = |k: &str| map.entries().iter().find(|e| e.key == k).unwrap().clone();
    // Dedup: two keys, one segment.
    assert_eq!(entry("a").segment_index, entry("a_again").segment_index);
    assert_eq!(map.segments().len(), 2);
    // Alignment: the largest request of each blob, and at least ExecuTorch's 128.
    assert_eq!(entry("a").offset % 256, 0);
    assert_eq!(entry("b").offset % 4096, 0);
    // The data pointers keep that alignment (the file is mapped at a page boundary).
    assert_eq!(map.get_data("b").unwrap().as_ptr() as usize % 4096, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn layout_follows_executorch_conventions() {
    let bytes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/executorch/mlp_portable_external.ptd"),
    )
    .unwrap();
    let original = FileDataMap::from_bytes(&bytes, None, "original").unwrap();
    let mut store = NamedBlobStore::new();
    for e in original.entries() {
        let data = original.get_data(&e.key).unwrap();
        store
            .add_named_blob(&e.key, &data, 16, "model", e.layout.clone())
            .unwrap();
    }
    let ours = store.serialize("model").unwrap();
    let (h0, h1) = (
        ptd_format::parse_header(&bytes).unwrap(),
        ptd_format::parse_header(&ours).unwrap(),
    );
    // Header fields, segment base (align(48 + flatbuffer, 128)), segment offsets and the end
    // of the file follow ExecuTorch's writer.
    assert_eq!(h1.length, 40);
    assert_eq!(h1.flatbuffer_offset, 48);
    assert_eq!(
        h1.segment_base_offset,
        (48 + h1.flatbuffer_size).next_multiple_of(128)
    );
    assert_eq!(h1.segment_data_size, h0.segment_data_size);
    let rewritten = FileDataMap::from_bytes(&ours, None, "ours").unwrap();
    let rel = |m: &FileDataMap, base: u64| -> Vec<(u64, usize)> {
        m.segments()
            .iter()
            .map(|&(o, s)| (o as u64 - base, s))
            .collect()
    };
    assert_eq!(
        rel(&rewritten, h1.segment_base_offset),
        rel(&original, h0.segment_base_offset)
    );
    assert_eq!(
        ours.len() as u64,
        h1.segment_base_offset + h1.segment_data_size
    );
    // Segment bytes, and the zero padding between them, are identical to ExecuTorch's.
    assert_eq!(
        &ours[h1.segment_base_offset as usize..],
        &bytes[h0.segment_base_offset as usize..]
    );
    for (i, e) in original.entries().iter().enumerate() {
        assert_eq!(rewritten.entries()[i].key, e.key);
        assert_eq!(rewritten.entries()[i].layout, e.layout);
    }
}

#[test]
fn the_same_key_with_other_bytes_tag_or_layout_is_an_error_naming_it() {
    let mut store = NamedBlobStore::new();
    store
        .add_named_blob("w", &[1, 2, 3], 16, "t", None)
        .unwrap();
    let err = store
        .add_named_blob("w", &[1, 2, 4], 16, "t", None)
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::KeyConflict { key, reason: "different bytes" } if key == "w")
    );
    assert!(err.to_string().contains("\"w\""));
    let err = store
        .add_named_blob("w", &[1, 2, 3], 16, "other", None)
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::KeyConflict {
            reason: "a different external tag",
            ..
        }
    ));
    let layout = TensorLayout::contiguous(ScalarType::Byte, vec![3]).unwrap();
    let err = store
        .add_named_blob("w", &[1, 2, 3], 16, "t", Some(layout))
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::KeyConflict {
            reason: "a different tensor layout",
            ..
        }
    ));
}

#[test]
fn bad_alignment_layout_and_tags_are_rejected() {
    let mut store = NamedBlobStore::new();
    for alignment in [0, 3, 24] {
        let err = store
            .add_named_blob("k", &[0; 4], alignment, "t", None)
            .unwrap_err();
        assert!(matches!(err, StoreError::BadAlignment { alignment: a, .. } if a == alignment));
    }
    let big = TensorLayout::contiguous(ScalarType::Float, vec![2]).unwrap();
    let err = store
        .add_named_blob("k", &[0; 4], 16, "t", Some(big))
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::LayoutLargerThanData {
            layout_bytes: 8,
            data_bytes: 4,
            ..
        }
    ));
    assert!(matches!(
        store.serialize("t"),
        Err(StoreError::UnknownTag { .. })
    ));
    store
        .add_named_blob("k", &[0; 4], 16, "../escape", None)
        .unwrap();
    let dir = scratch_dir("badtag");
    assert!(matches!(
        store.write_all(&dir),
        Err(StoreError::BadTag { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn atomic_write_replaces_the_file_and_leaves_no_temporary() {
    let dir = scratch_dir("atomic");
    let path = dir.join("x.ptd");
    let mut first = NamedBlobStore::new();
    first.add_named_blob("k", &[1; 10], 16, "x", None).unwrap();
    first.write_ptd("x", &path).unwrap();
    // A reader holding the old file keeps seeing it after the replacement.
    let old = FileDataMap::open_ptd(&path).unwrap();
    let mut second = NamedBlobStore::new();
    second.add_named_blob("k", &[2; 10], 16, "x", None).unwrap();
    second.write_ptd("x", &path).unwrap();
    assert_eq!(&*old.get_data("k").unwrap(), &[1; 10]);
    assert_eq!(
        &*FileDataMap::open_ptd(&path).unwrap().get_data("k").unwrap(),
        &[2; 10]
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["x.ptd".to_string()]);
    // Writing into a missing directory fails cleanly and creates nothing.
    let err = second
        .write_ptd("x", &dir.join("missing/x.ptd"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn buffers_outlive_their_map_and_free_early() {
    let mut store = NamedBlobStore::new();
    store.add_named_blob("k", &[7; 64], 16, "t", None).unwrap();
    let bytes = store.serialize("t").unwrap();
    let map = FileDataMap::from_bytes(&bytes, None, "mem").unwrap();
    let mut buf = map.get_data("k").unwrap();
    drop(map);
    assert_eq!(&*buf, &[7; 64]);
    buf.free();
    assert!(buf.is_freed());
    assert!(buf.is_empty());
}

#[test]
fn load_data_into_checks_the_size() {
    let mut map = InMemoryMap::new("mem");
    map.insert("k", &[5; 8], 16, None).unwrap();
    let mut exact = [0u8; 8];
    map.load_data_into("k", &mut exact).unwrap();
    assert_eq!(exact, [5; 8]);
    let mut short = [0u8; 7];
    let err = map.load_data_into("k", &mut short).unwrap_err();
    assert!(matches!(
        err,
        NamedDataError::SizeMismatch {
            data_size: 8,
            buffer_size: 7,
            ..
        }
    ));
    assert!(matches!(
        map.get_data("missing"),
        Err(NamedDataError::KeyNotFound { .. })
    ));
    assert!(matches!(
        map.key_at(1),
        Err(NamedDataError::IndexOutOfRange { index: 1, len: 1 })
    ));
    assert!(matches!(
        map.insert("k", &[1], 16, None),
        Err(NamedDataError::DuplicateKey { .. })
    ));
    assert_eq!(map.get_data("k").unwrap().as_ptr() as usize % 16, 0);
}

#[test]
fn merged_maps_union_keys_and_reject_a_key_in_two_sources() {
    let mut a = InMemoryMap::new("a.ptd");
    a.insert("x", &[1], 16, None).unwrap();
    a.insert("shared", &[2], 16, None).unwrap();
    let mut b = InMemoryMap::new("b.ptd");
    b.insert("y", &[3], 16, None).unwrap();
    let empty = InMemoryMap::new("empty");
    let merged = MergedMap::new(vec![Arc::new(a), Arc::new(empty), Arc::new(b)]).unwrap();
    assert_eq!(merged.num_keys(), 3);
    let keys: Vec<&str> = (0..3).map(|i| merged.key_at(i).unwrap()).collect();
    assert_eq!(keys, ["x", "shared", "y"]);
    assert_eq!(&*merged.get_data("y").unwrap(), &[3]);
    assert!(matches!(
        merged.get_data("z"),
        Err(NamedDataError::KeyNotFound { .. })
    ));

    let mut c = InMemoryMap::new("c.ptd");
    c.insert("shared", &[9], 16, None).unwrap();
    let mut d = InMemoryMap::new("d.ptd");
    d.insert("shared", &[2], 16, None).unwrap();
    let err = MergedMap::new(vec![Arc::new(c), Arc::new(d)])
        .err()
        .unwrap();
    match err {
        NamedDataError::DuplicateKeyAcrossMaps { key, first, second } => {
            assert_eq!(
                (key.as_str(), first.as_str(), second.as_str()),
                ("shared", "c.ptd", "d.ptd")
            );
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(MergedMap::new(vec![]).unwrap().num_keys(), 0);
}

#[test]
fn maps_are_shared_across_threads() {
    let bytes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/mlp_xnn_external.ptd"),
    )
    .unwrap();
    let map = Arc::new(FileDataMap::from_bytes(&bytes, None, "mlp").unwrap());
    let keys: Vec<String> = (0..map.num_keys())
        .map(|i| map.key_at(i).unwrap().to_string())
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (map, keys) = (map.clone(), &keys);
            s.spawn(move || {
                for round in 0..50 {
                    let key = &keys[(t + round) % keys.len()];
                    let data = map.get_data(key).unwrap();
                    let hex = xnnblob::sha256::to_hex(&xnnblob::sha256::sha256(&data));
                    assert_eq!(&hex, key);
                }
            });
        }
    });
}
