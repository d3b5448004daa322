//! An ExecuTorch program whose weights live in this binary: the `.pte` is read from disk, its
//! external weights come from linked parameters, with no `.ptd` and no copy into RAM.

/// The generated parameters (statics in section `.xnnblob_params`, lookup by id).
#[allow(clippy::all)]
pub mod params {
    include!(concat!(env!("OUT_DIR"), "/params/linked_params.rs"));
}

/// A second model's parameters, linked into the same binary under its own symbol names.
#[allow(clippy::all)]
pub mod second {
    include!(concat!(env!("OUT_DIR"), "/second/linked_params.rs"));
}

use std::sync::Arc;
use xnnblob::backend::Backend;
use xnnblob::link::LinkedDataMap;
use xnnblob::program::{Program, ProgramError};

/// The linked parameters as a named-data map.
pub fn linked_map() -> LinkedDataMap {
    LinkedDataMap::new(
        "linked-model",
        params::LINKED_PARAM_KEYS,
        params::lookup_linked_param,
    )
}

/// Loads `pte` through `backend` with its external weights taken from the linked parameters.
pub fn load(backend: &Backend, pte: &std::path::Path) -> Result<Program, ProgramError> {
    Program::load_with_maps(backend, pte, vec![Arc::new(linked_map())], None)
}
