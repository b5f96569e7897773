/* Allocation records of the comm lens (allocs.bin): the logic behind intercept/alloc.c.
 *
 * Cost, measured with tests/test_allocs.c on the development VM (see the numbers in the
 * report of that test): with the comm lens off an interposed call is one load, one
 * predictable branch and a tail call into the real allocator. With it on, every malloc,
 * calloc, realloc, free, aligned allocation, anonymous mmap and munmap writes one 64-byte
 * record (a TSC read and a store into a thread-local chunk of the mapped file, no lock,
 * no system call except one chunk claim per 256 records, per 16384 in a thread allocating
 * fast: core/stream.c); with --call-stack each
 * allocation also unwinds its stack (microseconds). A program doing N allocations and N
 * frees writes 128*N bytes: 1e6 pairs are 128 MB. Every block is tracked, whatever its
 * size, because small objects are exactly where false sharing hides.
 *
 * munmap cannot tell an anonymous mapping from a file one, so MUNMAP records may name
 * ranges that were never MMAP records (the reader matches them against MMAP records). */
#define _GNU_SOURCE
#include "allocs.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "../core/runtime.h"

static struct locus_stream stream;
static pid_t stream_pid; /* process that opened `stream`; 0 = not open */
static atomic_flag open_lock = ATOMIC_FLAG_INIT;
static pthread_key_t end_key;
static int end_key_ok, atfork_done;

static LOCUS_TLS struct {
  struct locus_cursor cur;
  int closed; /* the thread ended: its cursor is gone, record nothing more */
} at;

static int put(uint16_t kind, const void *addr, size_t size, uint64_t site, uint32_t stack) {
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.t = locus_ticks();
  r.addr = (uint64_t)(uintptr_t)addr;
  r.size = size;
  r.site = site;
  r.tid = locus_me.tid;
  r.stack = stack;
  r.kind = kind;
  int rc = locus_cursor_put(&stream, &at.cur, &r, sizeof r);
  if (rc == 0)
    locus_me.records++;
  else
    locus_me.dropped++;
  return rc;
}

void locus_allocs_record(uint16_t kind, const void *addr, size_t size, uint64_t site) {
  struct locus_self *me = &locus_me;
  /* Unregistered threads are skipped rather than adopted here: a new thread frees its
   * start-up block before pthread_create's trampoline registers it. */
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  uint32_t stack = locus_cfg.call_stack ? locus_stack_capture(site) : 0;
  put(kind, addr, size, site, stack);
  me->guard--;
  errno = saved;
}

static void on_thread_end(void *arg) {
  (void)arg;
  locus_me.guard++;
  locus_cursor_close(&at.cur);
  at.closed = 1;
  locus_me.guard--;
}

/* In a fork child the thread's cursor maps a chunk of the parent's file: stop recording
 * at once (this handler was registered before proc.c's, so it runs first), until the
 * child's own thread_init reopens allocs.bin in the child's directory. */
static void child_after_fork(void) {
  __atomic_fetch_and(&locus_alloc_state, ~LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
  locus_me.guard++;
  locus_cursor_close(&at.cur);
  locus_me.guard--;
  stream_pid = 0;
  locus_stream_reset_after_fork(&stream);
  atomic_flag_clear(&open_lock);
}

static void open_stream(void) {
  pid_t pid = getpid();
  while (atomic_flag_test_and_set_explicit(&open_lock, memory_order_acquire)) {
  }
  if (stream_pid != pid) {
    if (locus_stream_open(&stream, locus_proc_dirfd, "allocs.bin") == 0) {
      stream_pid = pid;
      if (!end_key_ok) end_key_ok = pthread_key_create(&end_key, on_thread_end) == 0;
      if (!atfork_done) atfork_done = pthread_atfork(NULL, NULL, child_after_fork) == 0;
      __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
    } else {
      locus_warn("comm: cannot create allocs.bin; objects will not be named");
    }
  }
  atomic_flag_clear_explicit(&open_lock, memory_order_release);
}

/* The thread's stack as an object, so accesses to stack variables are named as such. */
static void put_stack_range(void) {
  uintptr_t lo, hi;
  if (locus_thread_stack(&lo, &hi) == 0) put(LOCUS_AL_STACK, (void *)lo, hi - lo, 0, 0);
}

void locus_allocs_thread_init(void) {
  locus_me.guard++;
  if (stream_pid != getpid()) open_stream();
  if (stream_pid) {
    at.closed = 0;
    if (end_key_ok && locus_me.tid != (uint32_t)getpid()) pthread_setspecific(end_key, &at);
    put_stack_range();
  }
  locus_me.guard--;
}
