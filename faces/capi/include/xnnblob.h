/* xnnblob's C ABI (C99): the persistent packed-weight cache as XNNPACK's xnn_weights_cache_t,
 * and ExecuTorch named data (.ptd, .pte) read in place.
 *
 * The first launch packs and saves; later launches map the file and XNNPACK packs nothing.
 * Packed weights are found by what their unpacked bytes are (their SHA-256) and by everything
 * XNNPACK packs them with (its look-up seed: operator, shapes, tiling), never by address or name.
 * Use it with XNNPACK as built with xnnblob (the one libxnnblob carries, whose seeds hash every
 * packing parameter and whose look-ups state the size they read).
 *
 *   xnnblob_cache* cache;
 *   xnnblob_cache_open_file("weights.xbc", &cache);
 *   xnnblob_cache_register(cache, filter, filter_bytes, NULL);   // before defining the node
 *   xnn_create_runtime_v4(subgraph, xnnblob_cache_xnn(cache), NULL, NULL, 0, &runtime);
 *   xnnblob_cache_finalize(cache);                               // then set up and run
 *
 * Every call returns a status; after a failure, xnnblob_last_error() says what and where. Null
 * arguments are errors, not crashes. */
#ifndef XNNBLOB_H
#define XNNBLOB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum xnnblob_status {
  XNNBLOB_OK = 0,
  /* A pointer was null, a string not UTF-8, or an argument out of range. */
  XNNBLOB_INVALID_ARGUMENT = 1,
  /* A file could not be read or written. */
  XNNBLOB_IO = 2,
  /* A file's contents were rejected. */
  XNNBLOB_INVALID_FORMAT = 3,
  /* An internal error (a bug in xnnblob); the call did nothing it reported. */
  XNNBLOB_INTERNAL = 4,
  /* No entry has the key, or an index is past the last key. */
  XNNBLOB_NOT_FOUND = 5,
  /* XNNPACK refused a call (initialisation, a thread pool, a workspace). */
  XNNBLOB_XNNPACK = 6
} xnnblob_status;

/* The message of the last failed call on this thread ("" if none); valid until the next call on
 * this thread. */
const char* xnnblob_last_error(void);

typedef struct xnnblob_cache xnnblob_cache;

typedef struct xnnblob_cache_stats {
  uint64_t hits;         /* look-ups that found packed weights */
  uint64_t misses;       /* look-ups that found none (XNNPACK packed them next) */
  uint64_t packed;       /* weights XNNPACK packed in this process */
  uint64_t entries;      /* entries the cache holds (from its file and packed here) */
  uint64_t packed_bytes; /* total bytes of packed weights it holds */
} xnnblob_cache_stats;

/* The cache kept in the file at `path` (created by the first save); a file already open in this
 * process is shared. A stale, corrupt or foreign file is rebuilt, never trusted. */
xnnblob_status xnnblob_cache_open_file(const char* path, xnnblob_cache** out);

/* The cache kept in the file at `path`, under `layer_count` read-only layers: cache files, or
 * directories of them, made ahead of time for CPU classes (`xnnblob prepack`, CMake's
 * xnnblob_prepack), consulted first, in order. Only what no layer of this CPU's class holds is
 * packed, into `path`; layers are never written. A layer for another class, or not a cache, is
 * ignored, and said once on stderr. */
xnnblob_status xnnblob_cache_open_layered(const char* path, const char* const* layers,
                                          size_t layer_count, xnnblob_cache** out);

/* A cache in memory only, for this process. */
xnnblob_status xnnblob_cache_open_memory(xnnblob_cache** out);

/* The cache as XNNPACK's xnn_weights_cache_t (a `struct xnn_weights_cache_provider*`), for
 * xnn_create_runtime_v4; valid until xnnblob_cache_close. NULL for a NULL cache. */
void* xnnblob_cache_xnn(xnnblob_cache* cache);

/* Declares that the `size` bytes at `data`, about to be handed to XNNPACK as a filter or bias,
 * are the blob `sha256` (32 bytes, the SHA-256 of those bytes, as ExecuTorch keys them), or, with
 * `sha256` NULL, hashes them now. The bytes stay valid and unchanged until unregistered. The
 * same bytes packed in two shapes are told apart by XNNPACK's seed; layers whose filters share
 * bytes but differ in what XNNPACK packs from arrays its key does not name (a dynamically
 * quantized layer's bias, a static int8 layer's requantization scales) need 32 bytes of their
 * own here. An address holds one identity at a time: registering it again as other bytes fails
 * with XNNBLOB_INVALID_ARGUMENT until it is unregistered. */
xnnblob_status xnnblob_cache_register(xnnblob_cache* cache, const void* data, size_t size,
                                      const uint8_t* sha256);

/* Ends the registration of `data` (once the runtimes packing from it are created). */
xnnblob_status xnnblob_cache_unregister(xnnblob_cache* cache, const void* data);

