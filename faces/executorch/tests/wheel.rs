//! The wheels (issue 41, docs/wheel.md): built by `scripts/build-wheels.sh`, installed with pip
//! beside ExecuTorch's own wheel in a fresh venv, and used as a user would, from a PATH that has
//! no Rust toolchain: the CMake app configured from what the packages say, run cold then warm
//! with the drop-in; the command line; the drop-in refusing another ExecuTorch. The aarch64 wheel
//! is installed by pip for the aarch64 platform into a directory (no aarch64 Python runs here) and
//! its programs and the cross-built app run under `qemu-aarch64`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use xnnblob_test_support::close::relative_difference;
use xnnblob_test_support::drop_in::f32s;
use xnnblob_test_support::{bounded, cross, scratch};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

const PROGRAM: &str = "mlp_qd8_qc8w_external";

/// The version in the workspace's Cargo.toml (`[workspace.package]`), the one place it is
/// written.
fn workspace_version() -> String {
    let text = std::fs::read_to_string(repository().join("Cargo.toml")).unwrap();
    let package = text
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]");
    package
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace's version")
        .to_string()
}

/// This PATH without any directory that holds `cargo` or `rustc`: what a user of the wheel has.
fn path_without_rust() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|dir| !dir.join("cargo").exists() && !dir.join("rustc").exists())
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// A command as the wheel's user runs it: the PATH without Rust, none of cargo's variables.
fn user(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command.env_clear();
    for (name, value) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if !name_text.starts_with("CARGO")
            && !name_text.starts_with("RUST")
            && name_text != "LD_LIBRARY_PATH"
        {
            command.env(&name, value);
        }
    }
    command.env("PATH", path_without_rust());
    command
}

