//! The pthreadpool API that XNNPACK calls (xnnpack-sys's pool.c) over xnnblob's own pool: every
//! call shape XNNPACK uses covers its grid exactly once with pthreadpool's arguments, and an
//! operator never waits for a worker the scheduler does not run; a runtime hands its pool only
//! the operators large enough to gain from it (XNNPACK patch 0036).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xnnblob::xnn::Threadpool;

/// What the tasks of one call saw: each item's arguments (the uarch index first where given,
/// the thread index apart), and the highest thread index.
#[derive(Default)]
struct Record {
    items: Mutex<Vec<Vec<usize>>>,
    threads: Mutex<Vec<usize>>,
}

fn record(ctx: *mut c_void, thread: Option<usize>, args: &[usize]) {
    // SAFETY: every call below passes a live &Record as the context.
    let r = unsafe { &*ctx.cast::<Record>() };
    r.items.lock().unwrap().push(args.to_vec());
    if let Some(t) = thread {
        r.threads.lock().unwrap().push(t);
    }
}

macro_rules! task {
    ($name:ident, $($a:ident),*) => {
        extern "C" fn $name(ctx: *mut c_void, $($a: usize),*) {
            record(ctx, None, &[$($a),*]);
        }
    };
}
macro_rules! task_with_thread {
    ($name:ident, $($a:ident),*) => {
        extern "C" fn $name(ctx: *mut c_void, thread: usize, $($a: usize),*) {
            record(ctx, Some(thread), &[$($a),*]);
        }
    };
}
macro_rules! task_with_uarch {
    ($name:ident, $($a:ident),*) => {
        extern "C" fn $name(ctx: *mut c_void, uarch: u32, $($a: usize),*) {
            record(ctx, None, &[uarch as usize, $($a),*]);
        }
    };
}

task!(t1, a);
task!(t2, a, b);
task!(t3, a, b, c);
task!(t4, a, b, c, d);
task!(t5, a, b, c, d, e);
task!(t6, a, b, c, d, e, f);
task!(t7, a, b, c, d, e, f, g);
task!(t8, a, b, c, d, e, f, g, h);
task_with_thread!(th1, a);
task_with_thread!(th2, a, b);
task_with_thread!(th4, a, b, c, d);
task_with_uarch!(u3, a, b, c);
task_with_uarch!(u4, a, b, c, d);
task_with_uarch!(u5, a, b, c, d, e);
task_with_uarch!(u6, a, b, c, d, e, f);
extern "C" fn uth4(
    ctx: *mut c_void,
    uarch: u32,
    thread: usize,
    a: usize,
    b: usize,
    c: usize,
    d: usize,
) {
    record(ctx, Some(thread), &[uarch as usize, a, b, c, d]);
}

