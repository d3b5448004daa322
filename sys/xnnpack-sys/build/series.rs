//! XNNPACK's patch series: what turns Debian's XNNPACK tree into the one xnnblob builds. One
//! home for the three places that make such a tree: the build script, XNNPACK's own tests
//! (`tests/xnnpack_own_tests.rs`) and the `xnnpack-series` command, which applies the series to
//! another XNNPACK's tree and names the first patch that does not apply.
//!
//! The series is xnnblob's own kernels, `kernels/<arch>/<file>`, copied into the tree as
//! `xnnblob/<arch>/<file>` (where the patches that register them expect them; outside `src/`,
//! whose every file XNNPACK's configure step scans for its own kernels), then
//! `patches/*.patch`, applied in name order with `patch -p1`, each to the tree the ones before
//! it made.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The series, read from the `xnnpack-sys` crate's directory.
pub struct Series {
    /// xnnblob's kernels: (path under `kernels/`, contents), in name order.
    pub kernels: Vec<(PathBuf, Vec<u8>)>,
    /// The patches: (file name, contents), in name order.
    pub patches: Vec<(String, Vec<u8>)>,
}

/// Why a series was not read or did not apply.
#[derive(Debug)]
pub enum SeriesError {
    /// A file or directory of the series could not be read.
    Read { path: PathBuf, error: io::Error },
    /// A kernel could not be written into the tree.
    Write { path: PathBuf, error: io::Error },
    /// `patch` could not be run.
    Tool(io::Error),
    /// Patch `name`, the `index`th of `total` (from 1), did not apply to the tree the ones
    /// before it made; `output` is what `patch` said.
    Patch {
        name: String,
        index: usize,
        total: usize,
        output: String,
    },
}

impl fmt::Display for SeriesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeriesError::Read { path, error } => {
                write!(f, "cannot read {}: {error}", path.display())
            }
            SeriesError::Write { path, error } => {
                write!(f, "cannot write {}: {error}", path.display())
            }
            SeriesError::Tool(error) => write!(f, "cannot run patch: {error} (is it installed?)"),
            SeriesError::Patch {
                name,
                index,
                total,
                output,
            } => write!(
                f,
                "patch {name} ({index} of {total}) does not apply to the tree the {} before it \
                 made:\n{output}",
                index - 1
            ),
        }
    }
}

impl Series {
    /// The series of the crate at `crate_dir` (`kernels/` and `patches/` under it).
    pub fn read(crate_dir: &Path) -> Result<Series, SeriesError> {
        let kernels_dir = crate_dir.join("kernels");
        let mut kernels = Vec::new();
        for arch in sorted_entries(&kernels_dir)?
            .into_iter()
            .filter(|p| p.is_dir())
        {
            for file in sorted_entries(&arch)?.into_iter().filter(|p| p.is_file()) {
                let text = read(&file)?;
                let relative = file
                    .strip_prefix(&kernels_dir)
                    .unwrap_or(&file)
                    .to_path_buf();
                kernels.push((relative, text));
            }
        }
        let mut patches = Vec::new();
        for file in sorted_entries(&crate_dir.join("patches"))? {
            if file.extension().is_some_and(|x| x == "patch") {
                let name = file
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                patches.push((name, read(&file)?));
            }
        }
        Ok(Series { kernels, patches })
    }

    /// Copies the kernels into the XNNPACK tree at `xnnpack` and applies the patches in order.
    /// Stops at the first patch that does not apply, leaving the tree as the ones before it made
    /// it, with `patch`'s `.rej` files of the failing one beside the files it touched.
    pub fn apply(&self, xnnpack: &Path) -> Result<(), SeriesError> {
        let own = xnnpack.join("xnnblob");
        for (path, text) in &self.kernels {
            let to = own.join(path);
            let write = |error| SeriesError::Write {
                path: to.clone(),
                error,
            };
            fs::create_dir_all(to.parent().unwrap_or(&own)).map_err(write)?;
            fs::write(&to, text).map_err(write)?;
        }
        for (i, (name, text)) in self.patches.iter().enumerate() {
            // From the bytes read (and hashed by the build's cache key), not the file again.
            let mut child = Command::new("patch")
                .args(["-p1", "--batch", "--forward"])
                .current_dir(xnnpack)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(SeriesError::Tool)?;
            let fed = child.stdin.take().map(|mut stdin| stdin.write_all(text));
            let out = child.wait_with_output().map_err(SeriesError::Tool)?;
            if !out.status.success() || matches!(fed, Some(Err(_))) {
                return Err(SeriesError::Patch {
                    name: name.clone(),
                    index: i + 1,
                    total: self.patches.len(),
                    output: format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                });
            }
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, SeriesError> {
    fs::read(path).map_err(|error| SeriesError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// The entries of `dir`, in name order.
fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, SeriesError> {
    let entries = fs::read_dir(dir).map_err(|error| SeriesError::Read {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut paths = entries
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| SeriesError::Read {
            path: dir.to_path_buf(),
            error,
        })?;
    paths.sort();
    Ok(paths)
}
