//! Handing the heap copies ExecuTorch's file loader makes back to the system once freed.
//!
//! Under `LoadMode::File` every blob xnnblob reads in comes from `get_data` as a fresh heap
//! buffer, copied into its placeholder and freed. glibc's malloc serves blocks this large with
//! `mmap` only until the first one is freed: from then on its threshold rises to that size, the
//! next ones come from the arenas of the packing threads, and freeing them leaves their pages
//! resident. On the 1B-class export that held 15-35 MiB more at the cold launch's peak than
//! ExecuTorch's backend, which packs from the buffers in place (issue 39). Trimming after each
//! large copy returns those pages at once.

/// Copies smaller than this are left to the allocator: their pages are few, and trimming walks
/// every arena.
const TRIM_FROM_BYTES: usize = 1 << 20;

/// Called after a copy of `len` bytes from the loader was freed.
pub(crate) fn after_free(len: usize) {
    if len < TRIM_FROM_BYTES {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it takes their
    // locks and has no precondition on the caller.
    unsafe {
        libc::malloc_trim(0);
    }
}
