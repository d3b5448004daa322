// ExecuTorch's own thread pool as the pool XNNPACK runs on, so that xnnblob's backend runs
// operators on the threads ExecuTorch's backend would: the pool of
// executorch::extension::threadpool::get_pthreadpool(), at its current size (an app's
// _unsafe_reset_threadpool is seen by the next call), and on the calling thread alone under a
// NoThreadPoolGuard, when that function returns null.
//
// XNNPACK inside this library calls pthreadpool's API, which xnnpack-sys's pool.c serves; pool.c
// hands each call here as one flat range. The range is run by ExecuTorch's own pthreadpool,
// called through the functions its library exports: this library's pthreadpool symbols are
// pool.c's, so they are looked up in the library that defines get_pthreadpool (or, for an app
// that links ExecuTorch statically, in the program's global scope).

#include <dlfcn.h>
#include <executorch/extension/threadpool/threadpool_guard.h>

#include <xnnblob_pool.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

struct pthreadpool;

namespace executorch::extension::threadpool {
pthreadpool* get_pthreadpool();
}


namespace {

// Operators split across ExecuTorch's pool, and run on the calling thread because there was
// none (for the runner's report and the tests).
std::atomic<uint64_t> runs_on_pool{0};
std::atomic<uint64_t> runs_inline{0};

void run_inline(xnnblob_pool_range_fn range, void* job, size_t count, uint32_t flags) {
  runs_inline.fetch_add(1, std::memory_order_relaxed);
  const uint64_t saved = xnnblob_pool_enter(flags);
  range(job, 0, 0, count);
  xnnblob_pool_leave(flags, saved);
}

#if defined(ET_USE_THREADPOOL)

using ThreadsCount = size_t (*)(pthreadpool*);
using ItemWithThread = void (*)(void* context, size_t thread, size_t item);
using Parallelize1dWithThread = void (*)(pthreadpool*, ItemWithThread, void*, size_t, uint32_t);

struct EtPthreadpool {
  ThreadsCount threads_count = nullptr;
  Parallelize1dWithThread parallelize_1d_with_thread = nullptr;
};

const EtPthreadpool& et_pthreadpool() {
  static const EtPthreadpool found = [] {
    EtPthreadpool calls;
    Dl_info info{};
    void* library = nullptr;
    if (dladdr(reinterpret_cast<void*>(&executorch::extension::threadpool::get_pthreadpool),
               &info) != 0 &&
        info.dli_fname != nullptr) {
      library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    if (library == nullptr) library = dlopen(nullptr, RTLD_NOW);
    if (library == nullptr) return calls;
    calls.threads_count =
        reinterpret_cast<ThreadsCount>(dlsym(library, "pthreadpool_get_threads_count"));
    calls.parallelize_1d_with_thread = reinterpret_cast<Parallelize1dWithThread>(
        dlsym(library, "pthreadpool_parallelize_1d_with_thread"));
    if (calls.threads_count == nullptr || calls.parallelize_1d_with_thread == nullptr) {
      calls = EtPthreadpool{};
    }
    return calls;
  }();
  return found;
}

// ExecuTorch's pool now, or null: none in this runtime, or a NoThreadPoolGuard on this thread.
pthreadpool* current_pool() {
  if (et_pthreadpool().parallelize_1d_with_thread == nullptr) return nullptr;
  return executorch::extension::threadpool::get_pthreadpool();
}

// Items are handed to ExecuTorch's pool in chunks, a few per thread as xnnblob's own pool hands
// them out: one call of the pool's per item (an operator's tiles: 400 of them per execute of a
// small int8 ResNet) cost each item a dispatch and the position of its tile worked out from the
// start, where a chunk's items are stepped through.
constexpr size_t kChunksPerThread = 4;

struct Range {
  xnnblob_pool_range_fn range;
  void* job;
  size_t count;
  size_t chunks;
};

void run_chunk(void* context, size_t thread, size_t chunk) {
  const Range* r = static_cast<const Range*>(context);
  // Chunk c holds items [c * count / chunks, (c + 1) * count / chunks): every item once, the
  // chunks' sizes differing by one at most. `chunks` is at most the pool's threads times
  // kChunksPerThread, so the products stay far from overflowing.
  const size_t begin = chunk * r->count / r->chunks;
  const size_t end = (chunk + 1) * r->count / r->chunks;
  r->range(r->job, thread, begin, end);
}

size_t et_threads(void*) {
  pthreadpool* pool = current_pool();
  if (pool == nullptr) return 1;
  const size_t n = et_pthreadpool().threads_count(pool);
  return n == 0 ? 1 : n;
}

void et_run(void*, xnnblob_pool_range_fn range, void* job, size_t count, uint32_t flags) {
  pthreadpool* pool = current_pool();
  if (pool == nullptr) {
    run_inline(range, job, count, flags);
    return;
  }
  runs_on_pool.fetch_add(1, std::memory_order_relaxed);
  const size_t threads = et_pthreadpool().threads_count(pool);
  const size_t most = (threads == 0 ? 1 : threads) * kChunksPerThread;
  Range r{range, job, count, count < most ? count : most};
  et_pthreadpool().parallelize_1d_with_thread(pool, run_chunk, &r, r.chunks, flags);
}

#else  // An ExecuTorch runtime without its thread pool: everything on the calling thread.

pthreadpool* current_pool() { return nullptr; }

size_t et_threads(void*) { return 1; }

void et_run(void*, xnnblob_pool_range_fn range, void* job, size_t count, uint32_t flags) {
  run_inline(range, job, count, flags);
}

#endif

const xnnblob_pool_ops et_ops = {et_threads, et_run};

}  // namespace

extern "C" {

// The operations of ExecuTorch's pool, for xnnblob::xnn::Threadpool::with_ops.
__attribute__((visibility("hidden"))) const xnnblob_pool_ops* xnnblob_et_pool_ops() {
  return &et_ops;
}

// Whether a runtime created now should run on ExecuTorch's pool: false under a
// NoThreadPoolGuard (ExecuTorch's backend then creates its runtime without one) or without a pool.
// Asked without creating the pool (get_pthreadpool's first call starts its threads): a delegate
// that runs on the calling thread never needs it, and the first call that does creates it.
__attribute__((visibility("hidden"))) bool xnnblob_et_pool_in_use() {
#if defined(ET_USE_THREADPOOL)
  return et_pthreadpool().parallelize_1d_with_thread != nullptr &&
         !executorch::extension::threadpool::NoThreadPoolGuard::is_enabled();
#else
  return false;
#endif
}

// Looks up the functions of ExecuTorch's pool (a dlopen and two dlsym), on the thread that
// prepares the backend when the library is loaded, so that a load finds them ready. The pool
// itself is not started here: as with ExecuTorch's backend, a load under a NoThreadPoolGuard,
// or no load at all, starts no thread.
__attribute__((visibility("hidden"))) void xnnblob_et_pool_look_up() {
#if defined(ET_USE_THREADPOOL)
  (void)et_pthreadpool();
#endif
}

// Operator calls run on ExecuTorch's pool so far, and on the calling thread for want of one
// (a runtime created under a NoThreadPoolGuard has no pool at all: its calls are in neither).
__attribute__((visibility("hidden"))) void xnnblob_et_pool_runs(uint64_t* on_pool,
                                                               uint64_t* on_caller) {
  *on_pool = runs_on_pool.load(std::memory_order_relaxed);
  *on_caller = runs_inline.load(std::memory_order_relaxed);
}
}
