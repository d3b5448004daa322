//! The command on a series and a tree of its own making: what it applies, and that it names the
//! patch that fails (the real series on XNNPACK's tree is applied by every build of
//! `xnnpack-sys` and by its `xnnpack_own_tests`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIRST: &str = "\
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
";

const SECOND: &str = "\
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
 TWO
-four
+FOUR
";

/// A series (one kernel, the patches given) and an XNNPACK-looking tree, under a directory of
/// this test's own.
fn setup(name: &str, patches: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = fs::remove_dir_all(&root);
    let (series, tree) = (root.join("series"), root.join("tree"));
    fs::create_dir_all(series.join("kernels/x86_64")).unwrap();
    fs::create_dir_all(series.join("patches")).unwrap();
    fs::write(series.join("kernels/x86_64/k.c"), "int k;\n").unwrap();
    fs::write(series.join("patches/README"), "not a patch\n").unwrap();
    for (file, text) in patches {
        fs::write(series.join("patches").join(file), text).unwrap();
    }
    fs::create_dir_all(tree.join("include")).unwrap();
    fs::write(tree.join("include/xnnpack.h"), "").unwrap();
    fs::write(tree.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    (series, tree)
}

fn run(series: &Path, tree: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xnnpack-series"))
        .arg("--series")
        .arg(series)
        .arg(tree)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn applies_the_kernels_then_the_patches_in_name_order() {
    let (series, tree) = setup("applies", &[("0001-two.patch", FIRST)]);
    let (code, stdout, stderr) = run(&series, &tree);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("1 kernel files, 1 patches"), "{stdout}");
    assert_eq!(
        fs::read_to_string(tree.join("a.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        fs::read_to_string(tree.join("xnnblob/x86_64/k.c")).unwrap(),
        "int k;\n"
    );
}

#[test]
fn names_the_first_patch_that_does_not_apply_and_keeps_the_ones_before_it() {
    let (series, tree) = setup(
        "fails",
        &[("0002-four.patch", SECOND), ("0001-two.patch", FIRST)],
    );
    let (code, _, stderr) = run(&series, &tree);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "patch 0002-four.patch (2 of 2) does not apply to the tree the 1 before it made"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("FAILED"),
        "patch's own words are kept: {stderr}"
    );
    assert_eq!(
        fs::read_to_string(tree.join("a.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
}

#[test]
fn refuses_a_directory_that_is_no_xnnpack_tree() {
    let (series, tree) = setup("not_a_tree", &[("0001-two.patch", FIRST)]);
    fs::remove_file(tree.join("include/xnnpack.h")).unwrap();
    let (code, _, stderr) = run(&series, &tree);
    assert_eq!(code, 1);
    assert!(stderr.contains("is not an XNNPACK source tree"), "{stderr}");
    assert_eq!(
        fs::read_to_string(tree.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
}