/// Runs `command` to its end within `limit` and asserts it succeeded.
fn ok(command: &mut Command, limit: u64, what: &str) -> Output {
    let out = bounded::output(command, Duration::from_secs(limit), what);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Builds the wheel for `target` with docs/wheel.md's command into `out`; returns its path.
fn build_wheel(target: &str, out: &Path) -> PathBuf {
    let started = Instant::now();
    ok(
        Command::new(repository().join("scripts/build-wheels.sh"))
            .arg(out)
            .args(["--target", target]),
        // A fresh clone builds everything in release mode for the target first.
        1800,
        "scripts/build-wheels.sh",
    );
    let arch = target.split('-').next().unwrap();
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(&format!("_{arch}.whl")))
        .collect();
    assert_eq!(wheels.len(), 1, "{wheels:?}");
    let wheel = wheels.into_iter().next().unwrap();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!("xnnblob-{}-py3-none-manylinux_2_", workspace_version());
    assert!(name.starts_with(&prefix), "{name}");
    eprintln!(
        "wheel: {name}, {:.1} MiB, built in {:.0} s",
        std::fs::metadata(&wheel).unwrap().len() as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    wheel
}

/// pip's arguments that install ExecuTorch's wheel as executorch-sys pins it (by hash), without
/// its Python dependencies (torch): only the C++ runtime is used.
fn executorch_requirements() -> Vec<String> {
    vec![
        "--no-deps".into(),
        "--require-hashes".into(),
        "-r".into(),
        repository()
            .join("sys/executorch-sys/requirements.txt")
            .display()
            .to_string(),
    ]
}

/// The platform tag of a wheel's file name (`manylinux_2_36_x86_64`).
fn platform_of(wheel: &Path) -> String {
    let name = wheel.file_stem().unwrap().to_string_lossy().into_owned();
    name.rsplit('-').next().unwrap().to_string()
}

/// Runs `python` (with the wheel importable) on `code`, returning what it printed.
fn python(python: &Command, code: &str) -> String {
    let mut command = user(python.get_program());
    command.args(python.get_args()).arg("-c").arg(code);
    for (name, value) in python.get_envs() {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    text(&ok(&mut command, 60, code))
}

/// Configures and builds the example against both packages, with nothing but what the packages
/// say (`more`: cross-compiling settings); returns the app.
fn build_app(prefix_path: &str, dir: &Path, more: &[String]) -> PathBuf {
    ok(
        user("cmake")
            .args(["-G", "Ninja", "-S"])
            .arg(repository().join("examples/executorch_app"))
            .arg("-B")
            .arg(dir)
            .arg(format!("-DCMAKE_PREFIX_PATH={prefix_path}"))
            .args(more),
        300,
        "configuring the example against the wheels",
    );
    ok(
        user("cmake").arg("--build").arg(dir),
        600,
        "building the example",
    );
    dir.join("executorch_app")
}

/// Runs the app cold then warm (`launch` makes the command) and checks the outputs against
/// ExecuTorch's stored output, and that xnnblob's backend made the cache file.
fn cold_and_warm(scratch: &Path, launch: impl Fn() -> Command) {
    let data = repository().join("tests/data/executorch");
    let expected = std::fs::read(data.join(format!("{PROGRAM}.output_et.f32"))).unwrap();
    let cache = scratch.join("app.cache");
    let mut outputs = Vec::new();
    for run in ["cold", "warm"] {
        let output = scratch.join(format!("{run}.f32"));
        ok(
            launch()
                .arg(data.join(format!("{PROGRAM}.pte")))
                .arg(data.join(format!("{PROGRAM}.ptd")))
                .arg(data.join("mlp_qd8.input.f32"))
                .arg(&output)
                .arg(&cache),
            300,
            &format!("the app, {run}"),
        );
        outputs.push(std::fs::read(&output).unwrap());
    }
    assert_eq!(outputs[0], outputs[1], "warm output differs from cold");
    let d = relative_difference(&f32s(&outputs[1]), &f32s(&expected));
    assert!(d <= 1e-3, "{d} of the range from ExecuTorch's output");
    let magic = std::fs::read(&cache).unwrap();
    assert!(magic.starts_with(b"XBPWC"), "not xnnblob's cache file");
}

/// `readelf -d`'s RUNPATH of `file`.
fn runpath(file: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("(RUNPATH)"))
        .unwrap_or_default()
        .to_string()
}

/// What a user of the installed wheel sees, whichever CPU runs it: the module's answers, the
/// files it names, the RUNPATHs. `package` is the installed `xnnblob/` directory.
fn check_installed(py: &Command, package: &Path) {
    let said = python(
        py,
        "import xnnblob; print(xnnblob.version, xnnblob.executorch_version, \
         xnnblob.xnnpack_version, sep='|')",
    );
    let said: Vec<&str> = said.split('|').collect();
    assert_eq!(said[0], workspace_version());
    assert_eq!(said[1], executorch_sys::VERSION);
    assert!(said[2].contains("4ea82e5"), "XNNPACK {}", said[2]);
    let cmake_dir = PathBuf::from(python(py, "import xnnblob; print(xnnblob.cmake_dir())"));
    assert!(cmake_dir.starts_with(package), "{}", cmake_dir.display());
    let config = std::fs::read_to_string(cmake_dir.join("xnnblob-versions.cmake")).unwrap();
    assert!(
        config.contains(&format!(
            "xnnblob_EXECUTORCH_VERSION \"{}\"",
            executorch_sys::VERSION
        )),
        "{config}"
    );
    for file in [
        "lib/libxnnblob_executorch.so",
        "lib/libxnnblob.so",
        "lib/libxnnblob.a",
        "bin/xnnblob",
        "bin/xnnblob-et-run",
        "include/xnnblob.h",
        "include/xnnblob/delegate.h",
        "lib/pkgconfig/xnnblob.pc",
    ] {
        assert!(package.join(file).is_file(), "the wheel has no {file}");
    }
    for file in ["lib/libxnnblob_executorch.so", "bin/xnnblob-et-run"] {
        let line = runpath(&package.join(file));
        assert!(
            line.contains("[$ORIGIN/../../executorch/lib]"),
            "{file}: {line}"
        );
    }
    // No package file names this machine's build paths.
    let repo = repository().display().to_string();
    for entry in walk(package) {
        if entry
            .extension()
            .is_some_and(|e| e == "cmake" || e == "pc" || e == "py")
        {
            let body = std::fs::read_to_string(&entry).unwrap();
            assert!(!body.contains(&repo), "{} names {repo}", entry.display());
        }
    }
}

/// Where `ldd` (its output `ldd`) found the library named `name`, as a real path (the loader's
/// runs through $ORIGIN/..).
fn resolved(ldd: &str, name: &str) -> PathBuf {
    let line = ldd
        .lines()
        .find(|l| l.contains(name))
        .unwrap_or_else(|| panic!("ldd names no {name}:\n{ldd}"));
    // "name => path (address)", or "path (address)" for a library linked by its path.
    let path = line
        .split("=>")
        .last()
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    Path::new(path).canonicalize().unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The x86-64 wheel in a fresh venv beside ExecuTorch's wheel, on a PATH without Rust: the
/// module, the CMake app (configured only from what the packages say) cold then warm, the
/// command line (`--version`, `inspect`, `bench --peer` on the smallest model), pkg-config, and
/// the drop-in refusing an ExecuTorch whose package says another version.
#[test]
fn the_wheel_installs_beside_executorchs_and_serves_the_app_and_the_cli_without_rust() {
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the wheel's x86-64 test runs on an x86-64 host");
        return;
    }
    let scratch = scratch("wheel");
    let scratch: &Path = &scratch;
    let wheel = build_wheel("x86_64-unknown-linux-gnu", &scratch.join("dist"));

    // The user's side: no cargo, no rustc.
    for tool in ["cargo", "rustc"] {
        let found = user("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        assert!(!found.status.success(), "{tool} is on the user's PATH");
    }
    let venv = scratch.join("venv");
    ok(
        user("python3").args(["-m", "venv"]).arg(&venv),
        120,
        "python3 -m venv",
    );
    let pip = |args: &[String], what: &str| {
        let mut command = user(venv.join("bin/python"));
        command.args(["-m", "pip", "install", "--quiet", "--no-input"]);
        command.args(args);
        bounded::output(&mut command, Duration::from_secs(600), what)
    };
    let et = pip(&executorch_requirements(), "pip install executorch");
    if !et.status.success() {
        xnnblob_test_support::cannot_run(&format!(
            "pip cannot install executorch=={} here: {}",
            executorch_sys::VERSION,
            String::from_utf8_lossy(&et.stderr)
        ));
        return;
    }
    let started = Instant::now();
    let installed = pip(
        &["--no-deps".to_string(), wheel.display().to_string()],
        "pip install of the wheel",
    );
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    eprintln!(
        "wheel: pip install took {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let py = Command::new(venv.join("bin/python"));
    let package = PathBuf::from(python(&py, "import xnnblob; print(xnnblob.root())"));
    assert!(package.starts_with(&venv), "{}", package.display());
    check_installed(&py, &package);
    let site = package.parent().unwrap();
    // The drop-in finds ExecuTorch's runtime in the venv's executorch package.
    let ldd = text(&ok(
        user("ldd").arg(package.join("lib/libxnnblob_executorch.so")),
        30,
        "ldd",
    ));
    assert_eq!(
        resolved(&ldd, "libexecutorch.so"),
        site.join("executorch/lib/libexecutorch.so")
            .canonicalize()
            .unwrap(),
        "{ldd}"
    );

    // The CMake app, from what the packages say.
    let prefix_path = python(&py, "import xnnblob; print(xnnblob.cmake_prefix_path())");
    for dir in prefix_path.split(';') {
        assert!(Path::new(dir).starts_with(&venv), "{prefix_path}");
    }
    let app = build_app(&prefix_path, &scratch.join("app"), &[]);
    let needed = text(&ok(user("ldd").arg(&app), 30, "ldd app"));
    assert_eq!(
        resolved(&needed, "libxnnblob_executorch.so"),
        package
            .join("lib/libxnnblob_executorch.so")
            .canonicalize()
            .unwrap(),
        "{needed}"
    );
    assert!(
        !needed.contains("libexecutorch_backend_xnnpack"),
        "{needed}"
    );
    cold_and_warm(scratch, || user(&app));

    // The command line, on PATH as the venv's console script.
    let bin = venv.join("bin");
    let version = text(&ok(
        user(bin.join("xnnblob")).arg("--version"),
        30,
        "xnnblob --version",
    ));
    assert_eq!(version, format!("xnnblob {}", workspace_version()));
    let data = repository().join("tests/data/executorch");
    let inspect = text(&ok(
        user(bin.join("xnnblob"))
            .arg("inspect")
            .arg(data.join(format!("{PROGRAM}.pte"))),
        60,
        "xnnblob inspect",
    ));
    assert!(
        inspect.contains("xnnpack delegates") && inspect.contains("XNNFullyConnected"),
        "{inspect}"
    );
    // The wheel's runner with each backend, a load and an execute: ExecuTorch's own, from the
    // executorch wheel in this venv, and xnnblob's drop-in beside the runner.
    let started = Instant::now();
    for backend in ["executorch", "xnnblob"] {
        let mut runner = user(bin.join("xnnblob-et-run"));
        runner
            .arg(data.join(format!("{PROGRAM}.pte")))
            .arg("--data")
            .arg(data.join(format!("{PROGRAM}.ptd")))
            .args(["--load-mode", "mmap", "--steps", "1", "--input"])
            .arg(data.join("mlp_qd8.input.f32"))
            .args(["--backend", backend, "--cache"])
            .arg(scratch.join(format!("et-run-{backend}.cache")));
        let what = format!("xnnblob-et-run --backend {backend}");
        let out = text(&ok(&mut runner, 120, &what));
        assert!(
            out.contains("load_to_ready_ms=") && out.contains("output program=0 step=0"),
            "{what}: {out}"
        );
        if backend == "executorch" {
            // As the loader found it (through RUNPATHs with `..` in them): compared canonical.
            let library = out
                .lines()
                .find_map(|l| l.strip_prefix("backend="))
                .and_then(|p| std::fs::canonicalize(p).ok());
            let venv = std::fs::canonicalize(site.join("executorch")).unwrap();
            assert!(
                library.as_ref().is_some_and(|l| l.starts_with(&venv)),
                "{what} loaded another backend ({library:?}, not under {}): {out}",
                venv.display()
            );
        }
    }
    eprintln!(
        "wheel: the runner with both backends took {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // pkg-config's modules point inside the installed wheel.
    let pkgconfig = python(&py, "import xnnblob; print(xnnblob.pkgconfig_dir())");
    let flags = user("pkg-config")
        .args(["--cflags", "--libs", "xnnblob-shared"])
        .env("PKG_CONFIG_PATH", &pkgconfig)
        .output();
    match flags {
        Ok(flags) if flags.status.success() => {
            let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
            let include = format!("-I{}/lib/pkgconfig/../../include", package.display());
            assert!(flags.contains(&include), "{flags}");
        }
        _ => xnnblob_test_support::cannot_run("pkg-config is not installed: its files unchecked"),
    }

    refuses_another_executorch(site, scratch, || user(&app));
}

/// Another ExecuTorch: with the `executorch` package in `site` saying 1.5.0, the app `launch`
/// starts fails to load its program, and the drop-in's refusal names both versions. The package
/// is put back as it was.
fn refuses_another_executorch(site: &Path, scratch: &Path, launch: impl Fn() -> Command) {
    let data = repository().join("tests/data/executorch");
    let version_py = site.join("executorch/version.py");
    let original = std::fs::read_to_string(&version_py).unwrap();
    std::fs::write(&version_py, "__version__ = \"1.5.0+cpu\"\n").unwrap();
    let refused = bounded::output(
        launch()
            .arg(data.join(format!("{PROGRAM}.pte")))
            .arg(data.join(format!("{PROGRAM}.ptd")))
            .arg(data.join("mlp_qd8.input.f32"))
            .arg(scratch.join("refused.f32"))
            .arg(scratch.join("refused.cache")),
        Duration::from_secs(300),
        "the app with ExecuTorch 1.5.0",
    );
    std::fs::write(&version_py, original).unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the app ran: {stderr}");
    assert!(
        stderr.contains(&format!(
            "refusing ExecuTorch 1.5.0+cpu (this xnnblob drop-in is built against ExecuTorch {}",
            executorch_sys::VERSION
        )),
        "{stderr}"
    );
    assert!(
        !scratch.join("refused.f32").exists(),
        "the refused app wrote an output"
    );
}

/// The aarch64 wheel: pip installs it and ExecuTorch's aarch64 wheel for the aarch64 platform
/// into a directory (as it would into an aarch64 site-packages; no aarch64 Python runs here, so
/// the module is read by this host's Python from that directory); the app cross-built against
/// both packages from what the module says, and the programs, run under `qemu-aarch64`.
#[test]
fn the_aarch64_wheel_installs_for_aarch64_and_its_programs_run_under_qemu() {
    if !cfg!(target_arch = "x86_64") {
        xnnblob_test_support::cannot_run("the aarch64 wheel is cross-built from an x86-64 host");
        return;
    }
    let scratch = scratch("wheel-aarch64");
    let scratch: &Path = &scratch;
    let wheel = build_wheel(cross::TARGET, &scratch.join("dist"));
    let platform = platform_of(&wheel);
    assert!(platform.ends_with("_aarch64"), "{platform}");

    let venv = scratch.join("venv");
    ok(
        user("python3").args(["-m", "venv"]).arg(&venv),
        120,
        "python3 -m venv",
    );
    let site = scratch.join("site");
    // pip's own rules for a foreign platform's wheels: a tag must be one of the platforms given,
    // binaries only.
    let pip = |args: &[String], what: &str| {
        let mut command = user(venv.join("bin/python"));
        command
            .args(["-m", "pip", "install", "--quiet", "--no-input", "--target"])
            .arg(&site)
            // pip takes a manylinux_2_N platform as that exact tag, so ExecuTorch's own
            // (executorch-sys's pin) is named too.
            .args([
                "--platform",
                &platform,
                "--platform",
                "manylinux_2_28_aarch64",
            ])
            .arg("--only-binary=:all:")
            .args(args);
        bounded::output(&mut command, Duration::from_secs(600), what)
    };
    let et = pip(
        &executorch_requirements(),
        "pip install executorch (aarch64)",
    );
    if !et.status.success() {
        xnnblob_test_support::cannot_run(&format!(
            "pip cannot install executorch=={} for aarch64 here: {}",
            executorch_sys::VERSION,
            String::from_utf8_lossy(&et.stderr)
        ));
        return;
    }
    let installed = pip(
        &["--no-deps".to_string(), wheel.display().to_string()],
        "pip install of the aarch64 wheel",
    );
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let mut py = Command::new(venv.join("bin/python"));
    py.env("PYTHONPATH", &site);
    let package = site.join("xnnblob");
    assert_eq!(
        PathBuf::from(python(&py, "import xnnblob; print(xnnblob.root())")),
        package
    );
    assert_eq!(
        python(&py, "import xnnblob; print(xnnblob.target)"),
        cross::TARGET
    );
    check_installed(&py, &package);
    let header = text(&ok(
        user("readelf").arg("-h").arg(package.join("bin/xnnblob")),
        30,
        "readelf",
    ));
    assert!(header.contains("AArch64"), "{header}");

    let qemu = |exe: &Path| {
        let words = cross::qemu("neoverse-n1");
        let mut command = user(&words[0]);
        command.args(&words[1..]).arg(exe);
        command
    };
    let version = text(&ok(
        qemu(&package.join("bin/xnnblob")).arg("--version"),
        60,
        "xnnblob --version under qemu",
    ));
    assert_eq!(version, format!("xnnblob {}", workspace_version()));
    let data = repository().join("tests/data/executorch");
    let inspect = text(&ok(
        qemu(&package.join("bin/xnnblob"))
            .arg("inspect")
            .arg(data.join(format!("{PROGRAM}.pte"))),
        120,
        "xnnblob inspect under qemu",
    ));
    assert!(
        inspect.contains("xnnpack delegates") && inspect.contains("XNNFullyConnected"),
        "{inspect}"
    );
    // The runner with both backends: ExecuTorch's is found beside the libexecutorch.so the
    // loader chose (the aarch64 package's), xnnblob's in the wheel's lib/.
    for backend in ["executorch", "xnnblob"] {
        let out = text(&ok(
            qemu(&package.join("bin/xnnblob-et-run"))
                .arg(data.join(format!("{PROGRAM}.pte")))
                .arg("--data")
                .arg(data.join(format!("{PROGRAM}.ptd")))
                .arg("--input")
                .arg(data.join("mlp_qd8.input.f32"))
                .args(["--backend", backend]),
            300,
            &format!("xnnblob-et-run --backend {backend} under qemu"),
        ));
        assert!(out.contains("load_to_ready_ms="), "{backend}: {out}");
        let library = match backend {
            "executorch" => site.join("executorch/lib/libexecutorch_backend_xnnpack.so"),
            _ => package.join("bin/../lib/libxnnblob_executorch.so"),
        };
        // As the loader found it (through $ORIGIN/..), so compared as real paths.
        let loaded = out
            .lines()
            .find_map(|l| l.strip_prefix("backend="))
            .unwrap_or_else(|| panic!("{backend}: no backend= in {out}"));
        assert_eq!(
            Path::new(loaded).canonicalize().unwrap(),
            library.canonicalize().unwrap(),
            "{backend}"
        );
    }

    let prefix_path = python(&py, "import xnnblob; print(xnnblob.cmake_prefix_path())");
    let cross_compiling = [
        "-DCMAKE_SYSTEM_NAME=Linux".to_string(),
        "-DCMAKE_SYSTEM_PROCESSOR=aarch64".to_string(),
        "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++".to_string(),
        format!(
            "-DCMAKE_FIND_ROOT_PATH={};{}",
            site.display(),
            cross::SYSROOT
        ),
    ];
    let app = build_app(&prefix_path, &scratch.join("app"), &cross_compiling);
    let header = text(&ok(user("readelf").arg("-hd").arg(&app), 30, "readelf"));
    assert!(header.contains("AArch64"), "{header}");
    assert!(header.contains("libxnnblob_executorch.so"), "{header}");
    cold_and_warm(scratch, || qemu(&app));
    refuses_another_executorch(&site, scratch, || qemu(&app));
}
