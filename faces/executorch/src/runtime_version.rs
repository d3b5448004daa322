//! Which ExecuTorch the drop-in is running in, and whether it is the one it was built against.
//!
//! ExecuTorch's C++ runtime does not say its version. Its wheel does, beside the library: the
//! C++ side finds the `libexecutorch.so` this process loaded (`dladdr` on one of its functions)
//! and passes its path here. From `<package>/lib/libexecutorch.so` the version is read from
//! `<package>/version.py` (`__version__ = "1.5.1+cpu"`), else from the distribution's
//! `executorch-*.dist-info/METADATA` beside the package (`Version: 1.5.1`). The local part after
//! `+` (the wheel's `+cpu`) is not compared. A runtime that has neither file (one built from
//! source into a prefix, or linked statically into the app) has no version to compare: the
//! backend notes that and runs (docs/wheel.md).

use std::fmt;
use std::path::{Path, PathBuf};

/// The ExecuTorch release this library was built against.
pub const BUILT_AGAINST: &str = executorch_sys::VERSION;

/// A version found beside the runtime, and the file it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub version: String,
    pub file: PathBuf,
}

/// Why the drop-in will not run in the runtime it was loaded with.
#[derive(Debug)]
pub enum RuntimeError {
    /// The runtime's package says another version than [`BUILT_AGAINST`].
    Differs {
        library: PathBuf,
        found: Found,
        built_against: &'static str,
    },
    /// A version file is there but cannot be read, or says no version.
    Unreadable {
        file: PathBuf,
        cause: std::io::Error,
    },
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Differs {
                library,
                found,
                built_against,
            } => write!(
                // The versions first: ExecuTorch's log cuts a message at a few hundred bytes.
                f,
                "refusing ExecuTorch {} (this xnnblob drop-in is built against ExecuTorch \
                 {built_against}; their C++ ABIs may differ): {} says so, for {}; install \
                 executorch=={built_against}, or an xnnblob built against {}",
                found.version,
                found.file.display(),
                library.display(),
                found.version
            ),
            RuntimeError::Unreadable { file, cause } => write!(
                f,
                "cannot read ExecuTorch's version from {}: {cause}",
                file.display()
            ),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Differs { .. } => None,
            RuntimeError::Unreadable { cause, .. } => Some(cause),
        }
    }
}

/// The version of the ExecuTorch whose runtime library is `library`, from the files beside it;
/// `None` where there are none.
pub fn version_beside(library: &Path) -> Result<Option<Found>, RuntimeError> {
    let Some(package) = library.parent().and_then(Path::parent) else {
        return Ok(None);
    };
    let version_py = package.join("version.py");
    if version_py.is_file() {
        let text = read(&version_py)?;
        let version = text.lines().find_map(|line| {
            let rest = line.trim().strip_prefix("__version__")?.trim_start();
            let value = rest.strip_prefix('=')?.trim();
            let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            value[1..].split(quote).next().map(str::to_string)
        });
        return found(version, version_py);
    }
    let Some(site) = package.parent() else {
        return Ok(None);
    };
    let Ok(entries) = std::fs::read_dir(site) else {
        return Ok(None);
    };
    let package_name = package.file_name().and_then(|n| n.to_str()).unwrap_or("");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name
            .strip_suffix(".dist-info")
            .and_then(|stem| stem.split_once('-'))
            .is_some_and(|(dist, _)| dist.eq_ignore_ascii_case(package_name));
        if !ours {
            continue;
        }
        let metadata = entry.path().join("METADATA");
        let text = read(&metadata)?;
        let version = text
            .lines()
            .take_while(|line| !line.is_empty())
            .find_map(|line| line.strip_prefix("Version:"))
            .map(|v| v.trim().to_string());
        return found(version, metadata);
    }
    Ok(None)
}

