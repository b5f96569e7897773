/* Thread registry. Each thread gets a slot in threads.bin (MAP_SHARED, so slots survive
 * SIGKILL; mapped a chunk of CHUNK_SLOTS at a time, so that a program of a few threads does
 * not carry 64 MiB of address space for the million it could have) the first time the runtime sees
 * it: at the start of a thread created through pthread_create, or at its first interposed call for
 * threads that existed before start-up ("adopted"). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime.h"

#define MAX_SLOTS (1u << 20)
#define SLOT_GROW 1024u
#define SLOT_FIRST 64u         /* the file's first reservation: 4 KiB, doubled up to SLOT_GROW */
#define CHUNK_SLOTS (1u << 14) /* 1 MiB of slots per mapping */
#define CHUNKS (MAX_SLOTS / CHUNK_SLOTS)

LOCUS_TLS struct locus_self locus_me;

static struct locus_thread *_Atomic chunks[CHUNKS];
static int slots_fd = -1;
static int slots_ok; /* threads.bin is open */
static _Atomic uint32_t slots_used;

/* Threads registered and not finished. When a thread's end leaves one, the program's
 * parallel part is over, which is where many programs reach their peak resident memory (a
 * report, results gathered): the record files' spare pages that the ended threads left
 * mapped (a page per thread and stream, ~12 for sysbench's 4 threads) are dropped from it.
 * At most every SHED_MS: a program that starts and joins one thread at a time. */
static _Atomic uint32_t live_threads;
static _Atomic uint64_t shed_at;
#define SHED_MS 100

static void shed(void) {
  uint64_t now = locus_ticks(), last = atomic_load(&shed_at);
  if (now - last < (uint64_t)(SHED_MS * 1000 * locus_ticks_per_us) ||
      !atomic_compare_exchange_strong(&shed_at, &last, now))
    return;
  locus_streams_shed();
}

static _Atomic uint32_t slots_size;
static atomic_flag slots_lock;
static pthread_key_t exit_key;
static int exit_key_ok;

static void on_thread_exit(void *arg);

static uint32_t gettid_raw(void) { return (uint32_t)syscall(SYS_gettid); }

void locus_threads_open(void) {
  slots_fd = locus_fd_keep(
      openat(locus_proc_dirfd, "threads.bin", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  atomic_store(&slots_used, 0);
  atomic_store(&slots_size, 0);
  atomic_flag_clear(&slots_lock);
  slots_ok = slots_fd >= 0;
  if (!slots_ok) return;
  if (!exit_key_ok) exit_key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

/* Map the chunks of slots [from, i] (slots_lock held): slots below the size in use are
 * read without the lock, so every chunk up to the new size is mapped before it grows. */
static int map_chunks(uint32_t from, uint32_t i) {
  size_t len = (size_t)CHUNK_SLOTS * sizeof(struct locus_thread);
  for (uint32_t k = from / CHUNK_SLOTS; k <= i / CHUNK_SLOTS; k++) {
    if (atomic_load(&chunks[k])) continue;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, slots_fd,
                   (off_t)((uint64_t)k * len));
    if (p == MAP_FAILED) return -1;
    atomic_store(&chunks[k], (struct locus_thread *)p);
  }
  return 0;
}

static struct locus_thread *claim_slot(void) {
  if (!slots_ok) return NULL;
  uint32_t i = atomic_fetch_add(&slots_used, 1);
  if (i >= MAX_SLOTS) return NULL;
  if (i >= atomic_load(&slots_size)) {
    while (atomic_flag_test_and_set(&slots_lock)) {
    }
    uint32_t size = atomic_load(&slots_size);
    /* Not a file the program opened over our closed descriptor's number. */
    if (i >= size && locus_fd_is_record(slots_fd, "threads.bin") != 0 && map_chunks(size, i) == 0) {
      /* 64 slots first, doubled up to SLOT_GROW, then SLOT_GROW at a time (within the
       * chunk): a process of a few threads reserves 4 KiB, not 64 (a run of stress-ng
       * --fork, 2832 processes, held 181 MB of empty slots). */
      uint32_t to = size ? size : SLOT_FIRST;
      while (to <= i) to = to < SLOT_GROW ? 2 * to : (to / SLOT_GROW + 1) * SLOT_GROW;
      if (locus_file_reserve(slots_fd, (uint64_t)size * sizeof(struct locus_thread),
                             (uint64_t)to * sizeof(struct locus_thread)) == 0)
        atomic_store(&slots_size, to);
    }
    atomic_flag_clear(&slots_lock);
    if (i >= atomic_load(&slots_size)) return NULL;
  }
  struct locus_thread *s = &atomic_load(&chunks[i / CHUNK_SLOTS])[i % CHUNK_SLOTS];
  s->serial = i + 1;
  return s;
}

uint32_t locus_thread_count(void) { return atomic_load(&slots_used); }

/* "7ffd1000-7ffd2000 ...": the two hex numbers at the start of a maps line. */
static int maps_range(const char *l, uintptr_t *lo, uintptr_t *hi) {
  uintptr_t v[2] = {0, 0};
  for (int k = 0; k < 2; k++, l++) {
    int n = 0;
    for (;; l++, n++) {
      int c = *l, d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) break;
      v[k] = v[k] << 4 | (uintptr_t)d;
    }
    if (!n || *l != (k ? ' ' : '-')) return -1;
  }
  *lo = v[0];
  *hi = v[1];
  return 0;
}

/* The main thread's stack as glibc's pthread_getattr_np gives it (the [stack] mapping's
 * end, down by RLIMIT_STACK, not below the mapping before it), read with open/read: glibc
 * reads /proc/self/maps through stdio (fopen, sscanf), ~100 KiB of libc code the program
 * may never touch, all counted in its RSS. */
static int main_stack(uintptr_t *lo, uintptr_t *hi) {
  int fd = (int)syscall(SYS_open, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1024], line[512]; /* small: stack pages the start-up touches stay resident */
  size_t ln = 0;
  uintptr_t prev_end = 0, a, b;
  int found = 0;
  long n;
  while (!found && (n = (long)syscall(SYS_read, fd, buf, sizeof buf)) > 0) {
    for (long i = 0; i < n && !found; i++) {
      if (buf[i] != '\n') {
        if (ln < sizeof line - 1) line[ln++] = buf[i];
        continue;
      }
      line[ln] = 0;
      ln = 0;
      if (maps_range(line, &a, &b) != 0) continue;
      if (strstr(line, "[stack]")) {
        found = 1;
        break;
      }
      prev_end = b;
    }
  }
  syscall(SYS_close, fd);
  if (!found) return -1;
  struct rlimit rl;
  uintptr_t size = 32u << 20; /* glibc's default for an unlimited stack */
  if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) size = rl.rlim_cur;
  *hi = b;
  *lo = size < b - prev_end ? b - size : prev_end;
  return 0;
}

