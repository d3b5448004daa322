// pthreadpool's C API, the calls XNNPACK makes to split an operator across threads, over pools
// that xnnblob chooses at run time.
//
// XNNPACK is compiled against pthreadpool.h and calls pthreadpool_parallelize_* with the
// pthreadpool_t its runtime was created with. Here that handle is a `struct pthreadpool` of two
// words: a table of two operations and the pool they act on (include/xnnblob_pool.h, the one
// declaration C, C++ and Rust share). Each call flattens its grid of
// (tiled) items into one range of indices and asks the pool to run sub-ranges of it; the
// trampolines below turn a sub-range back into the task's arguments. So the Rust side sees one
// call shape, whatever the grid, and can run it on xnnblob's own pool or on ExecuTorch's.
//
// A null pool, a pool of one thread or a single item runs on the calling thread, as pthreadpool
// does. The order of items on one thread is pthreadpool's: row-major over the grid.

#include <pthreadpool.h>
#include <stddef.h>
#include <stdint.h>
#include <xnnblob_pool.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

// The pthreadpool_t XNNPACK calls with: a handle, at the struct's address.
struct pthreadpool {
  struct xnnblob_pool_handle handle;
};

// cpuinfo is initialised by xnn_initialize, before any runtime exists.
uint32_t cpuinfo_get_current_uarch_index_with_default(uint32_t default_uarch_index);

// The floating-point state a thread runs a job in: pthreadpool's DISABLE_DENORMALS flushes
// denormal inputs and results to zero for the job's duration only.
uint64_t xnnblob_pool_enter(uint32_t flags) {
  if (!(flags & PTHREADPOOL_FLAG_DISABLE_DENORMALS)) return 0;
#if defined(__x86_64__) || defined(__i386__)
  const uint32_t saved = _mm_getcsr();
  // FTZ (bit 15) and DAZ (bit 6).
  _mm_setcsr(saved | 0x8040);
  return saved;
#elif defined(__aarch64__)
  uint64_t saved;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved));
  // FZ (bit 24).
  __asm__ __volatile__("msr fpcr, %0" : : "r"(saved | (UINT64_C(1) << 24)));
  return saved;
#else
  return 0;
#endif
}

void xnnblob_pool_leave(uint32_t flags, uint64_t saved) {
  if (!(flags & PTHREADPOOL_FLAG_DISABLE_DENORMALS)) return;
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr((uint32_t)saved);
#elif defined(__aarch64__)
  __asm__ __volatile__("msr fpcr, %0" : : "r"(saved));
#else
  (void)saved;
#endif
}

enum { MAX_DIMS = 6 };

// One call's grid: per dimension its range, its tile (1 when untiled) and its number of tiles.
struct job {
  void (*task)(void);
  void* argument;
  size_t dims;
  size_t range[MAX_DIMS];
  size_t tile[MAX_DIMS];
  size_t steps[MAX_DIMS];
  // Whether the task takes a uarch index (pthreadpool's *_with_uarch calls).
  int with_uarch;
  uint32_t default_uarch_index;
  uint32_t max_uarch_index;
};

static struct job job_of(void (*task)(void), void* argument) {
  struct job job = {task, argument, 0, {0}, {0}, {0}, 0, 0, 0};
  return job;
}

static void dim(struct job* job, size_t range, size_t tile) {
  if (tile == 0) tile = 1;
  job->range[job->dims] = range;
  job->tile[job->dims] = tile;
  job->steps[job->dims] = range / tile + (range % tile != 0);
  job->dims++;
}

static size_t items(const struct job* job) {
  size_t n = 1;
  for (size_t d = 0; d < job->dims; d++) n *= job->steps[d];
  return n;
}

// The grid position of linear item `index`.
static void locate(const struct job* job, size_t index, size_t at[MAX_DIMS]) {
  for (size_t d = job->dims; d-- > 0;) {
    at[d] = index % job->steps[d];
    index /= job->steps[d];
  }
}

static void step(const struct job* job, size_t at[MAX_DIMS]) {
  for (size_t d = job->dims; d-- > 0;) {
    if (++at[d] < job->steps[d]) return;
    at[d] = 0;
  }
}

static size_t start(const struct job* job, const size_t at[MAX_DIMS], size_t d) {
  return at[d] * job->tile[d];
}

static size_t extent(const struct job* job, const size_t at[MAX_DIMS], size_t d) {
  const size_t left = job->range[d] - at[d] * job->tile[d];
  return left < job->tile[d] ? left : job->tile[d];
}

