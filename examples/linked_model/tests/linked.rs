//! Linked parameters: same outputs as the .ptd, one symbol per parameter in the dedicated
//! section, data in the binary's image, alignment kept, unknown id/key "not found".

use std::path::{Path, PathBuf};
use xnnblob::named_data::{FileDataMap, NamedDataMap};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/executorch")
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn outputs_equal_those_of_the_ptd() {
    let input = f32s(&data().join("mlp.input.f32"));
    let backend = xnnblob::backend::Backend::with_defaults().unwrap();
    let linked = linked_model::load(&backend, &data().join("mlp_xnn_external.pte")).unwrap();
    let from_file = xnnblob::program::Program::load(
        &backend,
        data().join("mlp_xnn_external.pte"),
        &[data().join("mlp_xnn_external.ptd")],
        None,
    )
    .unwrap();
    let a = linked
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap();
    let b = from_file
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap();
    assert_eq!(a, b);
    // And the binary runs with no .ptd given.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linked-model"))
        .arg(data().join("mlp_xnn_external.pte"))
        .arg(data().join("mlp.input.f32"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{:?}", a[0])
    );
}

#[test]
fn nm_lists_one_symbol_per_parameter_in_the_section_with_its_size() {
    let ptd = FileDataMap::open_ptd(data().join("mlp_xnn_external.ptd")).unwrap();
    let bin = env!("CARGO_BIN_EXE_linked-model");
    let nm = std::process::Command::new("nm")
        .args(["-S", "--defined-only", bin])
        .output()
        .unwrap();
    assert!(nm.status.success());
    let nm = String::from_utf8_lossy(&nm.stdout);
    let objdump = std::process::Command::new("objdump")
        .args(["-t", bin])
        .output()
        .unwrap();
    let objdump = String::from_utf8_lossy(&objdump.stdout);
    for (id, e) in ptd.entries().iter().enumerate() {
        let name = format!("XNNBLOB_MLP_XNN_EXTERNAL_PARAM_{id}");
        let line = nm
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("nm lists no {name}"));
        let size = usize::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(size, e.size, "{name}");
        let in_section = objdump.lines().any(|l| {
            l.contains(".xnnblob_params") && l.split_whitespace().last() == Some(name.as_str())
        });
        assert!(in_section, "{name} is in .xnnblob_params");
    }
}

#[test]
fn data_is_in_the_binary_image_aligned_as_in_the_ptd() {
    let map = linked_model::linked_map();
    let ptd = FileDataMap::open_ptd(data().join("mlp_xnn_external.ptd")).unwrap();
    let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let image: Vec<(usize, usize)> = maps
        .lines()
        .filter(|l| l.ends_with(exe.to_str().unwrap()))
        .map(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect();
    assert!(!image.is_empty());
    for e in ptd.entries() {
        let linked = map.get_data(&e.key).unwrap();
        assert_eq!(
            linked.data(),
            ptd.get_data(&e.key).unwrap().data(),
            "{}",
            e.key
        );
        let p = linked.as_ptr() as usize;
        assert!(
            image.iter().any(|&(a, b)| p >= a && p + linked.len() <= b),
            "{} is in the image",
            e.key
        );
        let align = xnnblob::named_data::alignment_of(e.offset).clamp(16, 4096);
        assert_eq!(p % align, 0, "{} keeps its {align}-byte alignment", e.key);
    }
}

#[test]
fn unknown_id_and_key_are_not_found() {
    let map = linked_model::linked_map();
    assert!(linked_model::params::lookup_linked_param(9999).is_none());
    assert!(
        map.by_id(9999)
            .unwrap_err()
            .to_string()
            .contains("not found")
    );
    assert!(
        map.get_data("no-such-key")
            .unwrap_err()
            .to_string()
            .contains("not found")
    );
    let mut len = 7usize;
    // SAFETY: `len` is a valid usize.
    let ptr = unsafe {
        linked_model::params::xnnblob_mlp_xnn_external_lookup_linked_param(9999, &mut len)
    };
    assert!(ptr.is_null() && len == 0);
    // SAFETY: as above.
    let ptr =
        unsafe { linked_model::params::xnnblob_mlp_xnn_external_lookup_linked_param(0, &mut len) };
    assert!(!ptr.is_null() && len == map.by_id(0).unwrap().len());
}

#[test]
fn two_models_link_into_one_binary_under_their_own_names() {
    use linked_model::{params, second};
    assert_eq!(
        params::C_LOOKUP_SYMBOL,
        "xnnblob_mlp_xnn_external_lookup_linked_param"
    );
    assert_eq!(
        second::C_LOOKUP_SYMBOL,
        "xnnblob_mlp_portable_external_lookup_linked_param"
    );
    // This test binary uses both models (below), so it holds both sets of symbols.
    let nm = std::process::Command::new("nm")
        .arg("--defined-only")
        .arg(std::env::current_exe().unwrap())
        .output()
        .unwrap();
    let nm = String::from_utf8_lossy(&nm.stdout);
    assert!(params::lookup_linked_param(0).is_some());
    for model in ["MLP_XNN_EXTERNAL", "MLP_PORTABLE_EXTERNAL"] {
        assert!(
            nm.contains(&format!("XNNBLOB_{model}_PARAM_0")),
            "{model}'s parameters are in the binary"
        );
    }
    // Each model's keys resolve to its own bytes.
    let ptd = FileDataMap::open_ptd(data().join("mlp_portable_external.ptd")).unwrap();
    let key = &ptd.entries()[0].key;
    let id = second::LINKED_PARAM_KEYS
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, id)| *id)
        .unwrap();
    assert_eq!(
        second::lookup_linked_param(id).unwrap(),
        ptd.get_data(key).unwrap().data()
    );
}
