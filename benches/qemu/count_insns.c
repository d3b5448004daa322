// A TCG plugin for qemu-user that counts the guest instructions a process executes, for
// comparing what two builds do on a CPU this machine can only emulate (qemu is no timer; its
// instruction counts are exact and repeatable for one binary, input and thread count).
//
// At exit it prints one line to qemu's log (stderr unless -D is given):
//   xnnblob-insns: <count>
// With the argument top=N (`-plugin count_insns.so,top=N`) it also prints the N translation
// blocks that executed the most instructions, by guest address, to find the code a count goes
// to (`-strace` shows where each library was mapped):
//   xnnblob-block: <address> <instructions>
// Counting is inline (an add per executed translation block). The top=N counts go through a
// callback per executed block: slower, and only asked for to find where a count goes.
//
// Two plugin ABIs, chosen when compiling (qemu checks `qemu_plugin_version` before calling
// `qemu_plugin_install`, and no version is accepted by both):
// - qemu 7.2 (Debian bookworm's qemu-user; the default): version 1, one counter for every vCPU,
//   exact for a single-threaded guest and a little low for a multi-threaded one (racing adds),
//   so counts are taken with one thread;
// - qemu 9.0 and later (-DXNNBLOB_QEMU_SCOREBOARD): version 2, a counter per vCPU summed at
//   exit.
// The declarations are stated here rather than included (qemu-plugin.h is not packaged by
// Debian): only what this plugin calls, each as that qemu's header declares it.

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS = 0 };

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
                                           void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb*));
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb* tb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb* tb,
                                          void (*cb)(unsigned int vcpu_index, void* userdata),
                                          enum qemu_plugin_cb_flags flags, void* userdata);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, void*),
                                    void* userdata);
void qemu_plugin_outs(const char* string);

#define EXPORT __attribute__((visibility("default")))

#ifdef XNNBLOB_QEMU_SCOREBOARD
struct qemu_plugin_scoreboard;
typedef struct {
  struct qemu_plugin_scoreboard* score;
  size_t offset;
} qemu_plugin_u64;
struct qemu_plugin_scoreboard* qemu_plugin_scoreboard_new(size_t element_size);
void qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(struct qemu_plugin_tb* tb,
                                                       enum qemu_plugin_op op,
                                                       qemu_plugin_u64 entry, uint64_t imm);
uint64_t qemu_plugin_u64_sum(qemu_plugin_u64 entry);

EXPORT int qemu_plugin_version = 2;

static qemu_plugin_u64 executed;

static int start_counting(void) {
  executed.score = qemu_plugin_scoreboard_new(sizeof(uint64_t));
  executed.offset = 0;
  return executed.score == NULL ? -1 : 0;
}

static void count_block(struct qemu_plugin_tb* tb, uint64_t n) {
  qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, executed, n);
}

static uint64_t executed_total(void) { return qemu_plugin_u64_sum(executed); }
#else
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb* tb, enum qemu_plugin_op op,
                                              void* ptr, uint64_t imm);

EXPORT int qemu_plugin_version = 1;

static uint64_t executed;

static int start_counting(void) { return 0; }

static void count_block(struct qemu_plugin_tb* tb, uint64_t n) {
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &executed, n);
}

static uint64_t executed_total(void) { return executed; }
#endif

// One translation of a block, for top=N: its address and the instructions it executed.
struct block {
  uint64_t address;
  uint64_t length;
  uint64_t instructions;
};

static size_t top;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block** blocks;
static size_t blocks_len, blocks_cap;

static void on_block_executed(unsigned int vcpu_index, void* userdata) {
  (void)vcpu_index;
  struct block* b = userdata;
  __atomic_fetch_add(&b->instructions, b->length, __ATOMIC_RELAXED);
}

// Each block, when translated, gets an add of its length to the counter on every execution
// (and, for top=N, a callback adding it to its own).
static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  const size_t n = qemu_plugin_tb_n_insns(tb);
  count_block(tb, n);
  if (top == 0) {
    return;
  }
  struct block* b = calloc(1, sizeof *b);
  if (b == NULL) {
    return;
  }
  b->address = qemu_plugin_tb_vaddr(tb);
  b->length = n;
  pthread_mutex_lock(&blocks_lock);
  if (blocks_len == blocks_cap) {
    const size_t cap = blocks_cap ? 2 * blocks_cap : 4096;
    struct block** grown = realloc(blocks, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&blocks_lock);
      free(b);
      return;
    }
    blocks = grown;
    blocks_cap = cap;
  }
  blocks[blocks_len++] = b;
  pthread_mutex_unlock(&blocks_lock);
  qemu_plugin_register_vcpu_tb_exec_cb(tb, on_block_executed, QEMU_PLUGIN_CB_NO_REGS, b);
}

static int by_address(const void* a, const void* b) {
  const struct block* x = *(struct block* const*)a;
  const struct block* y = *(struct block* const*)b;
  return (x->address > y->address) - (x->address < y->address);
}

static int by_instructions_descending(const void* a, const void* b) {
  const struct block* x = *(struct block* const*)a;
  const struct block* y = *(struct block* const*)b;
  return (x->instructions < y->instructions) - (x->instructions > y->instructions);
}

static void at_exit(qemu_plugin_id_t id, void* userdata) {
  (void)id;
  (void)userdata;
  char line[96];
  snprintf(line, sizeof line, "xnnblob-insns: %" PRIu64 "\n", executed_total());
  qemu_plugin_outs(line);
  if (top == 0 || blocks_len == 0) {
    return;
  }
  // A block translated more than once is one block: its translations are merged.
  qsort(blocks, blocks_len, sizeof *blocks, by_address);
  size_t merged = 0;
  for (size_t i = 0; i < blocks_len; i++) {
    if (merged > 0 && blocks[merged - 1]->address == blocks[i]->address) {
      blocks[merged - 1]->instructions += blocks[i]->instructions;
    } else {
      blocks[merged++] = blocks[i];
    }
  }
  qsort(blocks, merged, sizeof *blocks, by_instructions_descending);
  for (size_t i = 0; i < merged && i < top; i++) {
    snprintf(line, sizeof line, "xnnblob-block: 0x%" PRIx64 " %" PRIu64 "\n", blocks[i]->address,
             blocks[i]->instructions);
    qemu_plugin_outs(line);
  }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc,
                               char** argv) {
  (void)info;
  for (int i = 0; i < argc; i++) {
    if (strncmp(argv[i], "top=", 4) == 0) {
      top = strtoul(argv[i] + 4, NULL, 10);
    }
  }
  if (start_counting() != 0) {
    return -1;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, at_exit, NULL);
  return 0;
}
