/* xnnblob's C ABI for named data, from C (tests/integration/c_abi.rs): every key of a .ptd read in place
 * and by copy, with its layout. Built only for xnnblob's tests (test-hooks). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xnnblob.h"

/* A C program reading a .ptd through the C ABI: every key's bytes in place and by copy, and
 * each layout. Returns 0 and the key count and total bytes, or a negative step number. */
int xnnblob_c_map_check(const char* path, size_t* keys, size_t* bytes, size_t* with_layout) {
  xnnblob_map* map = NULL;
  if (xnnblob_map_open(path, &map) != XNNBLOB_OK) return -1;
  int result = 0;
  *bytes = 0;
  *with_layout = 0;
  if (xnnblob_map_num_keys(map, keys) != XNNBLOB_OK) { result = -2; goto done; }
  for (size_t i = 0; i < *keys; ++i) {
    const char* key = NULL;
    xnnblob_buffer* buffer = NULL;
    if (xnnblob_map_key_at(map, i, &key) != XNNBLOB_OK) { result = -3; goto done; }
    if (xnnblob_map_get_data(map, key, &buffer) != XNNBLOB_OK) { result = -4; goto done; }
    size_t size = xnnblob_buffer_size(buffer);
    unsigned char copy[1 << 16];
    if (size <= sizeof(copy)) {
      if (xnnblob_map_load_into(map, key, copy, size) != XNNBLOB_OK ||
          memcmp(copy, xnnblob_buffer_data(buffer), size) != 0) {
        xnnblob_buffer_release(buffer);
        result = -5;
        goto done;
      }
    }
    *bytes += size;
    xnnblob_buffer_release(buffer);
    xnnblob_layout layout;
    int32_t has_layout = 0;
    if (xnnblob_map_layout(map, key, &layout, &has_layout) != XNNBLOB_OK) { result = -6; goto done; }
    *with_layout += (size_t)has_layout;
  }
  {
    xnnblob_buffer* missing = NULL;
    if (xnnblob_map_get_data(map, "no such key", &missing) != XNNBLOB_NOT_FOUND) result = -7;
    const char* key = NULL;
    if (xnnblob_map_key_at(map, *keys, &key) != XNNBLOB_NOT_FOUND) result = -8;
  }
done:
  xnnblob_map_close(map);
  return result;
}
