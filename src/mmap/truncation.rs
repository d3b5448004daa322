//! Surviving a mapped file cut short in place. Reading a page of a map that its file no longer
//! reaches (another process truncated the file) raises SIGBUS, which kills the process by
//! default. For maps watched here, a SIGBUS handler maps zero pages over the rest of the map
//! instead and records the fault, so the read resumes and sees zeros. Whoever computed
//! something from the map asks [`Watch::faulted`] before trusting the result.
//!
//! The handler touches only faults inside a watched map. Any other SIGBUS goes to the handler
//! that was installed before this one, or, if there was none, kills the process as it would
//! have without xnnblob.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// How many maps can be watched at once: a cache holds a few (one per save in the process),
/// so a full table means something keeps maps alive, and the newest maps go unwatched.
const SLOTS: usize = 256;
/// The kernel's page size, read when the handler is installed (sysconf is not
/// async-signal-safe): 4 KiB on x86-64, 16 or 64 KiB on some aarch64 kernels.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

struct Slot {
    /// Taken by a [`Watch`] (set before `start`, cleared after it).
    taken: AtomicBool,
    /// The map's first byte; 0 while the slot watches nothing.
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the array, never used itself
const EMPTY: Slot = Slot {
    taken: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static WATCHED: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Faults absorbed so far in this process: the cheap "nothing happened" test.
static FAULTS: AtomicU64 = AtomicU64::new(0);
/// What SIGBUS did before this module's handler, or `None` if installing it failed.
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// A handler installed with SA_SIGINFO.
type InfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// One watched map; the map must outlive it (drop the watch first, then unmap).
#[derive(Debug)]
pub(crate) struct Watch {
    slot: usize,
}

impl Watch {
    /// Watches `bytes`, the whole of one file map. `None` if the handler could not be installed
    /// or every slot is taken: a fault in the map then kills the process, as without a watch.
    pub(crate) fn start(bytes: &[u8]) -> Option<Watch> {
        if bytes.is_empty() || !install() {
            return None;
        }
        let slot = WATCHED.iter().position(|s| {
            s.taken
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let s = &WATCHED[slot];
        s.faulted.store(false, Ordering::Relaxed);
        s.len.store(bytes.len(), Ordering::Relaxed);
        // Published last: the handler reads `start` first, then `len`.
        s.start.store(bytes.as_ptr() as usize, Ordering::Release);
        Some(Watch { slot })
    }

    /// Whether a read of the map faulted: the file was cut short, and from the first faulting
    /// page on, the map now reads as zeros.
    pub(crate) fn faulted(&self) -> bool {
        WATCHED[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let s = &WATCHED[self.slot];
        s.start.store(0, Ordering::Release);
        s.taken.store(false, Ordering::Release);
    }
}

/// Whether a map made by [`MappedFile::open_watched`](super::MappedFile::open_watched) has
/// found its file cut short, anywhere in this process so far (one atomic load).
pub fn any_fault() -> bool {
    FAULTS.load(Ordering::Acquire) > 0
}

/// Installs the handler once; whether it is in place.
fn install() -> bool {
    PREVIOUS
        .get_or_init(|| {
            let page = super::page_size();
            if page.is_power_of_two() {
                PAGE.store(page, Ordering::Relaxed);
            }
            // SAFETY: sigaction with a null new action only reads the current one into a
            // zeroed struct; the new action's handler is `on_sigbus`, whose signature is the
            // SA_SIGINFO one, and its mask is initialised by sigemptyset.
            unsafe {
                let mut previous: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                    return None;
                }
                let mut ours: libc::sigaction = std::mem::zeroed();
                ours.sa_sigaction = on_sigbus as InfoHandler as usize;
                ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
                libc::sigemptyset(&mut ours.sa_mask);
                // The handler reads `previous` once this closure returns; a foreign fault in
                // between finds no record and takes the default action.
                if libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) != 0 {
                    return None;
                }
                Some(previous)
            }
        })
        .is_some()
}

/// Maps zeros over a watched map from the faulting page on; whether `address` was in one.
/// Async-signal-safe: atomics and one `mmap` call.
fn absorb(address: usize) -> bool {
    for s in &WATCHED {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 {
            continue;
        }
        let len = s.len.load(Ordering::Relaxed);
        if address < start || address >= start + len {
            continue;
        }
        let size = PAGE.load(Ordering::Relaxed);
        let page = address / size * size;
        let end = (start + len).next_multiple_of(size);
        // SAFETY: [page, end) lies inside the watched map (a map starts on a page boundary
        // and covers whole pages), which its owner keeps mapped while the watch lives. The
        // anonymous private read-only pages replace what the file no longer backs; every
        // reader of the map only reads, and now reads zeros there.
        let zeros = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                end - page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros == libc::MAP_FAILED {
            return false;
        }
        s.faulted.store(true, Ordering::Release);
        FAULTS.fetch_add(1, Ordering::AcqRel);
        return true;
    }
    false
}

extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; errno is
    // thread-local and restored so the interrupted code never sees the handler's.
    let (address, errno) = unsafe { ((*info).si_addr() as usize, *libc::__errno_location()) };
    let absorbed = absorb(address);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    if !absorbed {
        pass_on(signal, info, context);
    }
}

/// Hands a SIGBUS that is not ours to whatever handled SIGBUS before.
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.get().copied().flatten();
    match previous {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO action's handler has this signature; it was installed
                // for SIGBUS by its owner, and gets what the kernel gave us.
                let handler: InfoHandler = unsafe { std::mem::transmute(p.sa_sigaction) };
                handler(signal, info, context);
            } else {
                // SAFETY: a plain action's handler takes the signal number only.
                let handler: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                handler(signal);
            }
        }
        _ => {
            // The default action: die of SIGBUS. A fault repeats when the handler returns and
            // meets the default; a signal sent by someone (si_code <= 0) is raised again,
            // pending until the handler returns.
            // SAFETY: resetting SIGBUS to its default with a zeroed action, and raising a
            // signal, are async-signal-safe; `info` is valid as above.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut default.sa_mask);
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
                if (*info).si_code <= 0 {
                    libc::raise(libc::SIGBUS);
                }
            }
        }
    }
}
