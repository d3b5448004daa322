//! Checks that the committed flatbuffers code (`src/schema/*_generated.rs`) was generated from
//! the schemas as they are (`schema/*.fbs`). Building never runs flatc, so a schema edited
//! without `scripts/gen-flatbuffers.sh` would otherwise build against the old code, and read
//! files by a layout the schema no longer says.

use sha2::{Digest, Sha256};
use std::fs;
use std::path::Path;

/// Written by `scripts/gen-flatbuffers.sh`: `<sha256>  schema/<name>.fbs`, one line each.
const DIGESTS: &str = "src/schema/fbs.sha256";

fn main() {
    println!("cargo:rerun-if-changed=schema");
    println!("cargo:rerun-if-changed={DIGESTS}");
    if let Err(message) = check() {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn check() -> Result<(), String> {
    let listed = fs::read_to_string(DIGESTS).map_err(|e| format!("reading {DIGESTS}: {e}"))?;
    let mut schemas: Vec<String> = fs::read_dir("schema")
        .map_err(|e| format!("listing schema/: {e}"))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "fbs"))
        .map(|path| path.to_string_lossy().into_owned())
        .collect();
    schemas.sort();
    let mut recorded: Vec<(&str, &str)> = listed
        .lines()
        .filter_map(|line| line.split_once("  "))
        .map(|(digest, path)| (path, digest))
        .collect();
    recorded.sort();
    let recorded_paths: Vec<&str> = recorded.iter().map(|(path, _)| *path).collect();
    if recorded_paths != schemas {
        return Err(format!(
            "{DIGESTS} lists {recorded_paths:?} but schema/ holds {schemas:?}: run scripts/gen-flatbuffers.sh"
        ));
    }
    for (path, digest) in recorded {
        let bytes = fs::read(Path::new(path)).map_err(|e| format!("reading {path}: {e}"))?;
        let actual: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if actual != digest {
            return Err(format!(
                "{path} changed since src/schema was generated from it: run scripts/gen-flatbuffers.sh"
            ));
        }
    }
    Ok(())
}
