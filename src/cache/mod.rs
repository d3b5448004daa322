//! The persistent packed-weight cache: XNNPACK packs a weight once, the packed bytes are saved
//! to a file, and every later launch maps that file so XNNPACK finds each weight packed.
//!
//! Packed weights are found by what the unpacked bytes are ([`BlobId`], a content hash), never
//! by a name: callers [`register`](PackedWeightsCache::register) the unpacked data they hand to
//! XNNPACK with its identity, and the cache translates XNNPACK's pointer keys. The file format,
//! what a warm launch trusts, and the commit protocol: `docs/cache-format.md`.

//!
//! The file format (`format`, `checksum64`, `BlobId`) needs no XNNPACK; the cache itself
//! (`PackedWeightsCache`, its XNNPACK provider, load and save) comes with the `xnnpack` feature.

pub mod budget;
#[cfg(feature = "xnnpack")]
mod checked;
mod checksum;
#[cfg(feature = "xnnpack")]
mod core;
mod cpu;
#[cfg(feature = "xnnpack")]
mod error;
pub mod format;
mod identity;
#[cfg(feature = "xnnpack")]
mod layers;
#[cfg(feature = "xnnpack")]
mod options;
#[cfg(feature = "xnnpack")]
mod packed;
#[cfg(feature = "xnnpack")]
mod packing_file;
#[cfg(feature = "xnnpack")]
mod persist;
#[cfg(feature = "xnnpack")]
mod saver;
#[cfg(feature = "xnnpack")]
mod stats;

pub use crate::side_file::PRIVATE_MODE;
pub use budget::CacheBudget;
#[cfg(feature = "xnnpack")]
pub use checked::{SETTLED, settle_time};
pub use checksum::checksum64;
pub use cpu::{
    cpu_fingerprint, cpu_fingerprint_difference, describe_cpu_fingerprint, packing_class,
    x86_model_layout,
};
#[cfg(feature = "xnnpack")]
pub use error::CacheError;
pub use format::{Compat, CpuMatch, EntryKey, FileError};
pub use identity::{BlobId, Description, KeyMismatch, verify_keys};
#[cfg(feature = "xnnpack")]
pub use layers::{CACHE_FILE_EXTENSION, LayerOutcome};
#[cfg(feature = "xnnpack")]
pub use options::{CacheOptions, HeapFirst, KeyTrust, VerifyPacked};
#[cfg(feature = "xnnpack")]
pub use packed::{
    CacheAccess, OwnedRegistration, PackedWeightsCache, Registration, compact_file, verify_file,
};
#[cfg(feature = "xnnpack")]
pub(crate) use persist::lock_path;
#[cfg(feature = "xnnpack")]
pub use persist::{FileReport, LoadOutcome};
#[cfg(feature = "xnnpack")]
pub use saver::serve_background_work;
#[cfg(feature = "xnnpack")]
pub use stats::{BadEntry, CacheStats};
