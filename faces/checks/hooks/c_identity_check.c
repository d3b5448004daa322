/* xnnblob's C ABI with raw XNNPACK, from C (tests/faces/c_abi.rs): one buffer registered once, by
 * its bytes, and packed as a [64, 128] and a [128, 64] filter, the same bytes in transposed
 * shapes. XNNPACK's look-up seed (every packing parameter, hashed: patch 0006) tells the two
 * apart, so each layer computes with its own packing, cold and warm. Registering the registered
 * buffer again as other bytes is refused. Built only for xnnblob's tests. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <xnnpack.h>

#include "xnnblob.h"

#define N 64
#define K 128

/* The weights, with room after them for XNNPACK's over-read. */
static float weights[N * K + 16];

/* One layer y[1, outputs] = x[1, inputs] . W^T, W being `weights` read as [outputs, inputs],
 * through `cache`. Returns 0 or a negative step number. */
static int layer(xnnblob_cache* cache, size_t outputs, size_t inputs, const float* x, float* y) {
  xnn_subgraph_t subgraph = NULL;
  xnn_runtime_t runtime = NULL;
  int result = 0;
  uint32_t x_id, w_id, y_id;
  const size_t x_dims[2] = {1, inputs}, w_dims[2] = {outputs, inputs}, y_dims[2] = {1, outputs};
  if (xnn_create_subgraph(2, 0, &subgraph) != xnn_status_success) return -20;
  if (xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, x_dims, NULL, 0,
                              XNN_VALUE_FLAG_EXTERNAL_INPUT, &x_id) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, y_dims, NULL, 1,
                              XNN_VALUE_FLAG_EXTERNAL_OUTPUT, &y_id) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, w_dims, weights,
                              XNN_INVALID_VALUE_ID, 0, &w_id) != xnn_status_success ||
      xnn_define_fully_connected(subgraph, -INFINITY, INFINITY, x_id, w_id, XNN_INVALID_VALUE_ID,
                                 y_id, 0) != xnn_status_success) {
    result = -21;
    goto done;
  }
  if (xnn_create_runtime_v4(subgraph, (xnn_weights_cache_t)xnnblob_cache_xnn(cache), NULL, NULL,
                            0, &runtime) != xnn_status_success) {
    result = -22;
    goto done;
  }
  if (xnnblob_cache_finalize(cache) != XNNBLOB_OK) { result = -23; goto done; }
  const struct xnn_external_value values[2] = {{0, (void*)x}, {1, y}};
  if (xnn_reshape_runtime(runtime) != xnn_status_success ||
      xnn_setup_runtime_v2(runtime, 2, values) != xnn_status_success ||
      xnn_invoke_runtime(runtime) != xnn_status_success) {
    result = -24;
  }
done:
  if (runtime) xnn_delete_runtime(runtime);
  if (subgraph) xnn_delete_subgraph(subgraph);
  return result;
}

/* The largest difference of `y` from `weights` read as [outputs, inputs] times `x`. */
static float worst(size_t outputs, size_t inputs, const float* x, const float* y) {
  float most = 0.0f;
  for (size_t o = 0; o < outputs; ++o) {
    float sum = 0.0f;
    for (size_t i = 0; i < inputs; ++i) sum += weights[o * inputs + i] * x[i];
    float d = fabsf(sum - y[o]);
    if (!(d <= most)) most = d;
  }
  return most;
}

/* Runs both layers with the cache at `path`; `*error` is the worst difference from plain C, and
 * `*stats` the cache's counters. Returns 0 or a negative step number. */
int xnnblob_c_identity_check(const char* path, float* error, xnnblob_cache_stats* stats) {
  for (size_t i = 0; i < N * K; ++i) weights[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  if (xnn_initialize(NULL) != xnn_status_success) return -1;
  xnnblob_cache* cache = NULL;
  if (xnnblob_cache_open_file(path, &cache) != XNNBLOB_OK) return -2;
  int result = 0;
  /* By its bytes alone, as a C caller knows it. */
  if (xnnblob_cache_register(cache, weights, sizeof(float) * N * K, NULL) != XNNBLOB_OK) {
    result = -3;
    goto done;
  }
  {
    uint8_t other[32];
    memset(other, 0xAB, sizeof(other));
    if (xnnblob_cache_register(cache, weights, sizeof(float) * N * K, other) !=
        XNNBLOB_INVALID_ARGUMENT) {
      result = -4;
      goto unregister;
    }
  }
  float x[K], y[N], z[K];
  for (size_t i = 0; i < K; ++i) x[i] = sinf((float)i * 0.37f);
  if ((result = layer(cache, N, K, x, y)) != 0) goto unregister;
  if ((result = layer(cache, K, N, y, z)) != 0) goto unregister;
  {
    float a = worst(N, K, x, y), b = worst(K, N, y, z);
    *error = a > b ? a : b;
  }
  if (xnnblob_cache_wait_saved(cache) != XNNBLOB_OK) { result = -5; goto unregister; }
  if (xnnblob_cache_get_stats(cache, stats) != XNNBLOB_OK) result = -6;
unregister:
  xnnblob_cache_unregister(cache, weights);
done:
  xnnblob_cache_close(cache);
  return result;
}