fn read(file: &Path) -> Result<String, RuntimeError> {
    std::fs::read_to_string(file).map_err(|cause| RuntimeError::Unreadable {
        file: file.to_path_buf(),
        cause,
    })
}

fn found(version: Option<String>, file: PathBuf) -> Result<Option<Found>, RuntimeError> {
    match version.filter(|v| !v.is_empty()) {
        Some(version) => Ok(Some(Found { version, file })),
        None => Err(RuntimeError::Unreadable {
            file,
            cause: std::io::Error::new(std::io::ErrorKind::InvalidData, "no version in it"),
        }),
    }
}

/// `version` without its local part (`1.5.1+cpu` is `1.5.1`).
fn public(version: &str) -> &str {
    version.split('+').next().unwrap_or(version)
}

/// Checks the runtime library `library` against [`BUILT_AGAINST`]: the version found, `None`
/// where none can be found, or why the drop-in refuses it.
pub fn check(library: &Path) -> Result<Option<Found>, RuntimeError> {
    let found = version_beside(library)?.map(|found| Found {
        // The loader's path may run through ../ (an rpath of ExecuTorch's share/cmake/../../lib).
        file: std::fs::canonicalize(&found.file).unwrap_or(found.file),
        ..found
    });
    match found {
        Some(found) if public(&found.version) != BUILT_AGAINST => Err(RuntimeError::Differs {
            library: std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf()),
            found,
            built_against: BUILT_AGAINST,
        }),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(version_py: Option<&str>, metadata: Option<&str>) -> (tempfile::TempDir, PathBuf) {
        let site = tempfile::tempdir().unwrap();
        let lib = site.path().join("executorch/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libexecutorch.so"), b"").unwrap();
        if let Some(text) = version_py {
            std::fs::write(site.path().join("executorch/version.py"), text).unwrap();
        }
        if let Some(text) = metadata {
            let dist = site.path().join("executorch-9.9.9.dist-info");
            std::fs::create_dir_all(&dist).unwrap();
            std::fs::write(dist.join("METADATA"), text).unwrap();
        }
        (site, lib.join("libexecutorch.so"))
    }

    #[test]
    fn the_wheels_version_py_is_read_and_its_local_part_ignored() {
        let text =
            format!("__all__ = []\n__version__ = \"{BUILT_AGAINST}+cpu\"\ngit_version = 'x'\n");
        let (_site, library) = package(Some(&text), None);
        let found = check(&library).unwrap().unwrap();
        assert_eq!(found.version, format!("{BUILT_AGAINST}+cpu"));
        assert!(found.file.ends_with("executorch/version.py"));
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        let (_site, library) = package(Some("__version__ = '1.5.0+cpu'\n"), None);
        let err = check(&library).unwrap_err();
        assert!(matches!(err, RuntimeError::Differs { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("1.5.0+cpu"), "{message}");
        assert!(
            message.starts_with(&format!(
                "refusing ExecuTorch 1.5.0+cpu (this xnnblob drop-in is built against ExecuTorch \
                 {BUILT_AGAINST}"
            )),
            "{message}"
        );
    }

    #[test]
    fn the_dist_info_is_read_where_there_is_no_version_py() {
        let (_site, library) = package(
            None,
            Some("Metadata-Version: 2.1\nName: executorch\nVersion: 1.4.0\n\nVersion: 0\n"),
        );
        match check(&library).unwrap_err() {
            RuntimeError::Differs { found, .. } => {
                assert_eq!(found.version, "1.4.0");
                assert!(found.file.ends_with("METADATA"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_version_file_is_no_version_and_an_empty_one_is_an_error() {
        let (_site, library) = package(None, None);
        assert_eq!(check(&library).unwrap(), None);
        let (_site, library) = package(Some("# nothing\n"), None);
        let err = check(&library).unwrap_err();
        assert!(matches!(err, RuntimeError::Unreadable { .. }), "{err:?}");
        assert!(err.to_string().contains("version.py"), "{err}");
    }
}
