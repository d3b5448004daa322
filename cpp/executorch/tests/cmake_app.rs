//! The CMake consumer in `examples/executorch_app`: an ExecuTorch app built with CMake against the
//! wheel's package from one source, linked with xnnblob's backend (shared, then static) and with
//! ExecuTorch's own. Each build runs a program cold and warm in fresh processes.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Configures and builds the example for one backend; returns the executable.
fn build_app(backend: &str, library: &Path, dir: &Path) -> PathBuf {
    // Ninja: the setup installs it (for XNNPACK); make is not on a fresh machine.
    let configure = Command::new("cmake")
        .args(["-G", "Ninja"])
        .arg("-S")
        .arg(repository().join("examples/executorch_app"))
        .arg("-B")
        .arg(dir)
        .arg(format!(
            "-DCMAKE_PREFIX_PATH={}/share/cmake",
            executorch_sys::ROOT
        ))
        .arg(format!("-DXNNBLOB_BACKEND={backend}"))
        .arg(format!(
            "-DXNNBLOB_EXECUTORCH_LIBRARY={}",
            library.display()
        ))
        .output()
        .expect("cmake is installed by scripts/install-system-deps.sh");
    assert!(
        configure.status.success(),
        "configuring the example for {backend}: {}{}",
        String::from_utf8_lossy(&configure.stdout),
        String::from_utf8_lossy(&configure.stderr)
    );
    let build = Command::new("cmake")
        .arg("--build")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "building the example for {backend}: {}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    dir.join("executorch_app")
}

fn run_app(app: &Path, program: &str, output: &Path, cache: &Path) -> Vec<u8> {
    let data = repository().join("tests/data/executorch");
    let out = Command::new(app)
        .arg(data.join(format!("{program}.pte")))
        .arg(data.join(format!("{program}.ptd")))
        .arg(data.join("mlp_qd8.input.f32"))
        .arg(output)
        .arg(cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} on {program}: {}",
        app.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(output).unwrap()
}

#[test]
fn the_same_app_source_runs_with_either_backend_by_its_link_line() {
    let library = support::backend_library();
    let scratch = support::scratch("cmake-app");
    let program = "mlp_qd8_qc8w_external";
    let expected =
        std::fs::read(repository().join(format!("tests/data/executorch/{program}.output_et.f32")))
            .unwrap();

    let archive = library.with_extension("a");
    for (name, backend, library) in [
        ("xnnblob", "xnnblob", &library),
        ("xnnblob-static", "xnnblob", &archive),
        ("executorch", "executorch", &library),
    ] {
        let app = build_app(backend, library, &scratch.join(name));
        let linked = Command::new("ldd").arg(&app).output().unwrap();
        let linked = String::from_utf8_lossy(&linked.stdout);
        let ours = linked.contains("libxnnblob_executorch.so");
        let theirs = linked.contains("libexecutorch_backend_xnnpack.so");
        assert_eq!(
            (ours, theirs),
            (name == "xnnblob", name == "executorch"),
            "{name} build links:\n{linked}"
        );

        let cache = scratch.join(format!("{name}.cache"));
        let cold = run_app(
            &app,
            program,
            &scratch.join(format!("{name}.cold.f32")),
            &cache,
        );
        let size = std::fs::metadata(&cache).unwrap().len();
        let warm = run_app(
            &app,
            program,
            &scratch.join(format!("{name}.warm.f32")),
            &cache,
        );
        // A warm launch computes what the cold one did, bit for bit; both match ExecuTorch's
        // stored outputs within 1e-3 of their range (bit-identical on the machine that stored
        // them, but another CPU class may pick other quantized kernels).
        assert_eq!(warm, cold, "{name}: warm output differs from cold");
        let d = support::relative_difference(&support::f32s(&cold), &support::f32s(&expected));
        assert!(
            d <= 1e-3,
            "{name}: {d} of the range from ExecuTorch's stored output"
        );
        assert_eq!(
            std::fs::metadata(&cache).unwrap().len(),
            size,
            "{name} cache grew"
        );
        let magic = std::fs::read(&cache).unwrap()[..8].to_vec();
        // Whose cache file it is tells whose backend ran: xnnblob's starts with its magic.
        assert_eq!(
            magic.starts_with(b"XBPWC"),
            backend == "xnnblob",
            "{name} cache {magic:?}"
        );
    }
}
