//! Debian's packages the build takes XNNPACK and its dependencies from: which ones, pinned by
//! sha256, and how they are fetched (the system's apt, pointed at trixie and sid through a
//! private configuration) and unpacked.

use super::{fail, hex, run_logged, tail};
use sha2::{Digest, Sha256};
use std::env;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One Debian source package that XNNPACK's build needs.
pub(crate) struct DebianSource {
    pub(crate) package: &'static str,
    pub(crate) version: &'static str,
    pub(crate) tarball: &'static str,
    pub(crate) sha256: &'static str,
}

/// The last, GoogleTest, is not built here: it is fetched and pinned with the others for
/// `tests/xnnpack_own_tests.rs`, which builds XNNPACK's own tests of xnnblob's kernels from the
/// same patched sources (patch 0030).
pub(crate) const SOURCES: [DebianSource; 7] = [
    DebianSource {
        package: "xnnpack",
        version: "0.0~git20241108.4ea82e5-2",
        tarball: "xnnpack_0.0~git20241108.4ea82e5.orig.tar.xz",
        sha256: "90bde2caef0f880f627bab0dc805a86c4b8070cd98e3243db3046ab3f3be1a99",
    },
    DebianSource {
        package: "cpuinfo",
        version: "0.0~git20250905.877328f-1",
        tarball: "cpuinfo_0.0~git20250905.877328f.orig.tar.xz",
        sha256: "557ca404a3836b9f335a3a06b65ff9fe9dbaaefab7fb5c0185f53d9f33615a10",
    },
    DebianSource {
        package: "pthreadpool",
        version: "0.0~git20240616.560c60d-1",
        tarball: "pthreadpool_0.0~git20240616.560c60d.orig.tar.xz",
        sha256: "4cc3cbd933b28131d2a34edc54f76af9fb41bc490af5eae1a5bd3cd07ea90708",
    },
    DebianSource {
        package: "fxdiv",
        version: "0.0~git20200417.b408327-4",
        tarball: "fxdiv_0.0~git20200417.b408327.orig.tar.xz",
        sha256: "7953482badaf4cb34026c3487c257b8e4ab2df061c019bd6fabbbc12ad52c44b",
    },
    DebianSource {
        package: "fp16",
        version: "0.0~git20200514.4dfe081-5",
        tarball: "fp16_0.0~git20200514.4dfe081.orig.tar.xz",
        sha256: "7d7782b37b74136e0e12593a2a93ccbe7db831f4374cc408e44623d9b708b54e",
    },
    DebianSource {
        package: "psimd",
        version: "0.0~git20200517.072586a-2",
        tarball: "psimd_0.0~git20200517.072586a.orig.tar.xz",
        sha256: "32bbce81289866e3419e36cab6541bbddb6d45d3db10a7dcd2598dc9d0c8c6f4",
    },
    DebianSource {
        package: "googletest",
        version: "1.16.0-1",
        tarball: "googletest_1.16.0.orig.tar.gz",
        sha256: "2f54382b5d13d6cd0be2afc524f1e510d37f8ba78c2d439c5bea64ef37e30d01",
    },
];

/// One Debian binary package that an aarch64 build of XNNPACK needs.
pub(crate) struct DebianBinary {
    pub(crate) package: &'static str,
    pub(crate) version: &'static str,
    pub(crate) architecture: &'static str,
    pub(crate) file: &'static str,
    pub(crate) sha256: &'static str,
    /// The static library in the package, and the directory its headers are included from.
    pub(crate) library: &'static str,
    pub(crate) include_dir: &'static str,
}

/// KleidiAI, Arm's GEMM microkernels: XNNPACK's aarch64 build runs its qp8 GEMMs on them (a
/// prompt's 4-bit blockwise GEMMs on i8mm: `qp8_f32_qb4w_gemm_minmax_ukernel_16x4c16s2__neoni8mm`),
/// as ExecuTorch's own XNNPACK does. Debian's archive here serves KleidiAI's arm64 development
/// package (Debian's build of its sources: the static library and headers), not the source
/// tarball, so that package is what is pinned. Version 1.8.0 is trixie's, the release Debian builds
/// this XNNPACK snapshot with.
pub(crate) const KLEIDIAI: DebianBinary = DebianBinary {
    package: "libkleidiai-dev",
    version: "1.8.0+ds-1",
    architecture: "arm64",
    file: "libkleidiai-dev_1.8.0+ds-1_arm64.deb",
    sha256: "e1a2dcc8cf08fa3fbf6b0a6886d4f667fac740fe59a2ef601b72c2de879d68bc",
    library: "usr/lib/aarch64-linux-gnu/libkleidiai.a",
    include_dir: "usr/include/aarch64-linux-gnu",
};

