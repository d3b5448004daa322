//! The threads XNNPACK splits each operator across.
//!
//! XNNPACK calls pthreadpool's API with the `pthreadpool_t` its runtime was created with;
//! `xnnpack_sys::pool` serves those calls, so the pool behind the handle is ours to choose:
//! - [`Threadpool::new`]: xnnblob's own workers, which never hold up the caller. The caller works
//!   through an operator's items itself; a worker helps only if it is running when the operator
//!   starts (it *joins*), and the caller waits only for the workers that joined. A worker the
//!   scheduler has put behind other processes costs nothing: pthreadpool's release here waits for
//!   every worker at every operator, so one descheduled worker stalled a thousand-operator model
//!   for seconds. An idle worker looks for the next operator for 50 µs, then sleeps.
//! - [`Threadpool::with_ops`]: someone else's pool (ExecuTorch's, in its runtime), given as the
//!   two operations of [`sys::pool::PoolOps`].

use super::error::XnnError;
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xnnpack_sys as sys;
use xnnpack_sys::pool::{PoolHandle, PoolOps, RangeFn};

/// A job's range function, as the C side hands it (never null): the function [`RangeFn`] holds,
/// so a change of its C signature (`include/xnnblob_pool.h`) fails to compile here.
type Range = unsafe extern "C" fn(job: *mut c_void, thread: usize, begin: usize, end: usize);

/// A pool of threads XNNPACK splits operators across; runtimes created with it share it.
pub struct Threadpool {
    /// What `as_raw` hands XNNPACK: boxed, so its address outlives moves of the pool.
    handle: Box<PoolHandle>,
    own: Option<OwnPool>,
}

// SAFETY: the handle's ops are thread-safe by PoolOps's contract (xnnblob's own pool serialises
// calls with a lock; a foreign pool's provider promises as much), and the handle is never mutated.
unsafe impl Send for Threadpool {}
// SAFETY: as above.
unsafe impl Sync for Threadpool {}

impl fmt::Debug for Threadpool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Threadpool")
            .field("threads", &self.threads())
            .field("own", &self.own.is_some())
            .finish()
    }
}

impl Threadpool {
    /// xnnblob's own pool of `threads` threads, the caller's counted as one (so `threads - 1`
    /// workers; 0 is taken as 1).
    pub fn new(threads: usize) -> Result<Threadpool, XnnError> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared::new(threads));
        let mut workers = Vec::with_capacity(threads - 1);
        for index in 1..threads {
            let mine = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("xnnblob-pool-{index}"))
                .spawn(move || mine.work(index));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    // Those already started must not outlive the failed pool.
                    drop(OwnPool { shared, workers });
                    return Err(XnnError::PoolThread {
                        index,
                        threads,
                        reason: e.to_string(),
                    });
                }
            }
        }
        let handle = Box::new(PoolHandle {
            ops: &OWN_OPS,
            pool: Arc::as_ptr(&shared).cast_mut().cast(),
        });
        Ok(Threadpool {
            handle,
            own: Some(OwnPool { shared, workers }),
        })
    }

    /// A pool whose work is done by `ops` on `pool` (for example ExecuTorch's own threads).
    ///
    /// # Safety
    /// `ops` must keep [`PoolOps`]'s contract for `pool`, from any thread, for as long as this
    /// pool or a runtime created with it lives.
    pub unsafe fn with_ops(ops: &'static PoolOps, pool: *mut c_void) -> Threadpool {
        Threadpool {
            handle: Box::new(PoolHandle { ops, pool }),
            own: None,
        }
    }

    /// How many threads the pool splits operators across, the caller's included.
    pub fn threads(&self) -> usize {
        // SAFETY: the ops are valid for the handle's pool (new, or with_ops's contract).
        unsafe {
            (*self.handle.ops)
                .threads
                .map_or(1, |threads| threads(self.handle.pool))
        }
        .max(1)
    }

    /// The `pthreadpool_t` XNNPACK is given, for a C or C++ caller that creates its own
    /// runtimes or operators on this pool (valid while the pool lives).
    pub fn as_pthreadpool(&self) -> *mut c_void {
        self.as_raw().cast()
    }

    pub(super) fn as_raw(&self) -> sys::pthreadpool_t {
        let handle: *const PoolHandle = &*self.handle;
        handle.cast_mut().cast()
    }
}

