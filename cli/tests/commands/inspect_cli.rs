//! `xnnblob inspect` prints what the fixture manifests say.

use crate::common;

use serde_json::Value;
use std::path::Path;

/// `xnnblob inspect FILE ARGS`, which must succeed.
fn inspect_ok(file: &Path, args: &[&str]) -> std::process::Output {
    let out = crate::xnnblob()
        .arg("inspect")
        .arg(file)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn inspect_json(file: &Path) -> Value {
    serde_json::from_slice(&inspect_ok(file, &["--json", "--sha256"]).stdout).unwrap()
}

#[test]
fn inspect_json_lists_every_key_as_the_manifests_do() {
    let dir = common::repo_root().join("tests/data/executorch");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let Some(pte) = manifest.get("pte") else {
            continue;
        };
        for section in manifest["ptd"].as_array().unwrap().iter().chain([pte]) {
            let printed = inspect_json(&dir.join(section["file"].as_str().unwrap()));
            let expected = section["named_data"].as_array().unwrap();
            let entries = printed["entries"].as_array().unwrap();
            assert_eq!(entries.len(), expected.len());
            for (got, want) in entries.iter().zip(expected) {
                assert_eq!(got["key"], want["key"]);
                assert_eq!(got["segment_index"], want["segment_index"]);
                assert_eq!(got["offset"], want["file_offset"]);
                assert_eq!(got["size"], want["nbytes"]);
                assert_eq!(got["sha256"], want["sha256"]);
                if want["layout_source"] == "ptd tensor_layout" {
                    assert_eq!(got["layout"]["scalar_type"], want["dtype"]);
                    assert_eq!(got["layout"]["sizes"], want["shape"]);
                    assert_eq!(got["layout"]["dim_order"], want["dim_order"]);
                } else {
                    assert!(got["layout"].is_null());
                }
            }
            for seg in printed["segments"].as_array().unwrap() {
                let (offset, alignment) = (
                    seg["offset"].as_u64().unwrap(),
                    seg["alignment"].as_u64().unwrap(),
                );
                assert_eq!(offset % alignment, 0);
            }
            files += 1;
        }
    }
    assert!(files >= 16, "inspected {files} files");
}

#[test]
fn inspect_a_bad_file_fails_with_a_message() {
    let out = crate::xnnblob()
        .args(["inspect", "Cargo.toml"])
        .current_dir(common::repo_root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Cargo.toml") && err.contains("not a .ptd"),
        "{err}"
    );
}

#[test]
fn inspect_json_escapes_any_key() {
    let dir = common::scratch("inspect-keys");
    let keys = [
        "quote \" backslash \\ newline \n tab \t",
        "control \u{1} \u{1f} del \u{7f}",
        "unicode é ✓ \u{2028}",
    ];
    let mut store = xnnblob::named_data::NamedBlobStore::new();
    for (i, key) in keys.iter().enumerate() {
        store
            .add_named_blob(key, &[i as u8; 32], 16, "m", None)
            .unwrap();
    }
    let ptd = dir.join("odd \"name\".ptd");
    store.write_ptd("m", &ptd).unwrap();
    let json = inspect_json(&ptd);
    assert_eq!(json["file"].as_str().unwrap(), ptd.display().to_string());
    let listed: Vec<&str> = json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(listed, keys);
}

#[test]
fn verify_keys_finds_a_weight_edited_after_export() {
    let fixture = common::repo_root().join("tests/data/executorch/mlp_xnn_external.ptd");
    let verify = |file: &Path| {
        let out = crate::xnnblob()
            .args(["inspect", "--verify-keys"])
            .arg(file)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = verify(&fixture);
    assert!(ok && text.contains("0 do not match"), "{text}");

    // Negate the floats of one weight in place, its key unchanged (finding 4 of issue 17).
    let dir = common::scratch("verify-keys");
    let (edited, key) = common::ptd_with_first_weight_negated(&dir);
    let (ok, text) = verify(&edited);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("key {key} holds bytes whose sha256 is"))
            && text.contains("1 do not match"),
        "{text}"
    );
}

/// Issue 43: `xnnblob inspect` warns, on stderr, about a shared buffer that ExecuTorch's
/// partitioner froze into a delegate (`frozen_matmul_operand`), naming the method, the buffer and
/// the recipe, and says nothing of the same program exported with the recipe.
#[test]
fn inspect_warns_of_a_shared_buffer_frozen_into_a_delegate() {
    let export = common::repo_root().join("tests/data/executorch/export");
    let stderr_of = |name: &str| {
        String::from_utf8_lossy(&inspect_ok(&export.join(name), &[]).stderr).into_owned()
    };
    let warned = stderr_of("frozen_matmul_operand.pte");
    assert!(
        warned.contains("warning: method \"step\"")
            && warned.contains("value 0 of prefill")
            && warned.contains("Methods that share state"),
        "{warned}"
    );
    assert_eq!(stderr_of("shared_matmul_operand.pte"), "");
}
