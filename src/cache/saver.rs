//! A cache's background saves and checks: one thread at a time, at low priority, after packing
//! and then inference have paused.

use super::error::CacheError;
use parking_lot::Mutex;
use std::sync::Arc;

/// The cache's background saves: one thread at a time, which saves again while `finalize`
/// calls came in during its last pass.
#[derive(Default)]
pub(super) struct Saver {
    /// The save or check handed to a background thread (ended or not).
    pub(super) thread: Option<SaverThread>,
    /// Shared with that thread.
    pub(super) queue: Arc<Mutex<SaveQueue>>,
    /// Wakes a saving thread that waits for packing to pause (see [`PACKING_PAUSE`]).
    pub(super) hurry: Arc<parking_lot::Condvar>,
}

/// How long packing must pause before a background save starts: a program's delegates are
/// created one after another, each asking for a save, and packing into the file being made (see
/// `packing_file.rs`) goes on between them. One save after the last publishes that file; a save per
/// delegate would rewrite it whole each time. [`PackedWeightsCache::wait_saved`] (and exit)
/// does not wait for the pause.
pub(super) const PACKING_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// How long the process's runtimes must have stopped executing before a background save or
/// check starts: it competes with inference for cores, memory bandwidth and the disk (a save
/// syncs every packed byte to disk; the kernel's writeback is on this thread's account, and a
/// check reads them all), so a launch that packs would otherwise run its first tokens slower
/// than a warm one. An LLM's tokens follow one another with no gap near this long; a pause
/// this long is the app waiting for its user.
pub(super) const INFERENCE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a background save or check waits for inference to pause, at most: an app that
/// never pauses (a camera's frames) still gets its file, and one killed soon after its first
/// minute keeps what it packed. [`PackedWeightsCache::wait_saved`] (and exit) does not wait.
pub(super) const LONGEST_WAIT_FOR_INFERENCE: std::time::Duration =
    std::time::Duration::from_secs(10);

/// How often a waiting save looks at inference again (on a low-priority thread).
pub(super) const INFERENCE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// On a saving or checking thread: waits until the process's runtimes have paused for
/// [`INFERENCE_PAUSE`], or [`LONGEST_WAIT_FOR_INFERENCE`] has passed, or someone waits for the
/// thread.
pub(super) fn wait_for_inference_to_pause(queue: &Mutex<SaveQueue>, hurry: &parking_lot::Condvar) {
    let since = std::time::Instant::now();
    let mut q = queue.lock();
    while !q.hurried
        && crate::xnn::activity::quiet_for() < INFERENCE_PAUSE
        && since.elapsed() < LONGEST_WAIT_FOR_INFERENCE
    {
        hurry.wait_for(&mut q, INFERENCE_POLL);
    }
}

#[derive(Default)]
pub(super) struct SaveQueue {
    /// A saving thread is running.
    pub(super) running: bool,
    /// A `finalize` came while it ran: it saves once more.
    pub(super) again: bool,
    /// A save failed: no later `finalize` saves in this process.
    pub(super) given_up: bool,
    /// That save's error, until [`PackedWeightsCache::wait_saved`] reports it.
    pub(super) failed: Option<CacheError>,
    /// Someone waits for the save: it starts now, packing or not.
    pub(super) hurried: bool,
}

/// The nice value of a saving or checking thread (see [`yield_to_inference`]).
pub(super) const BACKGROUND_NICE: libc::c_int = 10;

/// Lowers the calling (saving or checking) thread's priority: its work waits for inference to
/// pause (see [`wait_for_inference_to_pause`]), and if inference starts again meanwhile, the
/// app's threads get most of the cores. Not the idle scheduling class: someone may wait for this
/// thread (`wait_saved`, exit), and an idle-class thread gets almost no time while any other
/// thread of the machine wants it. Two busy loops beside a test of 200 cache saves under qemu
/// made it take 191 s instead of 5 s, with 4 s of CPU: an app's exit on a busy phone would wait
/// as long. A nice value cannot be raised back without privilege, and need not be.
pub(super) fn yield_to_inference() {
    // SAFETY: on Linux, PRIO_PROCESS with `who` 0 is the calling thread alone; setpriority reads
    // nothing through pointers. A refusal leaves the thread as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE) };
}

/// A save or check handed to a background thread: joined by waiting for it to end.
pub(super) struct SaverThread {
    ended: Arc<Ended>,
    /// The waiting thread it was handed to, which may not have looked for it yet (see
    /// [`WATCH_EVERY`]); None for a thread started for it.
    handed_to: Option<Arc<Waiting>>,
}

#[derive(Default)]
struct Ended {
    ended: Mutex<bool>,
    told: parking_lot::Condvar,
}

