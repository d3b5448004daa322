//! `xnnblob cache stats|verify|compact` on a real cache file.

use crate::common;

use std::path::Path;
use xnnblob::cache::{PackedWeightsCache, format};
use xnnblob::xnn::Runtime;
use xnnblob_test_support::synthetic::Mlp;

fn xnnblob(args: &[&str]) -> (bool, String) {
    crate::run_xnnblob_in(Path::new("."), args)
}

fn make_cache(path: &Path) {
    let mlp = Mlp::random(&[32, 32, 16], 4);
    let cache = PackedWeightsCache::open(path).unwrap();
    let _regs = common::register_mlps(&cache, &[&mlp]);
    let graph = mlp.subgraph(1).unwrap();
    let _rt = Runtime::new(&graph, Some(&*cache)).unwrap();
    cache.finalize().unwrap();
}

#[test]
fn stats_verify_and_compact() {
    let dir = common::scratch("cache-cli");
    let path = dir.join("w.xbc");
    make_cache(&path);
    let p = path.to_str().unwrap();

    let (ok, out) = xnnblob(&["cache", "stats", p]);
    assert!(ok, "{out}");
    assert!(out.contains("2 entries"), "{out}");
    assert!(
        out.contains("stale 0 bytes, evictable 0 bytes"),
        "one save, all live: {out}"
    );
    let (ok, out) = xnnblob(&["cache", "verify", p]);
    assert!(ok && !out.contains("corrupt"), "{out}");

    let mut bytes = std::fs::read(&path).unwrap();
    bytes[format::HEADER_SIZE + 8] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (ok, out) = xnnblob(&["cache", "verify", p]);
    assert!(!ok, "verify fails on a corrupt entry: {out}");
    assert!(
        out.contains("corrupt entry") && out.contains("rewrote"),
        "{out}"
    );
    let (ok, out) = xnnblob(&["cache", "verify", p]);
    assert!(ok && out.contains("1 entries"), "{out}");
    let (ok, out) = xnnblob(&["cache", "compact", p]);
    assert!(ok, "{out}");

    std::fs::write(&path, b"not a cache").unwrap();
    let (ok, out) = xnnblob(&["cache", "stats", p]);
    assert!(!ok && out.contains("rebuilt"), "{out}");
}

#[test]
fn a_short_kill_9_campaign_loses_nothing() {
    // The short run of `xnnblob-lab torture` (the long one is in docs/cache.md) against this
    // `xnnblob`: launches of `xnnblob run` killed while packing, saving or renaming; each next
    // launch must give the outputs of a run without cache, the file must verify, and at the end
    // it must be the size of one built from scratch with no temporary file left.
    let scratch = common::scratch("torture");
    let report = xnnblob_lab::torture::torture(&xnnblob_lab::torture::TortureOptions {
        kills: 60,
        mib: 4,
        seed: 1,
        // The campaign makes the directory itself: it must not exist yet.
        dir: scratch.join("campaign"),
        exe: env!("CARGO_BIN_EXE_xnnblob").into(),
    })
    .unwrap();
    let text = report.to_string();
    assert!(text.contains("kills: 60 ("), "{text}");
    assert!(
        report.passed()
            && text.contains("failed: 0, wrong outputs: 0")
            && text.contains("0 failed of 60")
            && text.contains("0 temporary files left, file 1.000x")
            && text.contains("PASS"),
        "{text}"
    );
}

/// `cache verify --program` loads the program warm against the file, so every entry it uses is
/// checked against the size XNNPACK reads: an entry cut short (checksums recomputed, so the plain
/// verify passes) is reported, repacked and repaired, and the command exits 1; run again, it
/// passes.
#[test]
fn verify_against_a_program_finds_an_entry_of_the_wrong_size_and_repairs_it() {
    let dir = common::scratch("cache-verify-program");
    let path = dir.join("w.xbc");
    let data = common::repo_root().join("tests/data/executorch/export");
    let pte = data.join("id_transposed_twins_fp32.pte");
    let ptd = data.join("id_transposed_twins_fp32.ptd");
    let input = data.join("id_transposed_twins_fp32.s0.in0.bin");
    let (pte, ptd, input, p) = (
        pte.to_str().unwrap(),
        ptd.to_str().unwrap(),
        input.to_str().unwrap(),
        path.to_str().unwrap(),
    );
    let (ok, out) = xnnblob(&["run", pte, "--data", ptd, "--input", input, "--cache", p]);
    assert!(ok, "the cold launch: {out}");
    let (ok, out) = xnnblob(&["cache", "verify", p, "--program", pte, "--data", ptd]);
    assert!(ok && out.contains("0 missed"), "warm: {out}");

    let compat = format::Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let bytes = std::fs::read(&path).unwrap();
    let decoded = format::decode(&bytes, &compat).unwrap();
    let mut entries = decoded.entries.clone();
    entries[0].size -= 64;
    std::fs::write(
        &path,
        format::reindexed(&bytes, &entries, &decoded.sources).unwrap(),
    )
    .unwrap();
    let (ok, out) = xnnblob(&["cache", "verify", p]);
    assert!(ok, "checksums alone see nothing wrong: {out}");
    let (ok, out) = xnnblob(&["cache", "verify", p, "--program", pte, "--data", ptd]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("1 entries of another size") && out.contains("rewrote"),
        "{out}"
    );
    let (ok, out) = xnnblob(&["cache", "verify", p, "--program", pte, "--data", ptd]);
    assert!(ok && out.contains("0 missed"), "repaired: {out}");
}