type P = *mut c_void;
type F = *const c_void;
unsafe extern "C" {
    fn pthreadpool_get_threads_count(p: P) -> usize;
    fn pthreadpool_parallelize_1d(p: P, t: F, c: P, r0: usize, fl: u32);
    fn pthreadpool_parallelize_1d_with_thread(p: P, t: F, c: P, r0: usize, fl: u32);
    fn pthreadpool_parallelize_1d_tile_1d(p: P, t: F, c: P, r0: usize, t0: usize, fl: u32);
    fn pthreadpool_parallelize_2d(p: P, t: F, c: P, r0: usize, r1: usize, fl: u32);
    fn pthreadpool_parallelize_2d_with_thread(p: P, t: F, c: P, r0: usize, r1: usize, fl: u32);
    fn pthreadpool_parallelize_2d_tile_1d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        t1: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_2d_tile_1d_with_uarch(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        t1: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_2d_tile_2d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        t0: usize,
        t1: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_2d_tile_2d_with_uarch(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        t0: usize,
        t1: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d(p: P, t: F, c: P, r0: usize, r1: usize, r2: usize, fl: u32);
    fn pthreadpool_parallelize_3d_tile_1d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d_tile_1d_with_thread(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d_tile_1d_with_uarch(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        r2: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d_tile_1d_with_uarch_with_thread(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        r2: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d_tile_2d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        t1: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_3d_tile_2d_with_uarch(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        r2: usize,
        t1: usize,
        t2: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_4d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_4d_tile_2d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        t2: usize,
        t3: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_4d_tile_2d_with_uarch(
        p: P,
        t: F,
        c: P,
        d: u32,
        m: u32,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        t2: usize,
        t3: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_5d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        r4: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_5d_tile_2d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        r4: usize,
        t3: usize,
        t4: usize,
        fl: u32,
    );
    fn pthreadpool_parallelize_6d_tile_2d(
        p: P,
        t: F,
        c: P,
        r0: usize,
        r1: usize,
        r2: usize,
        r3: usize,
        r4: usize,
        r5: usize,
        t4: usize,
        t5: usize,
        fl: u32,
    );
}

/// pthreadpool's items for a grid of (range, tile) dimensions, row-major over the tiles: each
/// item is every dimension's start, then the extent of each dimension whose tile is given.
fn expected(dims: &[(usize, Option<usize>)], uarch: bool) -> Vec<Vec<usize>> {
    let steps: Vec<usize> = dims
        .iter()
        .map(|&(r, t)| r.div_ceil(t.unwrap_or(1)))
        .collect();
    let total: usize = steps.iter().product();
    let mut all = Vec::with_capacity(total);
    for mut index in 0..total {
        let mut at = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            at[d] = index % steps[d];
            index /= steps[d];
        }
        let mut item: Vec<usize> = if uarch { vec![0] } else { vec![] };
        item.extend(dims.iter().zip(&at).map(|(&(_, t), &a)| a * t.unwrap_or(1)));
        for (&(r, t), &a) in dims.iter().zip(&at) {
            if let Some(t) = t {
                item.push(t.min(r - a * t));
            }
        }
        all.push(item);
    }
    all
}

/// Runs `call` with a fresh record and checks it against `want`, and thread indices (where the
/// task is given one) against the pool's thread count.
fn check(name: &str, pool: P, want: Vec<Vec<usize>>, call: impl FnOnce(P)) {
    let r = Record::default();
    call((&r as *const Record).cast_mut().cast());
    let mut got = r.items.into_inner().unwrap();
    got.sort();
    let mut want = want;
    want.sort();
    assert_eq!(got, want, "{name}: items");
    // SAFETY: `pool` is null or a live pool's handle.
    let threads = unsafe { pthreadpool_get_threads_count(pool) };
    for t in r.threads.into_inner().unwrap() {
        assert!(t < threads, "{name}: thread index {t} of {threads}");
    }
}

fn every_shape(pool: P) {
    let f = |t: *const ()| t.cast::<c_void>();
    let (a, b, c, d, e, g) = (5usize, 4usize, 3usize, 2usize, 3usize, 7usize);
    // SAFETY: each task's signature is the one pthreadpool.h gives its call, and the context is
    // the &Record `check` passes.
    unsafe {
        check("1d", pool, expected(&[(g, None)], false), |x| {
            pthreadpool_parallelize_1d(pool, f(t1 as _), x, g, 1)
        });
        check("1d_with_thread", pool, expected(&[(g, None)], false), |x| {
            pthreadpool_parallelize_1d_with_thread(pool, f(th1 as _), x, g, 0)
        });
        check("1d_tile_1d", pool, expected(&[(g, Some(3))], false), |x| {
            pthreadpool_parallelize_1d_tile_1d(pool, f(t2 as _), x, g, 3, 0)
        });
        check("2d", pool, expected(&[(a, None), (b, None)], false), |x| {
            pthreadpool_parallelize_2d(pool, f(t2 as _), x, a, b, 0)
        });
        check(
            "2d_with_thread",
            pool,
            expected(&[(a, None), (b, None)], false),
            |x| pthreadpool_parallelize_2d_with_thread(pool, f(th2 as _), x, a, b, 0),
        );
        check(
            "2d_tile_1d",
            pool,
            expected(&[(a, None), (g, Some(3))], false),
            |x| pthreadpool_parallelize_2d_tile_1d(pool, f(t3 as _), x, a, g, 3, 0),
        );
        check(
            "2d_tile_1d_with_uarch",
            pool,
            expected(&[(a, None), (g, Some(3))], true),
            |x| {
                pthreadpool_parallelize_2d_tile_1d_with_uarch(pool, f(u3 as _), x, 0, 0, a, g, 3, 0)
            },
        );
        check(
            "2d_tile_2d",
            pool,
            expected(&[(g, Some(2)), (a, Some(3))], false),
            |x| pthreadpool_parallelize_2d_tile_2d(pool, f(t4 as _), x, g, a, 2, 3, 0),
        );
        check(
            "2d_tile_2d_with_uarch",
            pool,
            expected(&[(g, Some(2)), (a, Some(3))], true),
            |x| {
                pthreadpool_parallelize_2d_tile_2d_with_uarch(
                    pool,
                    f(u4 as _),
                    x,
                    0,
                    0,
                    g,
                    a,
                    2,
                    3,
                    0,
                )
            },
        );
        check(
            "3d",
            pool,
            expected(&[(a, None), (b, None), (c, None)], false),
            |x| pthreadpool_parallelize_3d(pool, f(t3 as _), x, a, b, c, 0),
        );
        let tiled_k = [(a, None), (b, None), (g, Some(2))];
        check("3d_tile_1d", pool, expected(&tiled_k, false), |x| {
            pthreadpool_parallelize_3d_tile_1d(pool, f(t4 as _), x, a, b, g, 2, 0)
        });
        check(
            "3d_tile_1d_with_thread",
            pool,
            expected(&tiled_k, false),
            |x| pthreadpool_parallelize_3d_tile_1d_with_thread(pool, f(th4 as _), x, a, b, g, 2, 0),
        );
        check(
            "3d_tile_1d_with_uarch",
            pool,
            expected(&tiled_k, true),
            |x| {
                pthreadpool_parallelize_3d_tile_1d_with_uarch(
                    pool,
                    f(u4 as _),
                    x,
                    0,
                    0,
                    a,
                    b,
                    g,
                    2,
                    0,
                )
            },
        );
        check(
            "3d_tile_1d_with_uarch_with_thread",
            pool,
            expected(&tiled_k, true),
            |x| {
                pthreadpool_parallelize_3d_tile_1d_with_uarch_with_thread(
                    pool,
                    f(uth4 as _),
                    x,
                    0,
                    0,
                    a,
                    b,
                    g,
                    2,
                    0,
                )
            },
        );
        let tiled_jk = [(c, None), (g, Some(3)), (a, Some(2))];
        check("3d_tile_2d", pool, expected(&tiled_jk, false), |x| {
            pthreadpool_parallelize_3d_tile_2d(pool, f(t5 as _), x, c, g, a, 3, 2, 0)
        });
        check(
            "3d_tile_2d_with_uarch",
            pool,
            expected(&tiled_jk, true),
            |x| {
                pthreadpool_parallelize_3d_tile_2d_with_uarch(
                    pool,
                    f(u5 as _),
                    x,
                    0,
                    0,
                    c,
                    g,
                    a,
                    3,
                    2,
                    0,
                )
            },
        );
        check(
            "4d",
            pool,
            expected(&[(d, None), (c, None), (b, None), (e, None)], false),
            |x| pthreadpool_parallelize_4d(pool, f(t4 as _), x, d, c, b, e, 0),
        );
        let tiled_kl = [(d, None), (c, None), (g, Some(4)), (a, Some(2))];
        check("4d_tile_2d", pool, expected(&tiled_kl, false), |x| {
            pthreadpool_parallelize_4d_tile_2d(pool, f(t6 as _), x, d, c, g, a, 4, 2, 0)
        });
        check(
            "4d_tile_2d_with_uarch",
            pool,
            expected(&tiled_kl, true),
            |x| {
                pthreadpool_parallelize_4d_tile_2d_with_uarch(
                    pool,
                    f(u6 as _),
                    x,
                    0,
                    0,
                    d,
                    c,
                    g,
                    a,
                    4,
                    2,
                    0,
                )
            },
        );
        let five = [(d, None), (c, None), (d, None), (b, None), (e, None)];
        check("5d", pool, expected(&five, false), |x| {
            pthreadpool_parallelize_5d(pool, f(t5 as _), x, d, c, d, b, e, 0)
        });
        let five_tiled = [(d, None), (c, None), (d, None), (g, Some(3)), (a, Some(4))];
        check("5d_tile_2d", pool, expected(&five_tiled, false), |x| {
            pthreadpool_parallelize_5d_tile_2d(pool, f(t7 as _), x, d, c, d, g, a, 3, 4, 0)
        });
        let six_tiled = [
            (d, None),
            (d, None),
            (c, None),
            (d, None),
            (g, Some(3)),
            (a, Some(4)),
        ];
        check("6d_tile_2d", pool, expected(&six_tiled, false), |x| {
            pthreadpool_parallelize_6d_tile_2d(pool, f(t8 as _), x, d, d, c, d, g, a, 3, 4, 0)
        });
    }
}

#[test]
fn every_call_shape_covers_its_grid_once_on_the_caller_and_on_a_pool() {
    xnnblob::xnn::initialize().unwrap();
    every_shape(std::ptr::null_mut());
    let one = Threadpool::new(1).unwrap();
    every_shape(one.as_pthreadpool());
    let three = Threadpool::new(3).unwrap();
    assert_eq!(three.threads(), 3);
    for _ in 0..20 {
        every_shape(three.as_pthreadpool());
    }
}

/// Items of a big call: each sleeps a little, so that every thread that runs gets some.
extern "C" fn slow_item(ctx: *mut c_void, thread: usize, _item: usize) {
    // SAFETY: the context is the Vec of counters the test passes.
    let seen = unsafe { &*ctx.cast::<Vec<AtomicUsize>>() };
    seen[thread].fetch_add(1, Ordering::Relaxed);
    std::thread::sleep(Duration::from_micros(200));
}

#[test]
fn workers_share_the_items_of_a_call_and_concurrent_callers_are_serialised() {
    let pool = Arc::new(Threadpool::new(3).unwrap());
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let seen: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
                let raw = pool.as_pthreadpool();
                // SAFETY: a task of the 1d_with_thread shape, and its context.
                unsafe {
                    pthreadpool_parallelize_1d_with_thread(
                        raw,
                        (slow_item as *const ()).cast(),
                        (&seen as *const Vec<AtomicUsize>).cast_mut().cast(),
                        300,
                        0,
                    )
                };
                seen.iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut helped = 0;
    for c in callers {
        let per_thread = c.join().unwrap();
        assert_eq!(
            per_thread.iter().sum::<usize>(),
            300,
            "every item once: {per_thread:?}"
        );
        helped += per_thread[1] + per_thread[2];
    }
    assert!(helped > 0, "the workers took part in 60 ms calls");
}

/// What [`tiny_item`] counts: every item, and those the calling thread ran itself.
struct ItemCounts {
    caller: i32,
    all: AtomicUsize,
    by_caller: AtomicUsize,
}

extern "C" fn tiny_item(ctx: *mut c_void, _item: usize) {
    // SAFETY: the context is the counts the test passes.
    let counts = unsafe { &*ctx.cast::<ItemCounts>() };
    counts.all.fetch_add(1, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    if unsafe { libc::gettid() } == counts.caller {
        counts.by_caller.fetch_add(1, Ordering::Relaxed);
    }
}

/// The pool's worker threads, by thread id.
fn pool_workers() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with("xnnblob-pool")
                .then(|| e.file_name().to_string_lossy().parse().ok())
                .flatten()
        })
        .collect()
}

fn pin_to_cpu(tid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity take valid
    // pointers to it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// The stall of issue 27: pthreadpool's caller waited at every operator for every worker, so a
/// worker the scheduler kept off the CPU held up each of a thousand operators. Here the worker
/// shares one CPU with a busy thread and the caller, at the idle scheduling class (it runs only
/// when nothing else wants that CPU): the calls must not wait for it.
#[test]
fn a_worker_kept_off_the_cpu_does_not_hold_up_the_caller() {
    let before = pool_workers();
    let pool = Threadpool::new(2).unwrap();
    // A worker names itself once it runs; other tests of this binary may start pools meanwhile,
    // whose workers are then treated alike (which only slows them).
    let mut workers = Vec::new();
    for _ in 0..10_000 {
        workers = pool_workers()
            .into_iter()
            .filter(|w| !before.contains(w))
            .collect();
        if !workers.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!workers.is_empty(), "the pool's worker is running");
    let cpu = 0;
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    // The harness runs other tests on this thread afterwards: give its CPUs back at the end.
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it for this thread.
    let mut all: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer and size describe `all`.
    unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut all) };
    pin_to_cpu(me, cpu);
    for &w in &workers {
        pin_to_cpu(w, cpu);
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a valid thread id of this process and a valid parameter.
        let set = unsafe { libc::sched_setscheduler(w, libc::SCHED_IDLE, &param) };
        assert_eq!(set, 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // SAFETY: as above.
            pin_to_cpu(unsafe { libc::gettid() }, cpu);
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let switches_before: usize = workers.iter().map(|&w| context_switches(w)).sum();
    let counts = ItemCounts {
        caller: me,
        all: AtomicUsize::new(0),
        by_caller: AtomicUsize::new(0),
    };
    let calls = 5000;
    for _ in 0..calls {
        // SAFETY: a task of the 1d shape and its context.
        unsafe {
            pthreadpool_parallelize_1d(
                pool.as_pthreadpool(),
                (tiny_item as *const ()).cast(),
                (&counts as *const ItemCounts).cast_mut().cast(),
                64,
                0,
            )
        };
    }
    let switches = workers.iter().map(|&w| context_switches(w)).sum::<usize>() - switches_before;
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    // SAFETY: `all` is the set read above; 0 is this thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &all) };
    let (ran, by_caller) = (
        counts.all.load(Ordering::Relaxed),
        counts.by_caller.load(Ordering::Relaxed),
    );
    assert_eq!(ran, calls * 64, "every item ran once");
    eprintln!(
        "the caller ran {by_caller} of {ran} items; the worker was scheduled {switches} times in \
         {calls} calls"
    );
    // A call that waited for the worker could not end before the worker ran: the worker would be
    // scheduled at least once per call (and 2000 calls took 42 s here). One that does not wait
    // ends without it. Counted in the kernel's context switches, not timed.
    assert!(
        switches < calls / 2,
        "the worker was scheduled {switches} times in {calls} calls: the caller waited for it"
    );
    assert!(by_caller > 0, "the caller ran items itself");
}

/// How many times thread `tid` of this process was switched off the CPU, willingly or not.
fn context_switches(tid: i32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .map(|l| {
            l.split_whitespace()
                .last()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum()
}

/// A pool of two threads that runs every job on the calling thread and counts the jobs.
extern "C" fn two_threads(_pool: *mut c_void) -> usize {
    2
}

extern "C" fn count_and_run(
    pool: *mut c_void,
    range: xnnblob::xnn::RangeFn,
    job: *mut c_void,
    count: usize,
    _flags: u32,
) {
    // SAFETY: the pool pointer is the test's counter (`counting_pool`).
    unsafe { &*pool.cast::<AtomicUsize>() }.fetch_add(1, Ordering::Relaxed);
    let range = range.expect("XNNPACK passes a range function");
    // SAFETY: the job is the one C handed with the range, run whole on one thread.
    unsafe { range(job, 0, 0, count) };
}

static COUNTING_OPS: xnnblob::xnn::PoolOps = xnnblob::xnn::PoolOps {
    threads: Some(two_threads),
    run: Some(count_and_run),
};

/// A pool over `jobs`, which counts what XNNPACK hands it.
fn counting_pool(jobs: &'static AtomicUsize) -> Arc<Threadpool> {
    // SAFETY: COUNTING_OPS keeps PoolOps's contract (every item once, on thread 0, returning
    // when done) for a pool that is a live 'static counter.
    Arc::new(unsafe {
        Threadpool::with_ops(
            &COUNTING_OPS,
            (jobs as *const AtomicUsize).cast_mut().cast(),
        )
    })
}

/// Jobs the pool was handed in one invoke of an MLP of `widths` over `batch` rows, whose outputs
/// are checked against the plain Rust reference.
fn pool_jobs_of_an_invoke(widths: &[usize], batch: usize, jobs: &'static AtomicUsize) -> usize {
    use xnnblob::xnn::{Runtime, RuntimeOptions};
    use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};
    let mlp = Mlp::random(widths, 11);
    let graph = mlp.subgraph(batch).unwrap();
    let options = RuntimeOptions {
        threadpool: Some(counting_pool(jobs)),
        ..Default::default()
    };
    let mut runtime = Runtime::with_options(&graph, None, &options).unwrap();
    let input: Vec<f32> = (0..batch * widths[0])
        .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
        .collect();
    let mut output = vec![f32::NAN; batch * widths[widths.len() - 1]];
    let before = jobs.load(Ordering::Relaxed);
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut output)])
        .unwrap();
    let expected = mlp.reference_forward(&input, batch);
    let diff = crate::common::close::max_abs_difference(&output, &expected);
    assert!(diff <= 1e-3, "{widths:?} x {batch}: max abs diff {diff}");
    jobs.load(Ordering::Relaxed) - before
}

#[test]
fn operators_too_small_to_split_run_on_the_calling_thread_and_the_rest_on_the_pool() {
    static SMALL: AtomicUsize = AtomicUsize::new(0);
    static LARGE: AtomicUsize = AtomicUsize::new(0);
    static MIXED: AtomicUsize = AtomicUsize::new(0);
    // 64 rows through 64 x 32 and 32 x 32 weights: 128 Ki and 64 Ki multiply-adds, below the
    // 256 Ki of patch 0036, though each is many tiles an unpatched XNNPACK splits across a pool.
    assert_eq!(
        pool_jobs_of_an_invoke(&[64, 32, 32], 64, &SMALL),
        0,
        "a graph of small layers never wakes the pool"
    );
    // 512 x 512 over 32 rows: 8 Mi multiply-adds.
    let large = pool_jobs_of_an_invoke(&[512, 512], 32, &LARGE);
    assert!(large > 0, "a large layer runs on the pool");
    // The same large layer, then one of 512 x 2 over 32 rows (32 Ki): only the first is split.
    assert_eq!(
        pool_jobs_of_an_invoke(&[512, 512, 2], 32, &MIXED),
        large,
        "the small layer after the large one runs on the calling thread"
    );
}

#[test]
fn an_operator_changes_sides_when_a_reshape_moves_its_work_across_the_bound() {
    use xnnblob::tensor::{Shape, TensorMut, TensorRef};
    use xnnblob::xnn::{Runtime, RuntimeOptions};
    use xnnblob_test_support::synthetic::Mlp;
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    // Defined for 32 rows of 512 x 512 (8 Mi multiply-adds); run for 1 row (256 Ki, at the
    // bound) and back. Each change of rows starts from the other side's guess (the output shape
    // the last reshape left), so both corrections are taken.
    let mlp = Mlp::random(&[512, 512], 5);
    let graph = mlp.subgraph(32).unwrap();
    let options = RuntimeOptions {
        threadpool: Some(counting_pool(&JOBS)),
        ..Default::default()
    };
    let mut runtime = Runtime::with_options(&graph, None, &options).unwrap();
    for rows in [1usize, 32, 1, 32] {
        let input: Vec<f32> = (0..rows * 512)
            .map(|i| ((i % 7) as f32 - 3.0) / 3.0)
            .collect();
        let mut output = vec![f32::NAN; rows * 512];
        let before = JOBS.load(Ordering::Relaxed);
        runtime
            .execute(
                &[TensorRef::f32(Shape::new(&[rows, 512]).unwrap(), &input)],
                &mut [TensorMut::f32(&mut output)],
            )
            .unwrap();
        let jobs = JOBS.load(Ordering::Relaxed) - before;
        let expected = mlp.reference_forward(&input, rows);
        let diff = crate::common::close::max_abs_difference(&output, &expected);
        assert!(diff <= 1e-3, "{rows} rows: max abs diff {diff}");
        if rows == 1 {
            assert_eq!(jobs, 0, "one row is at the bound: the calling thread");
        } else {
            assert!(jobs > 0, "32 rows run on the pool");
        }
    }
}