/// Marks a task ended when dropped: when it returns, and when it unwinds.
struct EndsTask(Arc<Ended>);

impl Drop for EndsTask {
    fn drop(&mut self) {
        *self.0.ended.lock() = true;
        self.0.told.notify_all();
    }
}

impl SaverThread {
    /// Waits until the task has ended, waking the thread it was handed to if that thread has
    /// not taken it yet: whoever waits does not wait for the thread's next look.
    pub(super) fn join(self) {
        let mut ended = self.ended.ended.lock();
        if !*ended && let Some(waiting) = &self.handed_to {
            waiting.given.notify_one();
        }
        while !*ended {
            self.ended.told.wait(&mut ended);
        }
    }
}

type Task = Box<dyn FnOnce() + Send>;

/// A background thread waiting for its next task.
#[derive(Default)]
struct Waiting {
    slot: Mutex<Slot>,
    given: parking_lot::Condvar,
}

/// What a waiting thread is handed, and how it waits.
#[derive(Default)]
struct Slot {
    task: Option<Task>,
    /// The thread looks for a task every [`WATCH_EVERY`] by itself, and is handed one without
    /// being woken.
    watching: bool,
}

/// How often a waiting thread looks for a task by itself while it watches: a save waits this
/// long for packing to pause anyway ([`PACKING_PAUSE`]), so a task found at the next look
/// starts no later than it would have. Waking the thread instead costs the init that hands it
/// over a system call and an interrupt to the thread's core (16-20 us of a cold launch's
/// finalize, in a VM of 2 vCPUs, measured with `perf record --call-graph dwarf`).
const WATCH_EVERY: std::time::Duration = PACKING_PAUSE;

/// How long a waiting thread watches after it starts waiting (once the backend is prepared, or
/// after its last task): the loads that finalize a cache come soon after the library's own load
/// or one after another. It then sleeps until it is woken, so that an idle app's process is
/// never woken for nothing.
const WATCH_FOR: std::time::Duration = std::time::Duration::from_secs(3);

/// The background threads whose task ended, each waiting for another: a save or a check is
/// handed to one of them, where starting a thread took 13-35 us of the init that finalized a cold
/// launch's cache. A face may make the thread it prepares the backend on one of them
/// ([`serve_background_work`]), so that a process's first save starts none.
static WAITING: Mutex<Vec<Arc<Waiting>>> = Mutex::new(Vec::new());

/// Starts a save or check on a background thread: one that ended its last task, or a new one,
/// named so that it is told from the host's own threads (an unnamed thread takes the process's
/// name). As `std::thread::spawn`, it panics only where the system cannot start a thread.
pub(super) fn spawn_saver<F: FnOnce() + Send + 'static>(f: F) -> SaverThread {
    let ended = Arc::new(Ended::default());
    let ends = EndsTask(ended.clone());
    let task: Task = Box::new(move || {
        let _ends = ends;
        f();
    });
    let waiting = WAITING.lock().pop();
    match waiting {
        Some(thread) => {
            let mut slot = thread.slot.lock();
            slot.task = Some(task);
            if !slot.watching {
                thread.given.notify_one();
            }
            drop(slot);
            SaverThread {
                ended,
                handed_to: Some(thread),
            }
        }
        None => {
            std::thread::Builder::new()
                .name("xnnblob-save".into())
                .spawn(move || {
                    run(task);
                    serve_background_work();
                })
                .expect("the system starts a thread");
            SaverThread {
                ended,
                handed_to: None,
            }
        }
    }
}

/// Makes the calling thread run the caches' background saves and checks, one at a time, for
/// the rest of the process: it waits, blocked, until one is handed to it (looking for one by
/// itself every [`WATCH_EVERY`] for the first [`WATCH_FOR`] of each wait). Never returns.
pub fn serve_background_work() -> ! {
    let me = Arc::new(Waiting::default());
    loop {
        me.slot.lock().watching = true;
        WAITING.lock().push(me.clone());
        let watch_until = std::time::Instant::now() + WATCH_FOR;
        let task = {
            let mut slot = me.slot.lock();
            loop {
                if let Some(t) = slot.task.take() {
                    break t;
                }
                if !slot.watching {
                    me.given.wait(&mut slot);
                } else if std::time::Instant::now() < watch_until {
                    me.given.wait_for(&mut slot, WATCH_EVERY);
                } else {
                    // Handed a task from now on, the thread is woken for it.
                    slot.watching = false;
                }
            }
        };
        run(task);
    }
}

/// Runs a task on a background thread, which goes on to the next whatever the task did: a save
/// reports its own failures (a panic in it too, see `finalize`); a check's panic ends the check.
fn run(task: Task) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
}