fn sha256_of(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn has_verified(dir: &Path, s: &DebianSource) -> bool {
    sha256_of(&dir.join(s.tarball)).is_ok_and(|sum| sum == s.sha256)
}

/// Makes sure every tarball is in `downloads`, verified.
pub(crate) fn fetch_sources(root: &Path, downloads: &Path) {
    fs::create_dir_all(downloads)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", downloads.display())));
    if let Some(offline) = env::var_os("XNNBLOB_XNNPACK_SOURCES").map(PathBuf::from) {
        for s in SOURCES.iter().filter(|s| !has_verified(downloads, s)) {
            let from = offline.join(s.tarball);
            if let Err(e) = fs::copy(&from, downloads.join(s.tarball)) {
                fail(&format!("cannot copy {}: {e}", from.display()));
            }
        }
    }
    let missing: Vec<&DebianSource> = SOURCES
        .iter()
        .filter(|s| !has_verified(downloads, s))
        .collect();
    if !missing.is_empty() {
        apt_download(root, downloads, &missing);
    }
    for s in &SOURCES {
        let path = downloads.join(s.tarball);
        match sha256_of(&path) {
            Ok(sum) if sum == s.sha256 => {}
            Ok(sum) => {
                let _ = fs::remove_file(&path);
                fail(&format!(
                    "{} has sha256 {sum}, expected {}; removed it",
                    s.tarball, s.sha256
                ))
            }
            Err(_) => fail(&format!(
                "source package {}={} could not be downloaded (its tarball {} is missing)",
                s.package, s.version, s.tarball
            )),
        }
    }
}

/// Downloads source tarballs with the system's apt, pointed at trixie and sid through a private
/// configuration so the system's own lists and sources are untouched.
fn apt_download(root: &Path, downloads: &Path, missing: &[&DebianSource]) {
    let apt = PrivateApt::updated(root, "apt", "deb-src", &[]);
    // The mirror may answer 404 for a package's .dsc while its .orig tarball arrives: apt then
    // exits non-zero, so the exit code is ignored and the tarballs' sha256 decide.
    apt.run(
        downloads,
        ["source", "--download-only"]
            .into_iter()
            .map(String::from)
            .chain(
                missing
                    .iter()
                    .map(|s| format!("{}={}", s.package, s.version)),
            ),
    );
    for s in missing {
        if !has_verified(downloads, s) {
            fail(&format!(
                "apt did not deliver {} ({}={}) with sha256 {} (log: {})\n{}",
                s.tarball,
                s.package,
                s.version,
                s.sha256,
                apt.log.display(),
                tail(&apt.log, 15)
            ));
        }
    }
    // Only the orig tarballs (and KleidiAI's package) are used.
    if let Ok(entries) = fs::read_dir(downloads) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !SOURCES.iter().any(|s| s.tarball == name) && name != KLEIDIAI.file {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// apt with lists, cache and sources of its own under the per-user cache (trixie and sid), so
/// that the system's own lists and sources are untouched.
struct PrivateApt {
    opts: Vec<String>,
    log: PathBuf,
}

impl PrivateApt {
    /// Writes the sources (`kind` is `deb-src` or `deb [arch=..]`'s `deb`) into `root/name` and
    /// runs `apt-get update` on them.
    fn updated(root: &Path, name: &str, kind: &str, extra: &[String]) -> PrivateApt {
        if Command::new("apt-get")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            fail("apt-get is not available to download Debian's packages");
        }
        let mirror = debian_mirror().unwrap_or_else(|| {
            fail("no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources")
        });
        let apt = root.join(name);
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(apt.join(sub))
                .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", apt.display())));
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let list = apt.join("sources.list");
        let (kind, options) = match kind.split_once(' ') {
            Some((kind, options)) => (kind, format!("{options} ")),
            None => (kind, String::new()),
        };
        let text = ["trixie", "sid"]
            .iter()
            .map(|suite| format!("{kind} [{options}signed-by={keyring}] {mirror} {suite} main\n"))
            .collect::<String>();
        fs::write(&list, text)
            .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", list.display())));
        let mut opts = vec![
            format!("-oDir::Etc::SourceList={}", list.display()),
            "-oDir::Etc::SourceParts=/dev/null".to_string(),
            format!("-oDir::State::Lists={}", apt.join("lists").display()),
            format!("-oDir::Cache={}", apt.join("cache").display()),
            "-oAPT::Sandbox::User=root".to_string(),
            // Mirrors and caches may serve an index past its Valid-Until, or a clock may be off:
            // the index only locates the files, whose sha256 is checked here, so its age is no
            // risk. Set here, not left to the machine's apt.conf.d, which a new machine does not
            // share.
            "-oAcquire::Check-Valid-Until=false".to_string(),
            "-oAcquire::Check-Date=false".to_string(),
            "-q".to_string(),
        ];
        opts.extend(extra.iter().cloned());
        let apt = PrivateApt {
            opts,
            log: apt.join("apt.log"),
        };
        let out =
            File::create(&apt.log).unwrap_or_else(|e| fail(&format!("cannot write log: {e}")));
        let update = Command::new("apt-get")
            .args(&apt.opts)
            .arg("update")
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .status();
        if !update.is_ok_and(|s| s.success()) {
            fail(&format!(
                "`apt-get update` for Debian's trixie/sid lists failed (log: {})\n{}",
                apt.log.display(),
                tail(&apt.log, 15)
            ));
        }
        apt
    }

    /// Runs `apt-get ARGS` in `dir`, appending to the log; its exit code is left to the caller's
    /// checks of what it delivered.
    fn run(&self, dir: &Path, args: impl IntoIterator<Item = String>) {
        let out = fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| fail(&format!("cannot write log: {e}")));
        let _ = Command::new("apt-get")
            .args(&self.opts)
            .args(args)
            .current_dir(dir)
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .status();
    }
}

/// Makes sure KleidiAI's package is in `downloads`, verified; unpacks it under `src`; and writes
/// the CMake project that XNNPACK adds as its KleidiAI (`KLEIDIAI_SOURCE_DIR`): the package's
/// static library as the imported target `kleidiai`, with its headers. Returns that project.
pub(crate) fn kleidiai_project(root: &Path, downloads: &Path, src: &Path) -> PathBuf {
    let deb = downloads.join(KLEIDIAI.file);
    let verified = |p: &Path| sha256_of(p).is_ok_and(|sum| sum == KLEIDIAI.sha256);
    if !verified(&deb)
        && let Some(offline) = env::var_os("XNNBLOB_XNNPACK_SOURCES").map(PathBuf::from)
    {
        let _ = fs::copy(offline.join(KLEIDIAI.file), &deb);
    }
    if !verified(&deb) {
        let apt = PrivateApt::updated(
            root,
            "apt-arm64",
            "deb arch=arm64",
            &[
                "-oAPT::Architecture=arm64".to_string(),
                "-oAPT::Architectures::=arm64".to_string(),
            ],
        );
        apt.run(
            downloads,
            [
                "download".to_string(),
                format!(
                    "{}:{}={}",
                    KLEIDIAI.package, KLEIDIAI.architecture, KLEIDIAI.version
                ),
            ],
        );
        if !verified(&deb) {
            let _ = fs::remove_file(&deb);
            fail(&format!(
                "apt did not deliver {} ({}:{}={}) with sha256 {} (log: {})\n{}",
                KLEIDIAI.file,
                KLEIDIAI.package,
                KLEIDIAI.architecture,
                KLEIDIAI.version,
                KLEIDIAI.sha256,
                apt.log.display(),
                tail(&apt.log, 15)
            ));
        }
    }
    let unpacked = src.join("kleidiai-package");
    run_logged(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked),
        &src.join("kleidiai-package.log"),
        &format!("dpkg-deb -x {}", deb.display()),
    );
    let library = unpacked.join(KLEIDIAI.library);
    if !library.is_file() {
        fail(&format!("{} holds no {}", KLEIDIAI.file, KLEIDIAI.library));
    }
    let project = src.join("kleidiai");
    fs::create_dir_all(&project)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", project.display())));
    let text = format!(
        "# Written by xnnpack-sys's build script: Debian's KleidiAI {version}, prebuilt.\n\
         add_library(kleidiai STATIC IMPORTED GLOBAL)\n\
         set_target_properties(kleidiai PROPERTIES\n  IMPORTED_LOCATION \"{library}\"\n  \
         INTERFACE_INCLUDE_DIRECTORIES \"{include}\")\n",
        version = KLEIDIAI.version,
        library = library.display(),
        include = unpacked.join(KLEIDIAI.include_dir).display(),
    );
    let file = project.join("CMakeLists.txt");
    fs::write(&file, text)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", file.display())));
    project
}