int locus_thread_stack(uintptr_t *lo, uintptr_t *hi) {
  uint32_t pid = (uint32_t)syscall(SYS_getpid);
  if (locus_me.tid && locus_me.tid == pid) {
    /* Read once per process (three lenses ask at the main thread's start). The thread
     * whose tid is the pid runs on [stack], except in a child forked from another thread:
     * it runs on its pthread stack, which pthread_getattr_np knows without stdio. */
    static uint32_t cached_pid;
    static uintptr_t main_lo, main_hi;
    if (cached_pid != pid && main_stack(&main_lo, &main_hi) == 0) cached_pid = pid;
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (cached_pid == pid && here >= main_lo && here < main_hi) {
      *lo = main_lo;
      *hi = main_hi;
      return 0;
    }
  }
  if (locus_me.stack_hi) {
    *lo = locus_me.stack_lo;
    *hi = locus_me.stack_hi;
    return 0;
  }
  pthread_attr_t at;
  if (pthread_getattr_np(pthread_self(), &at) != 0) return -1;
  void *p;
  size_t sz;
  int rc = pthread_attr_getstack(&at, &p, &sz);
  pthread_attr_destroy(&at);
  if (rc != 0 || !sz) return -1;
  *lo = (uintptr_t)p;
  *hi = (uintptr_t)p + sz;
  return 0;
}

/* A slot taken by pthread_create before the thread exists, so that serials (and the
 * reports' thread indices) follow creation order, not the order in which new threads
 * happen to run first. A slot whose thread never starts keeps tid 0 and is not read. */
struct locus_thread *locus_thread_reserve(void) {
  return locus_enabled ? claim_slot() : NULL;
}

static void register_self(uint32_t parent_tid, uint64_t start_routine, uint32_t flags,
                          struct locus_thread *reserved) {
  struct locus_self *me = &locus_me;
  int guard = me->guard;
  uintptr_t stack_lo = me->stack_lo, stack_hi = me->stack_hi; /* the trampoline's */
  memset(me, 0, sizeof *me);
  me->guard = guard;
  me->stack_lo = stack_lo;
  me->stack_hi = stack_hi;
  me->tid = gettid_raw();
  me->state = 1;
  atomic_fetch_add(&live_threads, 1);
  struct locus_thread *s = reserved ? reserved : claim_slot();
  me->slot = s;
  me->serial = s ? s->serial : 0;
  if (me->tid == (uint32_t)getpid()) flags |= LOCUS_THREAD_MAIN;
  if (s) {
    s->tid = me->tid;
    s->parent_tid = parent_tid;
    s->start_routine = start_routine;
    s->start = locus_ticks();
    s->flags = flags;
  }
  /* A key value only so that its destructor runs at thread exit (return or pthread_exit). */
  if (exit_key_ok && !(flags & LOCUS_THREAD_MAIN)) pthread_setspecific(exit_key, me);
  if (locus_enabled) locus_lenses_thread_init();
}

