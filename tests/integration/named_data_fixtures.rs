//! Every ExecuTorch fixture opens, and what xnnblob reads equals what the manifest says.

use serde_json::Value;
use std::path::{Path, PathBuf};
use xnnblob::named_data::{FileDataMap, NamedDataMap, ptd_format, pte_format};
use xnnblob::sha256::{sha256, to_hex};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch")
}

/// The per-fixture manifests (`<name>.json` with a `pte` section).
fn manifests() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            if v.get("pte").is_some() {
                out.push((path.file_stem().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 11,
        "expected every fixture manifest, found {}",
        out.len()
    );
    out
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Checks a map's entries against a manifest's named_data list.
fn check_entries(map: &FileDataMap, named: &[Value], what: &str) {
    assert_eq!(map.num_keys(), named.len(), "{what}: key count");
    assert!(!map.lists("not a key of any fixture"), "{what}");
    for (i, expected) in named.iter().enumerate() {
        let key = expected["key"].as_str().unwrap();
        assert_eq!(map.key_at(i).unwrap(), key, "{what}: key order");
        assert!(map.lists(key), "{what}: {key} not listed");
        let data = map.get_data(key).unwrap();
        assert_eq!(
            data.len() as u64,
            u(&expected["nbytes"]),
            "{what}: {key} size"
        );
        assert_eq!(map.data_size(key).unwrap(), data.len());
        assert_eq!(
            to_hex(&sha256(&data)),
            expected["sha256"].as_str().unwrap(),
            "{what}: {key} sha256"
        );
        let entry = &map.entries()[i];
        assert_eq!(
            entry.offset as u64,
            u(&expected["file_offset"]),
            "{what}: {key} offset"
        );
        assert_eq!(
            u64::from(entry.segment_index),
            u(&expected["segment_index"]),
            "{what}: {key} segment"
        );
        let layout = map.get_tensor_layout(key).unwrap();
        if expected["layout_source"] == "ptd tensor_layout" {
            let layout = layout.unwrap_or_else(|| panic!("{what}: {key} has a layout"));
            assert_eq!(
                layout.scalar_type().name(),
                expected["dtype"].as_str().unwrap()
            );
            let shape: Vec<i32> = expected["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| u(d) as i32)
                .collect();
            assert_eq!(layout.sizes(), &shape[..], "{what}: {key} sizes");
            let dim_order: Vec<u8> = expected["dim_order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| u(d) as u8)
                .collect();
            assert_eq!(
                layout.dim_order(),
                &dim_order[..],
                "{what}: {key} dim order"
            );
            assert_eq!(layout.nbytes(), Some(data.len()));
        } else {
            // XNNPACK's constants are stored without a layout: a clear None, not a crash.
            assert_eq!(layout, None, "{what}: {key}");
        }
    }
}

#[test]
fn every_fixture_pte_matches_its_manifest() {
    for (name, manifest) in manifests() {
        let pte = &manifest["pte"];
        let path = data_dir().join(pte["file"].as_str().unwrap());
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, u(&pte["file_size"]), "{name}");

        let header = pte_format::parse_header(&bytes).unwrap();
        match &pte["extended_header"] {
            Value::Null => assert_eq!(header, None, "{name}"),
            h => {
                let header = header.unwrap_or_else(|| panic!("{name}: extended header"));
                assert_eq!(u64::from(header.length), u(&h["length"]));
                assert_eq!(header.program_size, u(&h["program_size"]));
                assert_eq!(header.segment_base_offset, u(&h["segment_base_offset"]));
                assert_eq!(header.segment_data_size, u(&h["segment_data_size"]));
            }
        }
        let map = FileDataMap::open_pte(&path).unwrap();
        let base = pte["extended_header"]["segment_base_offset"]
            .as_u64()
            .unwrap_or(0);
        let segments: Vec<(usize, usize)> = pte["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| ((base + u(&s["offset"])) as usize, u(&s["size"]) as usize))
            .collect();
        assert_eq!(map.segments(), &segments[..], "{name}: segments");
        check_entries(&map, pte["named_data"].as_array().unwrap(), &name);
    }
}

#[test]
fn every_fixture_ptd_matches_its_manifest() {
    let mut checked = 0;
    for (name, manifest) in manifests() {
        for ptd in manifest["ptd"].as_array().unwrap() {
            let path = data_dir().join(ptd["file"].as_str().unwrap());
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len() as u64, u(&ptd["file_size"]), "{name}");
            let header = ptd_format::parse_header(&bytes).unwrap();
            let h = &ptd["header"];
            assert_eq!(u64::from(header.length), u(&h["length"]));
            assert_eq!(header.flatbuffer_offset, u(&h["flatbuffer_offset"]));
            assert_eq!(header.flatbuffer_size, u(&h["flatbuffer_size"]));
            assert_eq!(header.segment_base_offset, u(&h["segment_base_offset"]));
            assert_eq!(header.segment_data_size, u(&h["segment_data_size"]));

            let map = FileDataMap::open_ptd(&path).unwrap();
            let base = header.segment_base_offset;
            let segments: Vec<(usize, usize)> = ptd["segments"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| ((base + u(&s["offset"])) as usize, u(&s["size"]) as usize))
                .collect();
            assert_eq!(map.segments(), &segments[..], "{name}: segments");
            check_entries(&map, ptd["named_data"].as_array().unwrap(), &name);
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "every external-data fixture checked, got {checked}"
    );
}

#[test]
fn xnnpack_keys_are_the_sha256_of_their_bytes() {
    // The fact the packed-weight cache builds on: ExecuTorch's XNNPACK keys name content.
    for (name, manifest) in manifests() {
        let files = manifest["ptd"]
            .as_array()
            .unwrap()
            .iter()
            .chain([&manifest["pte"]]);
        for f in files {
            let map = FileDataMap::open(data_dir().join(f["file"].as_str().unwrap())).unwrap();
            for e in f["named_data"].as_array().unwrap() {
                if e["key_is_sha256_of_bytes"] == true {
                    let key = e["key"].as_str().unwrap();
                    assert_eq!(to_hex(&sha256(&map.get_data(key).unwrap())), key, "{name}");
                }
            }
        }
    }
}

/// A map in memory, a merge of maps and a map that answers by walking its keys (the trait's own
/// `lists`) agree on which keys they list.
#[test]
fn every_map_lists_exactly_its_keys() {
    use std::sync::Arc;
    use xnnblob::named_data::{DataBuffer, InMemoryMap, MergedMap, NamedDataError, TensorLayout};

    /// Only the required methods: `lists` is the trait's walk over `key_at`.
    struct Walked(InMemoryMap);
    impl NamedDataMap for Walked {
        fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
            self.0.get_data(key)
        }
        fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
            self.0.data_size(key)
        }
        fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
            self.0.get_tensor_layout(key)
        }
        fn num_keys(&self) -> usize {
            self.0.num_keys()
        }
        fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
            self.0.key_at(index)
        }
        fn name(&self) -> &str {
            self.0.name()
        }
    }

    let mut first = InMemoryMap::new("first");
    first.insert("a", &[1, 2, 3], 16, None).unwrap();
    first.insert("b", &[4], 16, None).unwrap();
    let mut second = InMemoryMap::new("second");
    second.insert("c", &[5, 6], 16, None).unwrap();
    assert!(first.lists("a") && first.lists("b") && !first.lists("c") && !first.lists(""));
    let merged = MergedMap::new(vec![Arc::new(first), Arc::new(second)]).unwrap();
    for key in ["a", "b", "c"] {
        assert!(merged.lists(key), "{key}");
    }
    assert!(!merged.lists("d") && !merged.lists("a\0"));

    let mut inner = InMemoryMap::new("walked");
    inner.insert("only", &[7], 16, None).unwrap();
    let walked = Walked(inner);
    assert!(walked.lists("only") && !walked.lists("onl") && !walked.lists("only "));
}
