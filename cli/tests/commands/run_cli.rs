//! `xnnblob run` on real ExecuTorch programs.

use crate::common;

use common::{Tmpfs, scratch};
use std::path::Path;
use std::process::Command;

/// `xnnblob run ARGS` beside the fixtures, whose names the arguments use.
fn run(args: &[&str]) -> (bool, String) {
    let args: Vec<&str> = std::iter::once("run").chain(args.iter().copied()).collect();
    crate::run_xnnblob_in(&common::repo_root().join("tests/data/executorch"), &args)
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn run_writes_outputs_and_a_warm_cache_packs_nothing() {
    let tmp = scratch("run");
    let cache = tmp.join("w.xbc");
    let out_dir = tmp.join("out");
    let args = [
        "two_methods_xnn_external.pte",
        "--data",
        "two_methods_xnn_external.ptd",
        "--method",
        "forward_relu",
        "--input",
        "two_methods.input.f32",
        "--cache",
        cache.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ];
    let (ok, text) = run(&args);
    assert!(ok, "{text}");
    assert!(
        text.contains("forward_relu") && text.contains("output 0: float32 [2, 32], 64 values"),
        "{text}"
    );
    let got = f32s(&out_dir.join("output0.f32"));
    let want = f32s(&common::repo_root().join("tests/data/executorch/two_methods.output1.f32"));
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    let (ok, text) = run(&args);
    assert!(ok && text.contains("(0 weights packed"), "{text}");
}

#[test]
fn run_reports_clear_errors() {
    let (ok, text) = run(&["mlp_portable_inline.pte", "--input", "mlp.input.f32"]);
    assert!(
        !ok && text.contains("not fully delegated") && text.contains("aten::"),
        "{text}"
    );
    let (ok, text) = run(&["mlp_xnn_external.pte", "--input", "mlp.input.f32"]);
    assert!(!ok && text.contains("not found"), "missing .ptd: {text}");
    let (ok, text) = run(&["mlp_xnn_inline.pte", "--input", "cnn.input.f32"]);
    assert!(!ok && text.contains("bytes"), "wrong input size: {text}");
    let (ok, text) = run(&[
        "mlp_xnn_inline.pte",
        "--method",
        "nope",
        "--input",
        "mlp.input.f32",
    ]);
    assert!(!ok && text.contains("no method"), "{text}");
}

/// The MLP fixture's run arguments with `--cache path`.
fn mlp_with_cache(path: &Path) -> Vec<String> {
    [
        "mlp_xnn_external.pte",
        "--data",
        "mlp_xnn_external.ptd",
        "--input",
        "mlp.input.f32",
        "--cache",
        path.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

fn run_strings(args: &[String]) -> (bool, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&args)
}

#[test]
fn a_cache_path_that_is_not_a_regular_file_is_never_replaced_nor_waited_on() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("non-regular-cache");
    let fifo = dir.join("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    // The test keeps the FIFO open for writing, so that a reader that opened it blocking (the
    // bug: a launch waiting forever) gets through its open and fails on the message checks below
    // instead of hanging the test.
    let _writer = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let directory = dir.join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    // A character device of our own (as root): the test must not risk the machine's /dev/null.
    let device = dir.join("null-device");
    let made_device = Command::new("mknod")
        .args([device.to_str().unwrap(), "c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success());
    if !made_device {
        common::cannot_run("not root: the character device case (mknod) is left out");
    }
    let mut cases = vec![
        (fifo.clone(), "a FIFO"),
        (directory.clone(), "a directory"),
        (dangling.clone(), "a symbolic link to nothing"),
    ];
    if made_device {
        cases.push((device.clone(), "a character device"));
    }
    for (path, kind) in &cases {
        let (ok, text) = run_strings(&mlp_with_cache(path));
        assert!(ok, "{kind}: runs without persistence: {text}");
        assert!(
            text.contains(kind) && text.contains("not a regular file"),
            "{kind}: one clear warning: {text}"
        );
        assert_eq!(text.matches("warning").count(), 1, "{text}");
        let mut strict = mlp_with_cache(path);
        strict.push("--require-cache".into());
        let (ok, text) = run_strings(&strict);
        assert!(
            !ok && text.contains(kind),
            "{kind}, --require-cache: {text}"
        );
    }
    let t = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(t.is_fifo(), "the FIFO is still a FIFO");
    assert!(std::fs::symlink_metadata(&directory).unwrap().is_dir());
    assert!(
        std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    if made_device {
        let t = std::fs::symlink_metadata(&device).unwrap().file_type();
        assert!(t.is_char_device(), "the device is still a device");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".xnnblob-tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The same for --data: a clear error, no hang.
    let (ok, text) = run_strings(
        &[
            "mlp_xnn_external.pte",
            "--data",
            fifo.to_str().unwrap(),
            "--input",
            "mlp.input.f32",
        ]
        .map(String::from),
    );
    assert!(!ok && text.contains("a FIFO, not a regular file"), "{text}");
    let (ok, text) = run(&[
        "mlp_xnn_external.pte",
        "--data",
        directory.to_str().unwrap(),
        "--input",
        "mlp.input.f32",
    ]);
    assert!(
        !ok && text.contains("a directory, not a regular file"),
        "{text}"
    );
}

#[test]
fn a_closed_stdout_ends_the_run_normally_with_its_outputs_written() {
    let dir = scratch("closed-stdout");
    for i in 0..5 {
        let out_dir = dir.join(format!("out{i}"));
        let mut child = crate::xnnblob()
            .args([
                "run",
                "mlp_xnn_external.pte",
                "--data",
                "mlp_xnn_external.ptd",
                "--input",
                "mlp.input.f32",
                "--output-dir",
                out_dir.to_str().unwrap(),
            ])
            .current_dir(common::repo_root().join("tests/data/executorch"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before anything is printed (`| true`).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).is_empty());
        assert!(out_dir.join("output0.f32").is_file());
    }
}

#[test]
fn a_save_reclaims_the_temporaries_of_killed_saves() {
    let dir = scratch("reclaim");
    let cache = dir.join("w.xbc");
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    // What 3 saves killed midway leave: a part-written temporary each.
    for n in 0..3 {
        std::fs::write(
            dir.join(format!(".w.xbc.xnnblob-tmp-{gone_pid}-{n}")),
            vec![7u8; 4096],
        )
        .unwrap();
    }
    let (ok, text) = run_strings(&mlp_with_cache(&cache));
    assert!(ok, "{text}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".xnnblob-tmp-")),
        "left behind: {names:?}"
    );
    assert!(cache.is_file());
}

#[test]
fn a_rejected_cache_file_is_rebuilt_and_the_reason_said_once() {
    let dir = scratch("rejected");
    let cache = dir.join("w.xbc");
    let (ok, text) = run_strings(&mlp_with_cache(&cache));
    assert!(ok && !text.contains("rejected"), "{text}");
    let bytes = std::fs::read(&cache).unwrap();
    // A torn save: the file cut short.
    std::fs::write(&cache, &bytes[..bytes.len() / 2]).unwrap();
    let (ok, text) = run_strings(&mlp_with_cache(&cache));
    assert!(ok, "{text}");
    assert_eq!(
        text.matches("was rejected (no valid trailer (torn or partial file))")
            .count(),
        1,
        "{text}"
    );
    // The same entries, each with the same packed bytes (a cold launch packs ahead on several
    // threads straight into the file, so where each lands may differ).
    let entries = |bytes: &[u8]| {
        let compat = xnnblob::cache::Compat {
            build_id: xnnblob::xnn::build_identifier().to_vec(),
            cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
        };
        let mut e: Vec<_> = xnnblob::cache::format::decode(bytes, &compat)
            .unwrap()
            .entries
            .iter()
            .map(|e| (e.key.kernel, e.key.bias, e.key.seed, e.size, e.checksum))
            .collect();
        e.sort_by_key(|e| (e.0.0, e.1.0, e.2));
        e
    };
    assert_eq!(
        entries(&std::fs::read(&cache).unwrap()),
        entries(&bytes),
        "rebuilt as it was"
    );
    let (ok, text) = run_strings(&mlp_with_cache(&cache));
    assert!(ok && !text.contains("rejected"), "{text}");
}

#[test]
fn damaged_packed_bytes_are_found_after_the_launch_and_repacked_by_the_next() {
    use xnnblob::cache::{Compat, format};
    let dir = scratch("damaged");
    let cache = dir.join("w.xbc");
    let launch = |out: &str| {
        let mut args = mlp_with_cache(&cache);
        args.extend(["--output-dir".into(), dir.join(out).display().to_string()]);
        let (ok, text) = run_strings(&args);
        assert!(ok, "{text}");
        (
            text,
            std::fs::read(dir.join(out).join("output0.f32")).unwrap(),
        )
    };
    let (_, cold) = launch("cold");
    let mut bytes = std::fs::read(&cache).unwrap();
    let compat = Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let entries = format::decode(&bytes, &compat).unwrap().entries;
    let victim = entries
        .iter()
        .find(|e| !e.key.keeps_constant())
        .expect("a packed weight");
    // One flipped byte in the middle of a packed weight, as a bad sector would leave it.
    bytes[(victim.offset + victim.size / 2) as usize] ^= 0x40;
    std::fs::write(&cache, &bytes).unwrap();

    let (text, _) = launch("damaged");
    assert!(
        text.contains("1 packed weights of") && text.contains("failed their checksum"),
        "the launch that used it says so: {text}"
    );
    let (ok, text) = {
        let out = crate::xnnblob()
            .args(["cache", "verify", cache.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert!(ok, "the file was rewritten without it: {text}");
    assert!(
        text.contains(&format!("{} entries", entries.len() - 1)),
        "{text}"
    );

    let (text, next) = launch("next");
    assert!(
        text.contains("(1 weights packed"),
        "the next launch repacks it: {text}"
    );
    assert!(!text.contains("checksum"), "{text}");
    assert_eq!(next, cold, "and computes the cold outputs");
}

#[test]
fn a_full_or_read_only_disk_runs_right_without_persistence_and_warns_once() {
    let dir = scratch("full-disk");
    let spec = xnnblob_test_support::synthetic::model::ModelSpec {
        preset: xnnblob_test_support::synthetic::model::Preset::LlmLike,
        dtype: xnnblob_test_support::synthetic::model::Dtype::Qd8,
        mib: 4,
        layers: 8,
    };
    let files = xnnblob_test_support::synthetic::model::ensure(&spec, &dir.join("models")).unwrap();
    let input = dir.join("input.f32");
    spec.write_input(&input).unwrap();
    let args = |cache: Option<&Path>, out: &str| {
        let mut a = vec![
            files.pte.display().to_string(),
            "--data".into(),
            files.ptd.display().to_string(),
            "--input".into(),
            input.display().to_string(),
            "--output-dir".into(),
            dir.join(out).display().to_string(),
        ];
        if let Some(c) = cache {
            a.extend(["--cache".into(), c.display().to_string()]);
        }
        a
    };
    let (ok, text) = run_strings(&args(None, "reference"));
    assert!(ok, "{text}");
    let reference = std::fs::read(dir.join("reference/output0.f32")).unwrap();

    // 1 MiB of disk for 4 MiB of packed weights: the save fails with ENOSPC.
    let Some(full) = Tmpfs::mount(&dir.join("full"), "size=1m") else {
        return;
    };
    let cache = full.join("w.xbc");
    for launch in 0..2 {
        let out = format!("full{launch}");
        let (ok, text) = run_strings(&args(Some(&cache), &out));
        assert!(ok, "{text}");
        assert_eq!(
            std::fs::read(dir.join(&out).join("output0.f32")).unwrap(),
            reference,
            "right outputs"
        );
        assert_eq!(
            text.matches("not saved").count(),
            1,
            "one warning per launch: {text}"
        );
        assert!(text.contains("No space left on device"), "{text}");
        let names: Vec<_> = std::fs::read_dir(&*full).unwrap().flatten().collect();
        assert!(
            names
                .iter()
                .all(|e| !e.file_name().to_string_lossy().contains(".xnnblob-tmp-")),
            "no temporary left on the full disk"
        );
    }
    drop(full);

    // A read-only mount, and a path under /proc: warned once before the load.
    let Some(read_only) = Tmpfs::mount(&dir.join("ro"), "size=1m,ro") else {
        return;
    };
    for cache in [
        read_only.join("w.xbc"),
        Path::new("/proc/xnnblob.xbc").to_path_buf(),
    ] {
        let (ok, text) = run_strings(&args(Some(&cache), "ro-out"));
        assert!(ok, "{}: {text}", cache.display());
        assert_eq!(
            std::fs::read(dir.join("ro-out/output0.f32")).unwrap(),
            reference
        );
        assert_eq!(
            text.matches("warning").count() + text.matches("not saved").count(),
            1,
            "{}: one warning: {text}",
            cache.display()
        );
    }
}

#[test]
fn eight_processes_cold_starting_one_path_leave_one_valid_file() {
    let dir = scratch("eight-processes");
    let cache = dir.join("w.xbc");
    let one = |out: &Path| {
        let mut args = mlp_with_cache(&cache);
        args.extend(["--output-dir".into(), out.display().to_string()]);
        crate::xnnblob()
            .arg("run")
            .args(&args)
            .current_dir(common::repo_root().join("tests/data/executorch"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (ok, text) = run(&[
        "mlp_xnn_external.pte",
        "--data",
        "mlp_xnn_external.ptd",
        "--input",
        "mlp.input.f32",
        "--output-dir",
        dir.join("reference").to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let reference = std::fs::read(dir.join("reference/output0.f32")).unwrap();
    let mut size = None;
    for round in 0..5 {
        let _ = std::fs::remove_file(&cache);
        let children: Vec<_> = (0..8)
            .map(|p| one(&dir.join(format!("r{round}p{p}"))))
            .collect();
        for (p, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}, process {p}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                std::fs::read(dir.join(format!("r{round}p{p}/output0.f32"))).unwrap(),
                reference,
                "round {round}, process {p}"
            );
        }
        let (ok, text) = {
            let out = crate::xnnblob()
                .args(["cache", "stats", cache.to_str().unwrap()])
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        assert!(ok && text.contains("0 invalid entries"), "{text}");
        let len = std::fs::metadata(&cache).unwrap().len();
        assert_eq!(
            *size.get_or_insert(len),
            len,
            "round {round}: 1x, every round"
        );
        let temporaries = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".xnnblob-tmp-"))
            .count();
        assert_eq!(temporaries, 0, "round {round}");
    }
}

#[test]
fn a_directory_that_refuses_new_files_is_said_once_and_the_launch_runs_right() {
    let dir = scratch("no-permission");
    let closed = dir.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    let cache = closed.join("w.xbc");
    let Some(mut command) =
        common::without_permission_override(Path::new(env!("CARGO_BIN_EXE_xnnblob")))
    else {
        return;
    };
    let mut args = vec!["run".to_string()];
    args.extend(mlp_with_cache(&cache));
    args.extend(["--output-dir".into(), dir.join("out").display().to_string()]);
    let out = command
        .args(&args)
        .current_dir(common::dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let (_, reference) = run(&[
        "mlp_xnn_external.pte",
        "--data",
        "mlp_xnn_external.ptd",
        "--input",
        "mlp.input.f32",
        "--output-dir",
        dir.join("reference").to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(dir.join("out/output0.f32")).unwrap(),
        std::fs::read(dir.join("reference/output0.f32")).unwrap(),
        "{reference}"
    );
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("Permission denied"))
        .collect();
    assert_eq!(lines.len(), 1, "said once: {said}");
    assert!(lines[0].contains(&cache.display().to_string()), "{said}");
    assert!(!cache.exists());
}

/// The exports whose layers share bytes in other shapes, or beside other biases (issue 38), through
/// `xnnblob run`: with no cache file, cold and warm, each output within the exported programs'
/// bounds of ExecuTorch's (the transposed twins were 0.55 of the range off before).
#[test]
fn the_same_bytes_in_two_shapes_or_beside_two_biases_run_right_without_a_cache_cold_and_warm() {
    let tmp = scratch("run-identity");
    for name in [
        "id_transposed_twins_fp32",
        "id_transposed_twins_8da4w",
        "id_zero_init_fp32",
        "id_zero_init_8da4w",
        "id_zero_init_8da8w",
    ] {
        let tolerance = if name.ends_with("fp32") { 1e-5 } else { 1e-3 };
        let expected = f32s(&common::repo_root().join(format!(
            "tests/data/executorch/export/{name}.s0.out_et0.bin"
        )));
        let range = expected.iter().cloned().fold(f32::NEG_INFINITY, f32::max)
            - expected.iter().cloned().fold(f32::INFINITY, f32::min);
        let cache = tmp.join(format!("{name}.xbc"));
        for launch in ["none", "cold", "warm"] {
            let out = tmp.join(format!("{name}-{launch}"));
            let (pte, ptd, input) = (
                format!("export/{name}.pte"),
                format!("export/{name}.ptd"),
                format!("export/{name}.s0.in0.bin"),
            );
            let mut args = vec![
                pte.as_str(),
                "--data",
                ptd.as_str(),
                "--input",
                input.as_str(),
                "--output-dir",
                out.to_str().unwrap(),
            ];
            if launch != "none" {
                args.extend(["--cache", cache.to_str().unwrap()]);
            }
            let (ok, said) = run(&args);
            assert!(ok, "{name} {launch}: {said}");
            let got = f32s(&out.join("output0.f32"));
            assert_eq!(got.len(), expected.len(), "{name} {launch}");
            let worst = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= tolerance * range,
                "{name} {launch}: {worst} off, over a range of {range}"
            );
        }
    }
}

/// The directory of the exports, and the NAME.calls.json of export `name`.
fn export_calls(name: &str) -> (std::path::PathBuf, serde_json::Value) {
    let dir = common::repo_root().join("tests/data/executorch/export");
    let description =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.calls.json"))).unwrap())
            .unwrap();
    (dir, description)
}

/// `xnnblob run` of export `name` with its data files and `rest`: whether it succeeded, its
/// stdout and its stderr.
fn run_export(name: &str, rest: &[String]) -> (bool, String, String) {
    let (dir, description) = export_calls(name);
    let mut args = vec![
        "run".to_string(),
        dir.join(format!("{name}.pte")).display().to_string(),
    ];
    for data in description["data"].as_array().unwrap() {
        args.extend([
            "--data".into(),
            dir.join(data.as_str().unwrap()).display().to_string(),
        ]);
    }
    args.extend(rest.iter().cloned());
    let out = crate::xnnblob().args(&args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The worst difference of call `k`'s output 0 (in `out_dir`) from eager's and from ExecuTorch's
/// stored outputs of `call`, each over the range of the stored one.
fn call_differences(dir: &Path, out_dir: &Path, k: usize, call: &serde_json::Value) -> (f32, f32) {
    let got = f32s(&out_dir.join(format!("step{k}.output0.f32")));
    let stored = |which: &str| f32s(&dir.join(call[which][0]["file"].as_str().unwrap()));
    (
        common::close::relative_difference(&got, &stored("outputs_eager")),
        common::close::relative_difference(&got, &stored("outputs_et")),
    )
}

/// Issue 43: `--call` runs a sequence of methods on one loaded program, sharing its mutable
/// buffers, as NAME.calls.json describes it; every output is eager PyTorch's and ExecuTorch's
/// own (both stored by the export), cold and warm with a cache file (warm packs nothing), and
/// nothing is said of a frozen buffer. A program that needs ExecuTorch's portable operators is
/// refused, naming the operator and saying where it runs: the runner's `--call`, on a Module
/// that shares its arenas.
#[test]
fn calls_of_methods_sharing_mutable_buffers_give_eagers_and_executorchs_outputs() {
    let tmp = scratch("run-calls");
    for name in ["shared_prefill_step", "shared_encoder_decoder"] {
        let (dir, description) = export_calls(name);
        let cache = tmp.join(format!("{name}.xbc"));
        let calls = description["calls"].as_array().unwrap();
        let mut args = Vec::new();
        for call in calls {
            args.extend(["--call".into(), common::io_steps::call_arg(&dir, call)]);
        }
        args.extend(["--cache".into(), cache.display().to_string()]);
        for launch in ["cold", "warm"] {
            let out_dir = tmp.join(format!("{name}-{launch}"));
            let mut a = args.clone();
            a.extend(["--output-dir".into(), out_dir.display().to_string()]);
            let (ok, stdout, stderr) = run_export(name, &a);
            assert!(ok, "{name} {launch}: {stdout}{stderr}");
            assert!(
                stdout.contains(&format!("; {} calls", calls.len())),
                "{stdout}"
            );
            assert!(!stderr.contains("froze"), "{name}: {stderr}");
            if launch == "warm" {
                assert!(
                    stdout.contains("(0 weights packed"),
                    "{name} warm: {stdout}"
                );
            }
            for (k, call) in calls.iter().enumerate() {
                let (eager, et) = call_differences(&dir, &out_dir, k, call);
                assert!(
                    eager < 1e-5,
                    "{name} {launch} call {k}: {eager:e} of eager's range"
                );
                assert!(
                    et < 1e-5,
                    "{name} {launch} call {k}: {et:e} of ExecuTorch's range"
                );
            }
        }
    }
    for name in ["shared_prefill_decode", "shared_matmul_operand"] {
        let (dir, description) = export_calls(name);
        let mut args = Vec::new();
        for call in description["calls"].as_array().unwrap() {
            args.extend(["--call".into(), common::io_steps::call_arg(&dir, call)]);
        }
        let (ok, stdout, stderr) = run_export(name, &args);
        assert!(!ok, "{name}: {stdout}");
        // The operator is named as the plan lists it (`aten::arange.start_out`,
        // `dim_order_ops::_to_dim_order_copy.out`).
        let operator = stderr
            .split_once("is not fully delegated to XNNPACK: it runs the operator ")
            .and_then(|(_, rest)| rest.split_once(';'))
            .map(|(operator, _)| operator);
        assert!(
            operator.is_some_and(|o| o.contains("::") && !o.contains(' ')),
            "{name}: {stderr}"
        );
        assert!(
            stderr.contains("xnnblob-et-run PROGRAM --call")
                && stderr.contains("share_memory_arenas=true"),
            "{name}: {stderr}"
        );
    }
}

/// Issue 43: `--times N` repeats the `--call` before it, and `{step}` in its input paths becomes
/// the iteration (0 to N-1): `prefill` once, then `step` three times, each on its own input
/// (NAME.calls.json's, copied to y0.bin, y1.bin, y2.bin), gives eager PyTorch's and ExecuTorch's
/// outputs call by call, numbered step0 to step3.
#[test]
fn times_repeats_a_call_reading_each_iterations_inputs_through_step() {
    let tmp = scratch("run-times");
    for name in ["shared_prefill_step", "shared_encoder_decoder"] {
        let (dir, description) = export_calls(name);
        let calls = description["calls"].as_array().unwrap();
        let repeated = common::io_steps::repeated_call(&dir, &description, &tmp.join(name));
        let method = repeated.method.as_str();
        let out_dir = tmp.join(format!("{name}-out"));
        let args = [
            "--call".to_string(),
            common::io_steps::call_arg(&dir, repeated.first),
            "--call".into(),
            repeated.call_arg.clone(),
            "--times".into(),
            repeated.times.to_string(),
            "--output-dir".into(),
            out_dir.display().to_string(),
        ];
        let (ok, stdout, stderr) = run_export(name, &args);
        assert!(ok, "{name}: {stdout}{stderr}");
        assert!(
            stdout.contains(&format!("; {} calls", calls.len())),
            "{stdout}"
        );
        for i in 0..repeated.times {
            let line = format!("call {}: method {method:?} iteration {i}:", i + 1);
            assert!(stdout.contains(&line), "{name}: {line} in {stdout}");
        }
        for (k, call) in calls.iter().enumerate() {
            let (eager, et) = call_differences(&dir, &out_dir, k, call);
            assert!(eager < 1e-5, "{name} call {k}: {eager:e} of eager's range");
            assert!(et < 1e-5, "{name} call {k}: {et:e} of ExecuTorch's range");
        }
        assert!(
            !out_dir
                .join(format!("step{}.output0.f32", calls.len()))
                .exists()
        );
    }
}

/// Issue 43: `xnnblob run` warns, on stderr, of a shared buffer that ExecuTorch's partitioner
/// froze into the delegate of a method it calls (`frozen_matmul_operand`'s `step`), naming the
/// method, the buffer and the recipe. Called alone, `step` runs and computes what ExecuTorch's
/// runtime computed from it after `prefill` (zeros), not eager's outputs. Its `prefill` needs a
/// portable operator: called with it, the warning still comes first, then the refusal; `prefill`
/// alone, whose delegate holds nothing frozen, gets the refusal only.
#[test]
fn run_warns_of_a_shared_buffer_frozen_into_a_called_method() {
    let tmp = scratch("run-frozen");
    let name = "frozen_matmul_operand";
    let (dir, description) = export_calls(name);
    let calls = description["calls"].as_array().unwrap();
    let warned = |stderr: &str| {
        let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
        assert_eq!(warnings.len(), 1, "{stderr}");
        assert!(
            warnings[0]
                .starts_with("xnnblob: warning: method \"step\", XNNPACK delegate 0: constant ")
                && warnings[0].contains("1024 bytes of zeros")
                && warnings[0].contains("shared mutable buffer value 0 of prefill")
                && warnings[0].contains("Methods that share state"),
            "{stderr}"
        );
    };
    let steps: Vec<&serde_json::Value> = calls.iter().filter(|c| c["method"] == "step").collect();
    assert_eq!(steps.len(), 2);
    let mut args = Vec::new();
    for call in &steps {
        args.extend(["--call".into(), common::io_steps::call_arg(&dir, call)]);
    }
    args.extend(["--output-dir".into(), tmp.display().to_string()]);
    let (ok, stdout, stderr) = run_export(name, &args);
    assert!(ok, "{stdout}{stderr}");
    warned(&stderr);
    for (k, call) in steps.iter().enumerate() {
        let (eager, et) = call_differences(&dir, &tmp, k, call);
        assert!(et < 1e-5, "step {k}: {et:e} of ExecuTorch's range");
        assert!(
            eager > 0.1,
            "step {k} is eager's only if nothing was frozen"
        );
    }
    let arg =
        |call: &serde_json::Value| ["--call".to_string(), common::io_steps::call_arg(&dir, call)];
    let all: Vec<String> = calls.iter().flat_map(arg).collect();
    let (ok, _, stderr) = run_export(name, &all);
    assert!(!ok, "{stderr}");
    warned(&stderr);
    let refusal = stderr.find("not fully delegated").expect("refused");
    assert!(stderr.find("warning").unwrap() < refusal, "{stderr}");
    let (ok, _, stderr) = run_export(name, &arg(&calls[0]));
    assert!(
        !ok && stderr.contains("not fully delegated") && !stderr.contains("warning"),
        "{stderr}"
    );
}