static uint32_t uarch_index(const struct job* job) {
  const uint32_t index = cpuinfo_get_current_uarch_index_with_default(job->default_uarch_index);
  return index > job->max_uarch_index ? job->default_uarch_index : index;
}

static void run(pthreadpool_t pool, xnnblob_pool_range_fn range, struct job* job, uint32_t flags) {
  const size_t count = items(job);
  if (count == 0) return;
  if (pool == NULL || count == 1 || pool->handle.ops->threads(pool->handle.pool) <= 1) {
    const uint64_t saved = xnnblob_pool_enter(flags);
    range(job, 0, 0, count);
    xnnblob_pool_leave(flags, saved);
    return;
  }
  pool->handle.ops->run(pool->handle.pool, range, job, count, flags);
}

size_t pthreadpool_get_threads_count(pthreadpool_t pool) {
  return pool == NULL ? 1 : pool->handle.ops->threads(pool->handle.pool);
}

// One trampoline per task shape: CALL is the task's call, with `job`, `at` (the item's grid
// position), `thread` and `uarch` in scope. S(d) is dimension d's start, E(d) its extent.
#define S(d) start(job, at, d)
#define E(d) extent(job, at, d)
#define TRAMPOLINE(name, task_type, CALL)                                            \
  static void range_##name(void* opaque, size_t thread, size_t begin, size_t end) { \
    const struct job* job = (const struct job*)opaque;                              \
    const task_type task = (task_type)job->task;                                    \
    const uint32_t uarch = job->with_uarch ? uarch_index(job) : 0;                  \
    (void)thread;                                                                   \
    (void)uarch;                                                                    \
    size_t at[MAX_DIMS];                                                            \
    locate(job, begin, at);                                                         \
    for (size_t i = begin; i < end; i++) {                                          \
      CALL;                                                                         \
      step(job, at);                                                                \
    }                                                                               \
  }

TRAMPOLINE(1d, pthreadpool_task_1d_t, task(job->argument, S(0)))
TRAMPOLINE(1d_with_thread, pthreadpool_task_1d_with_thread_t, task(job->argument, thread, S(0)))
TRAMPOLINE(1d_tile_1d, pthreadpool_task_1d_tile_1d_t, task(job->argument, S(0), E(0)))
TRAMPOLINE(2d, pthreadpool_task_2d_t, task(job->argument, S(0), S(1)))
TRAMPOLINE(2d_with_thread, pthreadpool_task_2d_with_thread_t,
           task(job->argument, thread, S(0), S(1)))
TRAMPOLINE(2d_tile_1d, pthreadpool_task_2d_tile_1d_t, task(job->argument, S(0), S(1), E(1)))
TRAMPOLINE(2d_tile_1d_with_uarch, pthreadpool_task_2d_tile_1d_with_id_t,
           task(job->argument, uarch, S(0), S(1), E(1)))
TRAMPOLINE(2d_tile_2d, pthreadpool_task_2d_tile_2d_t,
           task(job->argument, S(0), S(1), E(0), E(1)))
TRAMPOLINE(2d_tile_2d_with_uarch, pthreadpool_task_2d_tile_2d_with_id_t,
           task(job->argument, uarch, S(0), S(1), E(0), E(1)))
TRAMPOLINE(3d, pthreadpool_task_3d_t, task(job->argument, S(0), S(1), S(2)))
TRAMPOLINE(3d_tile_1d, pthreadpool_task_3d_tile_1d_t,
           task(job->argument, S(0), S(1), S(2), E(2)))
TRAMPOLINE(3d_tile_1d_with_thread, pthreadpool_task_3d_tile_1d_with_thread_t,
           task(job->argument, thread, S(0), S(1), S(2), E(2)))
TRAMPOLINE(3d_tile_1d_with_uarch, pthreadpool_task_3d_tile_1d_with_id_t,
           task(job->argument, uarch, S(0), S(1), S(2), E(2)))
TRAMPOLINE(3d_tile_1d_with_uarch_with_thread, pthreadpool_task_3d_tile_1d_with_id_with_thread_t,
           task(job->argument, uarch, thread, S(0), S(1), S(2), E(2)))
TRAMPOLINE(3d_tile_2d, pthreadpool_task_3d_tile_2d_t,
           task(job->argument, S(0), S(1), S(2), E(1), E(2)))
TRAMPOLINE(3d_tile_2d_with_uarch, pthreadpool_task_3d_tile_2d_with_id_t,
           task(job->argument, uarch, S(0), S(1), S(2), E(1), E(2)))
TRAMPOLINE(4d, pthreadpool_task_4d_t, task(job->argument, S(0), S(1), S(2), S(3)))
TRAMPOLINE(4d_tile_2d, pthreadpool_task_4d_tile_2d_t,
           task(job->argument, S(0), S(1), S(2), S(3), E(2), E(3)))