/// xnnblob's own workers and what they share; dropping it stops and joins them.
struct OwnPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Drop for OwnPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.wake_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The job being run: written by the caller before it opens the job, read by each worker after
/// it joined, unchanged until every joined worker has left.
#[derive(Clone, Copy)]
struct Job {
    range: Option<Range>,
    job: *mut c_void,
    count: usize,
    chunk: usize,
    flags: u32,
}

// SAFETY: `job` is XNNPACK's context for one call, which it shares with the pool's threads by
// design (pthreadpool passes it to every worker).
unsafe impl Send for Job {}

/// How long an idle worker looks for the next job before it sleeps. Short enough that a pool
/// beside busy processes gives its core back, long enough to bridge the gap between operators.
const WORKER_SPIN: Duration = Duration::from_micros(50);

/// Set in `active` while the caller still hands out items: workers may join.
const OPEN: usize = 1 << (usize::BITS - 1);

/// A value alone on its cache line (128 bytes: adjacent-line prefetch pairs 64-byte lines).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    threads: usize,
    /// One caller at a time, as pthreadpool.
    calls: Mutex<()>,
    job: Mutex<Job>,
    /// The next item to hand out.
    next: Padded<AtomicUsize>,
    /// OPEN, plus the number of threads (caller included) working on the job.
    active: Padded<AtomicUsize>,
    /// Bumped for each job, and to stop: what idle workers watch. Each of these three counters
    /// has a cache line of its own, so that workers watching one do not slow the caller's
    /// writes to the others.
    generation: Padded<AtomicUsize>,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    wake: Mutex<()>,
    woken: Condvar,
    /// The caller sleeps here for joined workers that are still working.
    caller_waiting: AtomicBool,
    finish: Mutex<()>,
    finished: Condvar,
}

