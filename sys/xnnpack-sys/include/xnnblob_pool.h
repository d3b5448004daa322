// The pool table XNNPACK runs on in xnnblob's builds: the one declaration of it, for the C that
// implements pthreadpool's calls over it (src/pool.c), the C++ that serves it from ExecuTorch's
// pool (faces/executorch/src/et_pool.cc), and Rust (xnnpack-sys's bindings, generated from this
// file; re-exported as `xnnpack_sys::pool`).
//
// A pthreadpool_t that XNNPACK is given points to an xnnblob_pool_handle (src/pool.c's `struct
// pthreadpool` holds one and nothing else): a table of two operations and the pool they act on.
// Every pthreadpool_parallelize_* call becomes one `run` over a flat range of items, so a pool is
// two functions, whoever implements them.

#ifndef XNNBLOB_POOL_H_
#define XNNBLOB_POOL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Runs items [begin, end) of `job` on the thread numbered `thread`.
typedef void (*xnnblob_pool_range_fn)(void* job, size_t thread, size_t begin, size_t end);

// What a pool does for XNNPACK.
struct xnnblob_pool_ops {
  // Threads one call is split across, the caller's included (>= 1).
  size_t (*threads)(void* pool);
  // Calls range(job, thread, begin, end) over sub-ranges covering [0, count) exactly once, with
  // `thread` below threads(pool) and distinct among the calls running at once; returns when all
  // have returned. `flags` are pthreadpool's (PTHREADPOOL_FLAG_*).
  void (*run)(void* pool, xnnblob_pool_range_fn range, void* job, size_t count, uint32_t flags);
};

// What a pthreadpool_t points to in xnnblob's builds.
struct xnnblob_pool_handle {
  const struct xnnblob_pool_ops* ops;
  void* pool;
};

// Puts the calling thread's floating-point state as `flags` ask for a job
// (PTHREADPOOL_FLAG_DISABLE_DENORMALS flushes denormals to zero), returning the state to restore.
uint64_t xnnblob_pool_enter(uint32_t flags);
// Restores what xnnblob_pool_enter returned.
void xnnblob_pool_leave(uint32_t flags, uint64_t saved);

#ifdef __cplusplus
}
#endif

#endif  // XNNBLOB_POOL_H_