TRAMPOLINE(4d_tile_2d_with_uarch, pthreadpool_task_4d_tile_2d_with_id_t,
           task(job->argument, uarch, S(0), S(1), S(2), S(3), E(2), E(3)))
TRAMPOLINE(5d, pthreadpool_task_5d_t, task(job->argument, S(0), S(1), S(2), S(3), S(4)))
TRAMPOLINE(5d_tile_2d, pthreadpool_task_5d_tile_2d_t,
           task(job->argument, S(0), S(1), S(2), S(3), S(4), E(3), E(4)))
TRAMPOLINE(6d_tile_2d, pthreadpool_task_6d_tile_2d_t,
           task(job->argument, S(0), S(1), S(2), S(3), S(4), S(5), E(4), E(5)))

#define JOB(task, argument) job_of((void (*)(void))(task), (argument))
// Tasks given a uarch index get the current core's from cpuinfo (once per sub-range), bounded as
// pthreadpool bounds it.
#define UARCH(job, d, m)             \
  do {                               \
    (job).with_uarch = 1;            \
    (job).default_uarch_index = (d); \
    (job).max_uarch_index = (m);     \
  } while (0)

void pthreadpool_parallelize_1d(pthreadpool_t pool, pthreadpool_task_1d_t task, void* argument,
                                size_t range, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range, 1);
  run(pool, range_1d, &job, flags);
}

void pthreadpool_parallelize_1d_with_thread(pthreadpool_t pool,
                                            pthreadpool_task_1d_with_thread_t task,
                                            void* argument, size_t range, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range, 1);
  run(pool, range_1d_with_thread, &job, flags);
}

void pthreadpool_parallelize_1d_tile_1d(pthreadpool_t pool, pthreadpool_task_1d_tile_1d_t task,
                                        void* argument, size_t range, size_t tile,
                                        uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range, tile);
  run(pool, range_1d_tile_1d, &job, flags);
}

void pthreadpool_parallelize_2d(pthreadpool_t pool, pthreadpool_task_2d_t task, void* argument,
                                size_t range_i, size_t range_j, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  run(pool, range_2d, &job, flags);
}

void pthreadpool_parallelize_2d_with_thread(pthreadpool_t pool,
                                            pthreadpool_task_2d_with_thread_t task,
                                            void* argument, size_t range_i, size_t range_j,
                                            uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  run(pool, range_2d_with_thread, &job, flags);
}

void pthreadpool_parallelize_2d_tile_1d(pthreadpool_t pool, pthreadpool_task_2d_tile_1d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t tile_j, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, tile_j);
  run(pool, range_2d_tile_1d, &job, flags);
}

void pthreadpool_parallelize_2d_tile_1d_with_uarch(pthreadpool_t pool,
                                                   pthreadpool_task_2d_tile_1d_with_id_t task,
                                                   void* argument, uint32_t default_uarch_index,
                                                   uint32_t max_uarch_index, size_t range_i,
                                                   size_t range_j, size_t tile_j,
                                                   uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, 1);
  dim(&job, range_j, tile_j);
  run(pool, range_2d_tile_1d_with_uarch, &job, flags);
}

void pthreadpool_parallelize_2d_tile_2d(pthreadpool_t pool, pthreadpool_task_2d_tile_2d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t tile_i, size_t tile_j, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, tile_i);
  dim(&job, range_j, tile_j);
  run(pool, range_2d_tile_2d, &job, flags);
}

void pthreadpool_parallelize_2d_tile_2d_with_uarch(pthreadpool_t pool,
                                                   pthreadpool_task_2d_tile_2d_with_id_t task,
                                                   void* argument, uint32_t default_uarch_index,
                                                   uint32_t max_uarch_index, size_t range_i,
                                                   size_t range_j, size_t tile_i, size_t tile_j,
                                                   uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, tile_i);
  dim(&job, range_j, tile_j);
  run(pool, range_2d_tile_2d_with_uarch, &job, flags);
}

void pthreadpool_parallelize_3d(pthreadpool_t pool, pthreadpool_task_3d_t task, void* argument,
                                size_t range_i, size_t range_j, size_t range_k, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, 1);
  run(pool, range_3d, &job, flags);
}

void pthreadpool_parallelize_3d_tile_1d(pthreadpool_t pool, pthreadpool_task_3d_tile_1d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t range_k, size_t tile_k, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_1d, &job, flags);
}