thread_local! {
    /// Set while this thread runs items of an xnnblob pool: a task that calls into a pool again
    /// runs that call itself rather than wait for the lock its own caller holds.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

impl Shared {
    fn new(threads: usize) -> Shared {
        Shared {
            threads,
            calls: Mutex::new(()),
            job: Mutex::new(Job {
                range: None,
                job: std::ptr::null_mut(),
                count: 0,
                chunk: 1,
                flags: 0,
            }),
            next: Padded(AtomicUsize::new(0)),
            active: Padded(AtomicUsize::new(0)),
            generation: Padded(AtomicUsize::new(0)),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake: Mutex::new(()),
            woken: Condvar::new(),
            caller_waiting: AtomicBool::new(false),
            finish: Mutex::new(()),
            finished: Condvar::new(),
        }
    }

    fn wake_all(&self) {
        self.generation.fetch_add(1, SeqCst);
        // A worker counts itself a sleeper, under `wake`, before it checks the generation; so
        // either it sees the new generation or it is counted here and waiting to be woken.
        if self.sleepers.load(SeqCst) > 0 {
            let _held = self.wake.lock();
            self.woken.notify_all();
        }
    }

    /// Runs `range` over `0..count` on the caller and on every worker that joins in time.
    fn run(&self, range: Range, job: *mut c_void, count: usize, flags: u32) {
        if IN_POOL.with(Cell::get) {
            run_items(range, job, 0, 0, count, flags);
            return;
        }
        let _call = self.calls.lock();
        // Items are handed out in chunks: a few per thread, so that a thread which falls behind
        // leaves its share to the others.
        let chunk = count.div_ceil(self.threads * 4).max(1);
        *self.job.lock() = Job {
            range: Some(range),
            job,
            count,
            chunk,
            flags,
        };
        self.next.store(0, SeqCst);
        self.active.store(OPEN | 1, SeqCst);
        self.wake_all();
        self.take_items(range, job, 0, count, chunk, flags);
        // Close the job to joiners and leave it; then wait for those who joined.
        let before = self.active.fetch_sub(OPEN | 1, SeqCst);
        if before != OPEN | 1 {
            self.wait_for_joined();
        }
    }

    fn take_items(
        &self,
        range: Range,
        job: *mut c_void,
        thread: usize,
        count: usize,
        chunk: usize,
        flags: u32,
    ) {
        IN_POOL.with(|p| p.set(true));
        // SAFETY: the C side's enter/leave only read and write this thread's FPU control word.
        let saved = unsafe { sys::pool::xnnblob_pool_enter(flags) };
        loop {
            let begin = self.next.fetch_add(chunk, SeqCst);
            if begin >= count {
                break;
            }
            let end = (begin + chunk).min(count);
            // SAFETY: `range` and `job` are the C side's trampoline and its job, valid for the
            // duration of this call to `run`, which returns only after this thread leaves; every
            // item is handed out once (fetch_add), and `thread` is unique among those running.
            unsafe { range(job, thread, begin, end) };
        }
        // SAFETY: restores what enter returned, on the same thread.
        unsafe { sys::pool::xnnblob_pool_leave(flags, saved) };
        IN_POOL.with(|p| p.set(false));
    }

    fn wait_for_joined(&self) {
        // Joined workers are running items: usually done within microseconds.
        for _ in 0..256 {
            if self.active.load(SeqCst) == 0 {
                return;
            }
            std::hint::spin_loop();
        }
        let mut held = self.finish.lock();
        self.caller_waiting.store(true, SeqCst);
        while self.active.load(SeqCst) != 0 {
            self.finished.wait(&mut held);
        }
        self.caller_waiting.store(false, SeqCst);
    }

    /// A worker's life: join each job that is open when it looks, sleep otherwise.
    fn work(&self, thread: usize) {
        loop {
            let generation = self.generation.load(SeqCst);
            if self.stop.load(SeqCst) {
                return;
            }
            let mut active = self.active.load(SeqCst);
            let mut joined = false;
            while active & OPEN != 0 {
                match self
                    .active
                    .compare_exchange(active, active + 1, SeqCst, SeqCst)
                {
                    Ok(_) => {
                        joined = true;
                        break;
                    }
                    Err(now) => active = now,
                }
            }
            if joined {
                let job = *self.job.lock();
                if let Some(range) = job.range {
                    self.take_items(range, job.job, thread, job.count, job.chunk, job.flags);
                }
                if self.active.fetch_sub(1, SeqCst) == 1 && self.caller_waiting.load(SeqCst) {
                    let _held = self.finish.lock();
                    self.finished.notify_all();
                }
            }
            // Operators follow each other within microseconds: look for the next one briefly
            // before sleeping, which would cost the caller a wake-up call per operator.
            let started = Instant::now();
            'spin: while started.elapsed() < WORKER_SPIN {
                for _ in 0..64 {
                    if self.generation.load(SeqCst) != generation {
                        break 'spin;
                    }
                    std::hint::spin_loop();
                }
            }
            // Sleep until the next job (or stop), unless one came meanwhile.
            let mut held = self.wake.lock();
            self.sleepers.fetch_add(1, SeqCst);
            while self.generation.load(SeqCst) == generation && !self.stop.load(SeqCst) {
                self.woken.wait(&mut held);
            }
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }
}

/// Runs every item on the calling thread, as thread `thread`.
fn run_items(range: Range, job: *mut c_void, thread: usize, begin: usize, end: usize, flags: u32) {
    // SAFETY: as in take_items: the C side's valid trampoline and job, this thread's FPU state.
    unsafe {
        let saved = sys::pool::xnnblob_pool_enter(flags);
        range(job, thread, begin, end);
        sys::pool::xnnblob_pool_leave(flags, saved);
    }
}

unsafe extern "C" fn own_threads(pool: *mut c_void) -> usize {
    // SAFETY: `pool` is the `Shared` of a live Threadpool (new sets it; runtimes keep the pool).
    let shared = unsafe { &*pool.cast::<Shared>() };
    shared.threads
}

unsafe extern "C" fn own_run(
    pool: *mut c_void,
    range: RangeFn,
    job: *mut c_void,
    count: usize,
    flags: u32,
) {
    // pool.c never passes a null range; one would have nothing to run.
    let range: Option<Range> = range;
    let Some(range) = range else {
        return;
    };
    // SAFETY: as in own_threads.
    let shared = unsafe { &*pool.cast::<Shared>() };
    shared.run(range, job, count, flags);
}

static OWN_OPS: PoolOps = PoolOps {
    threads: Some(own_threads),
    run: Some(own_run),
};
