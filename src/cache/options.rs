//! What a packed-weight cache is opened with: the build and CPU a file must match, how its
//! packed bytes are checked, whether named keys are trusted, and where packing goes first.

use super::budget::CacheBudget;
use super::cpu::cpu_fingerprint;
use super::format::Compat;
use crate::storage::SharedStorage;
use std::path::PathBuf;
// Named by the documentation's links.
#[cfg(doc)]
use super::PackedWeightsCache;

/// Overrides of what a file must match; the defaults are this process's XNNPACK build and CPU.
/// (Tests use them to play another build or CPU.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheOptions {
    /// The XNNPACK build identifier to write into the file and require of it, instead of the
    /// linked build's ([`build_identifier`](crate::xnn::build_identifier)).
    pub build_id: Option<Vec<u8>>,
    /// The CPU fingerprint to write into the file and require of it, instead of this CPU's
    /// ([`cpu_fingerprint`]).
    pub cpu_fingerprint: Option<u64>,
    /// Save inside `finalize` instead of on a background thread. Slower cold launches, but
    /// entries are re-pointed into the file before XNNPACK holds their addresses, so the heap
    /// copies of packed weights are freed at once.
    pub blocking_save: bool,
    /// Read a loaded file ahead when it looks out of the page cache (a device restarted,
    /// memory pressure): a background thread asks the kernel for the whole file
    /// (`MADV_WILLNEED`) while the load goes on, instead of the first inference faulting the
    /// packed pages in as it reaches them. Off by default: on the disks measured (the peer
    /// bench's cold page cache scenarios), the first inference's own faults stream the file as
    /// fast, and the read ahead competed with the load for the disk. A file in the page cache
    /// costs a few `mincore` calls either way.
    pub prefetch: bool,
    /// When the packed bytes a file holds are checked against their checksums.
    pub verify: VerifyPacked,
    /// Whether a data file's named keys are checked against its bytes before they are taken as
    /// content identities (see [`KeyTrust`]).
    pub key_trust: KeyTrust,
    /// How many bytes of packed weights the file may hold; each save evicts the entries not
    /// used for longest beyond it (see [`CacheBudget`]).
    pub budget: CacheBudget,
    /// Where the file is read, written, synced, renamed and locked: the operating system's files
    /// by default; tests put the test support's `FaultyStorage` here
    /// (`xnnblob_test_support::faults`, outside this crate), which fails calls on request.
    pub storage: SharedStorage,
    /// Where what was found checking a file that cannot be written (an app's read-only
    /// bundle) is remembered, so that its damage is served at most once: None for the user's
    /// state directory (`$XDG_STATE_HOME/xnnblob`, else `~/.local/state/xnnblob`). Where none
    /// can be had, such a file is checked before use at every launch.
    pub state_dir: Option<PathBuf>,
    /// Read-only packed-weight caches consulted before this one, in order: files, or
    /// directories of them (`*.xbc`), made ahead of time for this CPU's class (`xnnblob
    /// prepack`). What they hold is never packed nor written here (see
    /// [`layer_outcomes`](PackedWeightsCache::layer_outcomes)).
    pub layers: Vec<PathBuf>,
    /// How many packed bytes go on the heap before packing starts a draft of the file.
    pub heap_first: HeapFirst,
}

/// How many bytes of packed weights a launch packs on the heap before it starts a draft of the
/// file to pack into (see `packing_file.rs`). A draft's pages are the file's: each one XNNPACK writes
/// first faults on its own (no fault-around for writes to a shared file mapping), and starting
/// the draft creates and allocates a file. On a small model that costs more than the packing
/// (a UNet's 14 KiB of weights: a cold load of 1.38 ms against 1.53 ms with a draft; a
/// MobileNetV3's 2.2 MiB: 4.77 against 5.46 ms). Weights packed on the heap are saved as before,
/// after the load, and stay on the heap while the process runs: at most this many bytes, which
/// ExecuTorch's own backend holds on the heap for the same model. Past it, every packed byte
/// goes straight into the file, written once and held once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapFirst(pub usize);

impl Default for HeapFirst {
    /// 4 MiB.
    fn default() -> Self {
        HeapFirst(4 << 20)
    }
}

/// Whether named keys that state a sha256 (ExecuTorch's XNNPACK exporter names each constant by
/// the sha256 of its bytes) are taken as the bytes' identity. Taken blindly, a `.ptd` made by
/// hand or modified after export, with the same keys over other bytes, would be given the old
/// packing by a warm launch: wrong outputs, and `cache verify` passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyTrust {
    /// The first launch that sees a data file (by device, inode, size and mtime) hashes the
    /// constants it packs and compares each with its key; a key that does not match its bytes
    /// is not used (the bytes' own hash is), and a file whose keys all matched is recorded in
    /// the cache file, so later launches with the same file hash nothing. Data without a file
    /// identity (memory, ExecuTorch's data maps) is taken as keyed.
    #[default]
    CheckEachFile,
    /// Keys are taken as identities without hashing (for files whose integrity is already
    /// checked, e.g. signed).
    TrustKeys,
}

/// When a cache checks the packed bytes it found in its file against the checksums recorded for
/// them. Damaged bytes (a bad sector, a stray write) would otherwise give wrong outputs at every
/// launch until someone ran `xnnblob cache verify`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VerifyPacked {
    /// After the load, on a background thread at low priority, every entry of the file, once
    /// per change of the file: a record beside it (`PATH.checked`) says the file was checked as
    /// it is, and later launches hash nothing while its inode, size and change time stay as
    /// recorded (any write moves the change time, and nothing sets it back). A damaged entry is
    /// forgotten (later runtimes of the process repack it) and the file is rewritten without it,
    /// so the next launch repacks it; the launch that found it has already handed it to
    /// XNNPACK. `xnnblob run` and the ExecuTorch backend use it.
    ///
    /// Not the library's default: the pass competes with the first inference for memory
    /// bandwidth. Checked at every launch, it took the first execute of 48 qd8 weights
    /// (96 MiB) inside ExecuTorch from 9.2-9.9 ms to 13-16 ms (`xnnblob-et-run ... --steps 1`,
    /// mmap loader, 6 launches each).
    Background,
    /// At open, before any look-up, every entry of the file: no launch ever uses a damaged
    /// entry, at the cost of reading every packed byte on the load path.
    BeforeUse,
    /// Never (`xnnblob cache verify` checks by hand; a rewrite of the file checks what it
    /// copies).
    #[default]
    Off,
}

impl CacheOptions {
    pub(super) fn compat(&self) -> Compat {
        Compat {
            build_id: self
                .build_id
                .clone()
                .unwrap_or_else(|| crate::xnn::build_identifier().to_vec()),
            cpu_fingerprint: self.cpu_fingerprint.unwrap_or_else(cpu_fingerprint),
        }
    }
}
