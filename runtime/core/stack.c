/* Call stacks (--call-stack). libunwind is loaded only when stacks are asked for, so a
 * plain recording never pulls it into the program. Stacks are deduplicated per thread
 * through a small cache and written once to stacks.bin. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime.h"

static struct locus_stream stacks;
static _Atomic uint32_t next_id;
static int (*unw_backtrace_fn)(void **, int);

#define CACHE 64
/* Per thread, mapped at its first stack (only --call-stack runs take any), not in
 * thread-local storage, which every thread of every program carries. */
struct tstacks {
  uint64_t hash[CACHE];
  uint32_t id[CACHE];
  struct locus_cursor cur;
};
static LOCUS_TLS struct tstacks *tsp;

static struct tstacks *tstacks_of_thread(void) {
  if (!tsp) {
    void *p = (void *)syscall(SYS_mmap, NULL, sizeof *tsp, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    tsp = p == MAP_FAILED ? NULL : p;
  }
  return tsp;
}

/* At the thread's end: its chunk's unused tail back to the file, its cache unmapped.
 * Cleared first: a stack captured after this (another key's destructor) maps a new one. */
void locus_stack_thread_fini(void) {
  struct tstacks *t = tsp;
  tsp = NULL;
  if (!t) return;
  locus_cursor_finish(&stacks, &t->cur);
  syscall(SYS_munmap, t, sizeof *t);
}

void locus_stack_open(void) {
  if (!locus_cfg.call_stack) return;
  if (!unw_backtrace_fn) {
    void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    if (h) unw_backtrace_fn = (int (*)(void **, int))dlsym(h, "unw_backtrace");
    if (!unw_backtrace_fn) {
      locus_warn(
          "--call-stack: libunwind.so.8 not found (apt-get install libunwind8); "
          "recording call sites only");
      return;
    }
  }
  atomic_store(&next_id, 0);
  locus_stream_open(&stacks, locus_proc_dirfd, "stacks.bin");
}

void locus_stack_after_fork(void) {
  /* The forking thread's cache and cursor were the parent's (its chunk, its file). */
  if (tsp) memset(tsp, 0, sizeof *tsp);
  locus_stream_reset_after_fork(&stacks);
  locus_stack_open();
}

uint32_t locus_stack_capture(uint64_t site) {
  if (!unw_backtrace_fn || stacks.fd < 0) return 0;
  void *pcs[LOCUS_STACK_DEPTH + 3];
  int n = unw_backtrace_fn(pcs, LOCUS_STACK_DEPTH + 3);
  /* Drop the runtime's own frames: the stack starts at the interposed call's return
   * address (how many frames the runtime adds depends on inlining). */
  int skip = 0;
  while (skip < n && (uint64_t)(uintptr_t)pcs[skip] != site) skip++;
  if (skip == n) skip = n > 2 ? 2 : n;
  struct locus_stack st;
  memset(&st, 0, sizeof st);
  st.depth = (uint32_t)(n - skip);
  uint64_t h = 1469598103934665603ull;
  for (uint32_t i = 0; i < st.depth; i++) {
    st.pc[i] = (uint64_t)(uintptr_t)pcs[skip + i];
    h = (h ^ st.pc[i]) * 1099511628211ull;
  }
  uint32_t k = (uint32_t)(h % CACHE);
  struct tstacks *ts = tstacks_of_thread();
  if (!ts) return 0;
  if (ts->hash[k] == h && ts->id[k]) return ts->id[k];
  st.id = atomic_fetch_add(&next_id, 1) + 1;
  /* The id is the record's first field but a whole-record write is what readers check:
   * depth > 0 marks a used record. */
  if (locus_cursor_put(&stacks, &ts->cur, &st, sizeof st) != 0) return 0;
  ts->hash[k] = h;
  ts->id[k] = st.id;
  return st.id;
}
