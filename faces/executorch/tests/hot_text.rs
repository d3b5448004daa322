//! The functions a launch runs lie together at the start of the library's text (`hot-text.ld`,
//! written by `scripts/hot-text.sh`): the kernel maps code 64 KiB around each page first touched,
//! so scattered among the rest they kept every 64 KiB of the library's Rust code resident.
//!
//! Read from the built library's symbol table with `nm`, which the set-up's compiler brings.

use std::path::Path;
use std::process::Command;
use xnnblob_test_support::drop_in;

/// Whether `name` matches `pattern`, a linker script's section-name glob with `*` only.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// The symbol patterns the script names (its `.text.NAME` patterns; rustc's hashes are
/// wildcards in them, so they hold in any profile and checkout). C and C++ functions are named
/// by their own sections: GCC puts the cold part `NAME.cold` of one in `.text.unlikely.NAME`, a
/// static constructor `NAME` in `.text.startup.NAME`.
fn symbol_patterns(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("*(.text."))
        .filter_map(|l| l.split([' ', ')']).next())
        .map(|p| {
            if let Some(name) = p.strip_prefix("unlikely.") {
                format!("{name}.cold")
            } else {
                p.strip_prefix("startup.").unwrap_or(p).to_string()
            }
        })
        .collect()
}

/// The lines that name a whole object of an archive (`*ARCHIVE:MEMBER(.text)`).
fn archive_members(script: &str) -> Vec<&str> {
    script
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('*') && !l.starts_with("*(") && l.contains(':'))
        .collect()
}

/// (address, size, name) of each function in the library.
fn functions(library: &Path) -> Vec<(u64, u64, String)> {
    let out = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(library)
        .output()
        .expect("nm runs");
    assert!(out.status.success(), "nm {}", library.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            match p[..] {
                [a, s, t, n] if "tTwW".contains(t) => Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(s, 16).ok()?,
                    n.to_string(),
                )),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn the_functions_a_launch_runs_lie_together_at_the_start_of_the_text() {
    if std::env::var("XNNBLOB_HOT_TEXT").as_deref() == Ok("0") {
        xnnblob_test_support::cannot_run("XNNBLOB_HOT_TEXT=0 builds without hot-text.ld");
        return;
    }
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("hot-text.ld")).unwrap();
    let patterns = symbol_patterns(&script);
    assert!(patterns.len() > 300, "{} patterns", patterns.len());
    // Every line names sections by name alone, but for glibc's own objects linked into the
    // library (`atexit`): a line that names an archive of this build matches nothing, since
    // rustc bundles XNNPACK's archives into its crate's rlib.
    let members = archive_members(&script);
    for line in &members {
        assert!(
            line.starts_with("*libc_nonshared.a:"),
            "{line}: only glibc's objects are named by archive"
        );
    }
    let named_lines = script.lines().filter(|l| l.trim().starts_with('*')).count();
    assert_eq!(
        named_lines,
        patterns.len() + members.len(),
        "lines this test cannot read"
    );
    let library = drop_in::backend_library(env!("CARGO_BIN_EXE_xnnblob-et-run"));
    let all = functions(&library);
    let named = |n: &str| patterns.iter().any(|p| glob(p, n));
    let hot: Vec<&(u64, u64, String)> = all.iter().filter(|(_, _, n)| named(n)).collect();

    // The script is not stale: most of what it names is still in the library.
    let found = patterns
        .iter()
        .filter(|p| hot.iter().any(|(_, _, n)| glob(p, n)))
        .count();
    assert!(
        found * 10 >= patterns.len() * 9,
        "only {found} of the script's {} functions are in the library: run scripts/hot-text.sh",
        patterns.len()
    );

    // Together, from the start of the text: 95% of their bytes lie within 1.5 times their size
    // of it (0.9 times here; laid out as compiled, 3 times).
    let start = all.iter().map(|f| f.0).min().unwrap();
    let mut hot = hot;
    hot.sort();
    let bytes: u64 = hot.iter().map(|f| f.1).sum();
    let mut covered = 0;
    let reach = hot
        .iter()
        .find_map(|f| {
            covered += f.1;
            (covered * 20 >= bytes * 19).then_some(f.0 + f.1 - start)
        })
        .unwrap();
    assert!(
        reach * 2 <= bytes * 3,
        "95% of the {bytes} bytes of functions a launch runs reach {reach} bytes into the text"
    );
}

#[test]
fn glob_matches_as_a_linker_script_does() {
    assert!(glob("_ZN3abc17h*", "_ZN3abc17h0123456789abcdefE"));
    assert!(glob("_RNvCs*_3std4read*", "_RNvCs1x2y_3std4read"));
    assert!(glob("abc*", "abc"));
    assert!(!glob("_ZN3abc17h*", "_ZN3abd17h0123456789abcdefE"));
    assert!(!glob("_RNvCs*_3std4read*", "_RNvCs1x2y_3std5write"));
    assert!(!glob("abc", "abcd"));
}