struct locus_self *locus_self_get(void) {
  struct locus_self *me = &locus_me;
  if (LOCUS_LIKELY(me->state == 1)) return me;
  if (me->state == 2 || !locus_enabled) return NULL;
  me->guard++;
  register_self(0, 0, LOCUS_THREAD_ADOPTED, NULL);
  me->guard--;
  return me;
}

void locus_thread_start(uint32_t parent_tid, uint64_t start_routine,
                        struct locus_thread *reserved) {
  if (!locus_busy_enter()) return;
  locus_tsc_check(); /* a thread inherits a disabled TSC */
  if (locus_enabled) {
    locus_me.guard++;
    register_self(parent_tid, start_routine, 0, reserved);
    locus_me.guard--;
  }
  locus_busy_leave();
}

void locus_thread_finish(void) {
  struct locus_self *me = &locus_me;
  if (me->state != 1) return;
  me->guard++;
  if (locus_enabled) locus_lenses_thread_fini();
  locus_stack_thread_fini();
  if (me->slot) {
    me->slot->records = me->records;
    me->slot->dropped = me->dropped;
    me->slot->self_ticks = me->self_ticks;
    me->slot->end = locus_ticks();
    me->slot->flags |= LOCUS_THREAD_EXITED;
  }
  if (locus_proc_hdr) {
    __atomic_fetch_add(&locus_proc_hdr->records, me->records, __ATOMIC_RELAXED);
    __atomic_fetch_add(&locus_proc_hdr->dropped, me->dropped, __ATOMIC_RELAXED);
    __atomic_fetch_add(&locus_proc_hdr->self_ns,
                       (uint64_t)((double)me->self_ticks * 1000.0 / locus_ticks_per_us),
                       __ATOMIC_RELAXED);
  }
  me->state = 2;
  if (atomic_fetch_sub(&live_threads, 1) == 2) shed();
  me->guard--;
}

void locus_threads_after_fork(void) {
  /* Only the forking thread lives on in the child: it becomes the child's main thread. */
  for (uint32_t k = 0; k < CHUNKS; k++) {
    struct locus_thread *c = atomic_exchange(&chunks[k], NULL);
    if (c) munmap(c, (size_t)CHUNK_SLOTS * sizeof(struct locus_thread));
  }
  locus_fd_close(slots_fd);
  slots_ok = 0;
  slots_fd = -1;
  locus_threads_open();
  uint32_t parent = locus_me.tid;
  locus_me.state = 0;
  atomic_store(&live_threads, 0);
  locus_enabled = 1; /* register_self needs it; the caller resets it if later steps fail */
  register_self(parent, 0, 0, NULL);
}

/* ---- pthread_t -> tid, so a join names the thread it waited for ---- */
/* Open addressing in two tiers: the first JOIN_NEAR slots (one page), then the others.
 * A hash over all of it put each thread's entry on a page of its own, up to 16 pages of the
 * program's resident memory; a program with fewer than ~100 joinable threads alive at once
 * now touches one. */
#define JOIN_SLOTS 4096u
#define JOIN_NEAR 256u
#define JOIN_PROBES 64u
static struct {
  _Atomic unsigned long key;
  uint32_t tid;
} join_map[JOIN_SLOTS];

/* The i-th slot probed for `pthread`. */
static uint32_t join_slot(unsigned long pthread, uint32_t i) {
  uint32_t h = (uint32_t)((pthread >> 12) * 2654435761u);
  return locus_tiered_slot(h, h, i, JOIN_NEAR, JOIN_PROBES, JOIN_SLOTS);
}

void locus_join_map_put(unsigned long pthread, uint32_t tid) {
  for (uint32_t i = 0; i < 2 * JOIN_PROBES; i++) {
    uint32_t k = join_slot(pthread, i);
    unsigned long expect = 0;
    if (atomic_load(&join_map[k].key) == pthread ||
        atomic_compare_exchange_strong(&join_map[k].key, &expect, pthread)) {
      join_map[k].tid = tid;
      return;
    }
  }
}

uint32_t locus_join_map_take(unsigned long pthread) {
  for (uint32_t i = 0; i < 2 * JOIN_PROBES; i++) {
    uint32_t k = join_slot(pthread, i);
    if (atomic_load(&join_map[k].key) == pthread) {
      uint32_t tid = join_map[k].tid;
      atomic_store(&join_map[k].key, 0);
      return tid;
    }
  }
  return 0;
}

uint32_t locus_join_map_peek(unsigned long pthread) {
  for (uint32_t i = 0; i < 2 * JOIN_PROBES; i++) {
    uint32_t k = join_slot(pthread, i);
    if (atomic_load(&join_map[k].key) == pthread) return join_map[k].tid;
  }
  return 0;
}

static void on_thread_exit(void *arg) {
  (void)arg;
  if (!locus_busy_enter()) return;
  locus_thread_finish();
  locus_busy_leave();
}
