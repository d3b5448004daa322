//! Packing a program's weights ahead of time into a cache file of their own, without running
//! anything: what `xnnblob prepack` makes for each CPU class an app ships to, and what a device
//! then uses as a read-only layer ([`CacheOptions::layers`](crate::cache::CacheOptions::layers)).

use super::{Program, ProgramError};
use crate::backend::{Backend, BackendOptions, WeightsCacheChoice};
use std::path::{Path, PathBuf};

/// What [`pack_ahead`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedAhead {
    /// Packed weights in the file.
    pub entries: usize,
    /// The file's size in bytes (0, and no file, when the program has nothing to pack).
    pub bytes: u64,
}

/// Packs every weight of every XNNPACK delegate of every method of the program at `program`
/// (with external data `data`) on this CPU, into a new cache file at `file` (one there already is
/// replaced; its directory is made if missing): the delegates are initialised, which packs, and nothing is executed, so methods
/// whose other operators only ExecuTorch's runtime runs are packed too.
pub fn pack_ahead(
    program: &Path,
    data: &[PathBuf],
    file: &Path,
) -> Result<PackedAhead, ProgramError> {
    let io = |error: std::io::Error| {
        ProgramError::Cache(crate::cache::CacheError::Io {
            path: file.display().to_string(),
            error,
        })
    };
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // A file that is not a cache (a user's, the program's own data) is left alone, as the
    // writable cache leaves it: only a cache of an earlier run is replaced.
    crate::cache::PackedWeightsCache::check_path(file)?;
    // A file of an earlier run would be extended, not replaced.
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
        _ => {}
    }
    // Saves in the background, as a launch's: each delegate's init finalizes the cache, and a
    // blocking save would write the whole file at each of them (62 times for the 8da4w
    // decoder: 7.3 s instead of 0.4 s); the saves in between coalesce, and the wait below
    // makes the last one durable.
    let backend = Backend::new(BackendOptions {
        threads: crate::backend::machine_threads(),
        ..Default::default()
    })?;
    let request = WeightsCacheChoice::File(file.to_path_buf());
    let loaded = Program::load(&backend, program, data, Some(&request))?;
    let mut delegates = Vec::new();
    for name in loaded.method_names() {
        delegates.push(loaded.init_delegates(name)?);
    }
    let cache = loaded
        .weights_cache()
        .cloned()
        .expect("a program loaded with a cache file has its cache");
    cache.finalize()?;
    cache.wait_saved()?;
    let entries = cache.stats().entries;
    drop(delegates);
    drop(loaded);
    drop(cache);
    // The writers' lock beside the file belongs to a writable cache, not to a bundle.
    let _ = std::fs::remove_file(crate::cache::lock_path(file));
    // A program with nothing to pack (no weights) leaves no file (a save may have made one that
    // records only its data files).
    if entries == 0 {
        match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => return Ok(PackedAhead { entries, bytes: 0 }),
        }
    }
    let bytes = match std::fs::metadata(file) {
        Ok(m) => m.len(),
        Err(e) => return Err(io(e)),
    };
    Ok(PackedAhead { entries, bytes })
}