void pthreadpool_parallelize_3d_tile_1d_with_thread(
    pthreadpool_t pool, pthreadpool_task_3d_tile_1d_with_thread_t task, void* argument,
    size_t range_i, size_t range_j, size_t range_k, size_t tile_k, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_1d_with_thread, &job, flags);
}

void pthreadpool_parallelize_3d_tile_1d_with_uarch(pthreadpool_t pool,
                                                   pthreadpool_task_3d_tile_1d_with_id_t task,
                                                   void* argument, uint32_t default_uarch_index,
                                                   uint32_t max_uarch_index, size_t range_i,
                                                   size_t range_j, size_t range_k,
                                                   size_t tile_k, uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_1d_with_uarch, &job, flags);
}

void pthreadpool_parallelize_3d_tile_1d_with_uarch_with_thread(
    pthreadpool_t pool, pthreadpool_task_3d_tile_1d_with_id_with_thread_t task, void* argument,
    uint32_t default_uarch_index, uint32_t max_uarch_index, size_t range_i, size_t range_j,
    size_t range_k, size_t tile_k, uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_1d_with_uarch_with_thread, &job, flags);
}

void pthreadpool_parallelize_3d_tile_2d(pthreadpool_t pool, pthreadpool_task_3d_tile_2d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t range_k, size_t tile_j, size_t tile_k,
                                        uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, tile_j);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_2d, &job, flags);
}

void pthreadpool_parallelize_3d_tile_2d_with_uarch(pthreadpool_t pool,
                                                   pthreadpool_task_3d_tile_2d_with_id_t task,
                                                   void* argument, uint32_t default_uarch_index,
                                                   uint32_t max_uarch_index, size_t range_i,
                                                   size_t range_j, size_t range_k,
                                                   size_t tile_j, size_t tile_k,
                                                   uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, 1);
  dim(&job, range_j, tile_j);
  dim(&job, range_k, tile_k);
  run(pool, range_3d_tile_2d_with_uarch, &job, flags);
}

void pthreadpool_parallelize_4d(pthreadpool_t pool, pthreadpool_task_4d_t task, void* argument,
                                size_t range_i, size_t range_j, size_t range_k, size_t range_l,
                                uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, 1);
  dim(&job, range_l, 1);
  run(pool, range_4d, &job, flags);
}

void pthreadpool_parallelize_4d_tile_2d(pthreadpool_t pool, pthreadpool_task_4d_tile_2d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t range_k, size_t range_l, size_t tile_k,
                                        size_t tile_l, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  dim(&job, range_l, tile_l);
  run(pool, range_4d_tile_2d, &job, flags);
}

void pthreadpool_parallelize_4d_tile_2d_with_uarch(
    pthreadpool_t pool, pthreadpool_task_4d_tile_2d_with_id_t task, void* argument,
    uint32_t default_uarch_index, uint32_t max_uarch_index, size_t range_i, size_t range_j,
    size_t range_k, size_t range_l, size_t tile_k, size_t tile_l, uint32_t flags) {
  struct job job = JOB(task, argument);
  UARCH(job, default_uarch_index, max_uarch_index);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, tile_k);
  dim(&job, range_l, tile_l);
  run(pool, range_4d_tile_2d_with_uarch, &job, flags);
}

void pthreadpool_parallelize_5d(pthreadpool_t pool, pthreadpool_task_5d_t task, void* argument,
                                size_t range_i, size_t range_j, size_t range_k, size_t range_l,
                                size_t range_m, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, 1);
  dim(&job, range_l, 1);
  dim(&job, range_m, 1);
  run(pool, range_5d, &job, flags);
}

void pthreadpool_parallelize_5d_tile_2d(pthreadpool_t pool, pthreadpool_task_5d_tile_2d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t range_k, size_t range_l, size_t range_m,
                                        size_t tile_l, size_t tile_m, uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, 1);
  dim(&job, range_l, tile_l);
  dim(&job, range_m, tile_m);
  run(pool, range_5d_tile_2d, &job, flags);
}

void pthreadpool_parallelize_6d_tile_2d(pthreadpool_t pool, pthreadpool_task_6d_tile_2d_t task,
                                        void* argument, size_t range_i, size_t range_j,
                                        size_t range_k, size_t range_l, size_t range_m,
                                        size_t range_n, size_t tile_m, size_t tile_n,
                                        uint32_t flags) {
  struct job job = JOB(task, argument);
  dim(&job, range_i, 1);
  dim(&job, range_j, 1);
  dim(&job, range_k, 1);
  dim(&job, range_l, 1);
  dim(&job, range_m, tile_m);
  dim(&job, range_n, tile_n);
  run(pool, range_6d_tile_2d, &job, flags);
}