/* After creating runtimes, before setting them up: enables setup and saves what was packed, in
 * the background. */
xnnblob_status xnnblob_cache_finalize(xnnblob_cache* cache);

/* Waits until the last save is durable on disk, and reports its error. */
xnnblob_status xnnblob_cache_wait_saved(xnnblob_cache* cache);

xnnblob_status xnnblob_cache_get_stats(const xnnblob_cache* cache, xnnblob_cache_stats* out);

/* How many of the cache's file maps found their file cut short in place (by another process)
 * so far, in `*out`. A read past the new end gives zeros instead of SIGBUS, so a runtime created
 * while fewer were lost may have computed garbage: call it after xnn_invoke_runtime, and if the
 * count grew, discard the outputs and create the runtimes again (they pack what was lost). */
xnnblob_status xnnblob_cache_lost_maps(const xnnblob_cache* cache, size_t* out);

/* Closes a handle (NULL is allowed); delete the runtimes created with it first. */
void xnnblob_cache_close(xnnblob_cache* cache);

/* ---- Named data: ExecuTorch .ptd and .pte files, mapped, validated, read without copies ---- */

typedef struct xnnblob_map xnnblob_map;
typedef struct xnnblob_buffer xnnblob_buffer;

typedef struct xnnblob_layout {
  int8_t scalar_type;    /* ExecuTorch's code: 6 float32, 5 float16, 1 int8, ... */
  uint32_t num_dims;     /* how many of sizes and dim_order are used */
  int32_t sizes[16];     /* outermost first */
  uint8_t dim_order[16]; /* memory order of the dimensions, outermost first */
} xnnblob_layout;

/* Opens a .ptd or .pte (told apart by its contents); nothing is copied. */
xnnblob_status xnnblob_map_open(const char* path, xnnblob_map** out);

xnnblob_status xnnblob_map_num_keys(const xnnblob_map* map, size_t* out);

/* The key at `index`, NUL-terminated, valid while the map is open. */
xnnblob_status xnnblob_map_key_at(const xnnblob_map* map, size_t index, const char** out);

/* `key`'s bytes in place in the mapped file; release the buffer when done (it keeps the file
 * mapped, even past xnnblob_map_close). */
xnnblob_status xnnblob_map_get_data(const xnnblob_map* map, const char* key, xnnblob_buffer** out);
const void* xnnblob_buffer_data(const xnnblob_buffer* buffer);
size_t xnnblob_buffer_size(const xnnblob_buffer* buffer);
void xnnblob_buffer_release(xnnblob_buffer* buffer);

/* Copies `key`'s bytes into `destination`, which holds exactly `size` bytes (the blob's size). */
xnnblob_status xnnblob_map_load_into(const xnnblob_map* map, const char* key, void* destination,
                                     size_t size);

/* The layout stored with `key`: *has_layout is 1 and *out filled, or 0 when it has none. */
xnnblob_status xnnblob_map_layout(const xnnblob_map* map, const char* key, xnnblob_layout* out,
                                  int32_t* has_layout);

/* Closes a map (NULL is allowed). */
void xnnblob_map_close(xnnblob_map* map);

/* ---- Thread pools: xnnblob's own, for runtimes a caller creates ---- */

/* XNNPACK in libxnnblob.a runs operators on xnnblob's pools (pthreadpool's API is served by
 * xnnblob; pthreadpool_create is not in the library). A pool of `threads` threads, the caller's
 * counted as one, never waits for a worker the scheduler is not running. */
typedef struct xnnblob_threadpool xnnblob_threadpool;

xnnblob_status xnnblob_threadpool_new(uint32_t threads, xnnblob_threadpool** out);

/* The pool as a pthreadpool_t for xnn_create_runtime_v4 (NULL for NULL); valid until the pool
 * is freed, after every runtime created with it. */
void* xnnblob_threadpool_pthreadpool(const xnnblob_threadpool* pool);

/* Stops and frees a pool (NULL is allowed). */
void xnnblob_threadpool_free(xnnblob_threadpool* pool);

/* ---- The backend: one per process or app, owning its caches ---- */

typedef struct xnnblob_backend xnnblob_backend;

/* A backend whose models split operators across `threads` threads (0 or 1: the calling thread);
 * initialises XNNPACK once per process. */
xnnblob_status xnnblob_backend_new(uint32_t threads, xnnblob_backend** out);

/* The backend's file cache at `path` (held open while the backend lives, shared by all it
 * loads), or with `path` NULL its in-memory cache; close the handle with xnnblob_cache_close. */
xnnblob_status xnnblob_backend_cache(const xnnblob_backend* backend, const char* path,
                                     xnnblob_cache** out);

/* Frees a backend (NULL is allowed); caches made through it may outlive it. */
void xnnblob_backend_free(xnnblob_backend* backend);

#ifdef __cplusplus
}
#endif

#endif /* XNNBLOB_H */