/// The first Debian archive URI the system's apt uses (not the security archive).
fn debian_mirror() -> Option<String> {
    let mut uris = Vec::new();
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "sources"))
        {
            let text = fs::read_to_string(p).unwrap_or_default();
            for line in text.lines() {
                if let Some(rest) = line.trim().strip_prefix("URIs:") {
                    uris.extend(rest.split_whitespace().map(str::to_string));
                }
            }
        }
    }
    if let Ok(text) = fs::read_to_string("/etc/apt/sources.list") {
        for line in text.lines() {
            let mut words = line.split_whitespace().filter(|w| !w.starts_with('['));
            if words.next() == Some("deb") {
                uris.extend(words.next().map(str::to_string));
            }
        }
    }
    uris.into_iter()
        .find(|u| u.contains("debian") && !u.contains("security"))
}
/// Extracts a tarball into `dest`, dropping a single top-level directory if it has one.
pub(crate) fn extract(tarball: &Path, dest: &Path) {
    let tmp = dest.with_extension("extract");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).unwrap_or_else(|e| fail(&format!("cannot create dir: {e}")));
    run_logged(
        Command::new("tar")
            .arg("xf")
            .arg(tarball)
            .arg("-C")
            .arg(&tmp),
        &tmp.with_extension("log"),
        &format!("tar xf {}", tarball.display()),
    );
    let entries: Vec<PathBuf> = fs::read_dir(&tmp)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let top = match entries.as_slice() {
        [only] if only.is_dir() => only.clone(),
        _ => tmp.clone(),
    };
    let _ = fs::remove_dir_all(dest);
    fs::rename(&top, dest).unwrap_or_else(|e| fail(&format!("cannot move sources: {e}")));
    let _ = fs::remove_dir_all(&tmp);
}
