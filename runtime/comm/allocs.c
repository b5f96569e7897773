/* Allocation records of the comm and numa lenses: the logic behind intercept/alloc.c.
 *
 * Cost (bench/alloc.py): with the lenses off an interposed call is one load, one
 * predictable branch and a tail call into the real allocator. With one on, every malloc,
 * calloc, realloc, aligned allocation and free writes one record (a TSC read and a store
 * into a thread-local chunk of a mapped file, no lock, no system call except one chunk claim
 * per chunk: core/stream.c): a heap block a 32-byte struct locus_heap in heap.bin, a free a
 * 16-byte struct locus_free in frees.bin. Anonymous mmap and munmap, thread stacks and (with
 * --call-stack, whose unwinding costs microseconds) heap blocks with their stack id are
 * 64-byte struct locus_alloc records in allocs.bin. A program doing N allocations and N
 * frees writes 48*N bytes: 1e6 pairs are 48 MB; most of the cost per record is the kernel
 * providing page-cache pages for them. Every block is tracked, whatever its size, because
 * small objects are exactly where false sharing hides.
 *
 * Except the blocks no record can name. A block malloc'd and freed with no sample,
 * communication event or first touch in between that names one of its bytes holds no
 * address the report will look up. Its free looks for its record in the thread's nursery
 * (below) or among its last HEAP_LOOKBACK heap records of the stream, still mapped: found,
 * and named by nothing (locus_named), it is dropped (its last word zeroed; in the stream the
 * cursor moves back over the dropped records at its end) and no free record is written. Named by
 * nothing: no record at all since it was written (one load), or, for a block of up to NAMED_SPAN
 * 64-byte granules, none of them in the table of recently named granules and the table having lost
 * no entry since. A temporary of a loop (openssl speed's digest contexts: 3.7 million blocks a
 * second, 1.1 GB of records in 6 s) then costs a record written and unwritten in the same cache
 * line. Not with the exact backend, whose every access is a record. LOCUS_HEAP_ALL=1 keeps every
 * block.
 *
 * File mappings are MMAP records too, flagged LOCUS_ALF_FILE with the file's offset, device
 * and inode (one fstat): a database's shared-memory index or a memory-mapped file that
 * threads share is an object named by its mmap call and its file. MUNMAP records may name
 * ranges that were never MMAP records (the reader matches them against MMAP records). */
#define _GNU_SOURCE
#include "allocs.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "unwind.h"

#include "../core/runtime.h"
#include "comm.h"

static struct locus_stream stream, heap_stream, free_stream;
static pid_t stream_pid; /* process that opened the streams; 0 = not open */
static atomic_flag open_lock = ATOMIC_FLAG_INIT;
static pthread_key_t end_key;
static int end_key_ok, atfork_done;

/* The recently named 64-byte granules: {granule, ticks of the last record naming it} by
 * hash, 8 KiB. `named_t`: ticks of the last record naming anything; `named_lost`: the
 * newest ticks an entry had when another granule took its slot (or a record named what
 * the table cannot hold). A block allocated after named_lost none of whose granules has
 * an entry newer than its allocation was named by no record. */
#define NAMED_SLOTS 512u
#define NAMED_SPAN 8u
static struct { uint64_t granule, t; } named_tab[NAMED_SLOTS];
static uint64_t named_t, named_lost;

static void max_store(uint64_t *at_, uint64_t t) {
  uint64_t was = __atomic_load_n(at_, __ATOMIC_RELAXED);
  while (was < t &&
         !__atomic_compare_exchange_n(at_, &was, t, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static uint32_t named_slot(uint64_t g) {
  return (uint32_t)((g * 0x9e3779b97f4a7c15ull) >> 32) % NAMED_SLOTS;
}

void locus_named_all(uint64_t t) {
  max_store(&named_t, t);
  max_store(&named_lost, t);
}

void locus_named(uint64_t t, uint64_t addr, uint64_t len) {
  max_store(&named_t, t);
  uint64_t g0 = addr >> 6, g1 = (addr + (len ? len : 1) - 1) >> 6;
  if (g1 - g0 >= NAMED_SPAN) {
    max_store(&named_lost, t);
    return;
  }
  for (uint64_t g = g0; g <= g1; g++) {
    uint32_t k = named_slot(g);
    uint64_t old = __atomic_load_n(&named_tab[k].granule, __ATOMIC_RELAXED);
    if (old != g) { /* the slot's granule loses its entry: blocks older than it keep theirs */
      max_store(&named_lost, __atomic_load_n(&named_tab[k].t, __ATOMIC_RELAXED));
      __atomic_store_n(&named_tab[k].granule, g, __ATOMIC_RELAXED);
    }
    max_store(&named_tab[k].t, t);
  }
}

/* Whether a record named a byte of the block [addr, addr + size) allocated at ticks t. */
static int was_named(uint64_t addr, uint64_t size, uint64_t t) {
  if (__atomic_load_n(&named_t, __ATOMIC_RELAXED) < t) return 0; /* nothing named since */
  uint64_t g0 = addr >> 6, g1 = (addr + (size ? size : 1) - 1) >> 6;
  if (g1 - g0 >= NAMED_SPAN || __atomic_load_n(&named_lost, __ATOMIC_RELAXED) >= t) return 1;
  for (uint64_t g = g0; g <= g1; g++) {
    uint32_t k = named_slot(g);
    if (__atomic_load_n(&named_tab[k].granule, __ATOMIC_RELAXED) == g &&
        __atomic_load_n(&named_tab[k].t, __ATOMIC_RELAXED) >= t)
      return 1;
  }
  return 0;
}

static int heap_all = -1; /* every block recorded (exact backend, LOCUS_HEAP_ALL=1); -1: unset */

/* The nursery: an allocation-heavy thread's heap records go first to 512 slots of heap.bin
 * it keeps mapped (16 KiB), 4-way set-associative by block address, not to the stream. A
 * block freed while its record is there, named by no record, is dropped at its free (no free
 * record): a program whose blocks live across hundreds of its allocations (a FIFO of 64 in
 * flight, a C++ container's nodes) writes nothing to disk for them, where the last-8 look-back
 * of the stream kept every one of them (48 bytes per malloc+free pair, a page-cache page per
 * 85 pairs: ~100 ns a pair and gigabytes an hour). A full set moves its oldest record to the
 * stream (copied first, then overwritten: a record is always in the file, so records still
 * survive SIGKILL; a kill between the two leaves a duplicate, which reads as a block of no
 * duration). Slots are records of heap.bin like any other: no flush at exit; a thread's end
 * moves its live slots to the stream and gives the 16 KiB back.
 *
 * A thread gets a nursery when it starts a chunk of heap records after its first (it has
 * written 128): a thread that allocates little maps nothing more. A nursery that moves 7 of
 * 8 of its records to the stream (a program that keeps what it allocates: a compiler) costs
 * a copy and a search per block for nothing (a loop of 2 million never-freed mallocs: 70 ns
 * each under comm without a nursery, 90 with one). After NURSERY_WINDOW records with that
 * many moved, it is unmapped (its slots stay in heap.bin, records like any other), and the
 * thread tries again at its NURSERY_SKIP-th chunk from there (hot chunks are 1 MiB, 32,768
 * records; a try costs ~1,000 records' moves and 3 system calls). */
#define NURSERY_WAYS 4u
#define NURSERY_SET_BITS 7u
#define NURSERY_RECS (NURSERY_WAYS << NURSERY_SET_BITS)
#define NURSERY_BYTES (NURSERY_RECS * sizeof(struct locus_heap))
#define NURSERY_WINDOW 512u
#define NURSERY_USELESS (NURSERY_WINDOW / 8 * 7)
#define NURSERY_SKIP 16u

static LOCUS_TLS struct {
  struct locus_cursor cur, heap, frees;
  /* Static TLS is in every thread's stack mapping: test_process.py keeps it under 3 KiB. */
  uint32_t closed : 1;        /* the thread ended: its cursors are gone, record nothing more */
  uint32_t no_nursery : 1;    /* its nursery could not be mapped: not tried again */
  uint32_t young : 10;        /* blocks dropped not yet in the process's count */
  uint32_t window : 10;       /* records put in the nursery in this window of NURSERY_WINDOW */
  uint32_t moved : 10;        /* of them, the records they moved to the stream; with no
                               * nursery, the chunks to start before the next try */
  uint32_t nursery_page;      /* the nursery's offset in heap.bin, in pages */
  struct locus_heap *nursery; /* NURSERY_RECS slots mapped from heap.bin, or NULL */
} at;

/* The last ticks a free record was written for an address, by hash (8 KiB, touched only by
 * frees that find no record of their own to drop). A record older than it may be of a block
 * another thread freed (its free record written) and whose address was allocated again: the
 * free of that later block must not drop the old record, which would leave the later block
 * without an end. Collisions only keep more records. */
#define FREED_SLOTS 1024u
static uint64_t freed_tab[FREED_SLOTS];

static uint32_t freed_slot(uint64_t addr) {
  return (uint32_t)(((addr >> 4) * 0x9e3779b97f4a7c15ull) >> 54) % FREED_SLOTS;
}

/* The thread's dropped blocks into the process header's count. */
#define YOUNG_BATCH 512u
static void young_flush(void) {
  if (at.young && locus_proc_hdr)
    __atomic_fetch_add(&locus_proc_hdr->heap_dropped, at.young, __ATOMIC_RELAXED);
  at.young = 0;
}

static void count(int rc) {
  if (rc == 0)
    locus_me.records++;
  else
    locus_me.dropped++;
}

static struct locus_heap *nursery_set(uint64_t addr) {
  return at.nursery + ((((addr >> 4) * 0x9e3779b97f4a7c15ull) >> (64 - NURSERY_SET_BITS))
                       << __builtin_ctz(NURSERY_WAYS));
}

static void nursery_open(void) {
  uint64_t off;
  void *p = heap_all ? NULL : locus_stream_claim_at(&heap_stream, NURSERY_BYTES, &off);
  if (p) at.nursery = p, at.nursery_page = (uint32_t)(off / 4096);
  at.no_nursery = !p; /* not tried again */
  at.window = at.moved = 0;
}

static void nursery_close(int compact);

/* A slot's record rewritten: unused (site 0) while its other words change, so that a record
 * cut by SIGKILL reads as unused. */
static void slot_write(struct locus_heap *slot, const struct locus_heap *r) {
  __atomic_store_n(&slot->site, 0, __ATOMIC_RELAXED);
  atomic_signal_fence(memory_order_release);
  slot->t = r->t;
  slot->addr = r->addr;
  slot->size_tid = r->size_tid;
  atomic_signal_fence(memory_order_release);
  __atomic_store_n(&slot->site, r->site, __ATOMIC_RELAXED);
}

/* A record into the nursery: a free way of its set, else the way of the oldest record, moved
 * to the stream first. */
static void nursery_put(const struct locus_heap *r) {
  struct locus_heap *set = nursery_set(r->addr), *slot = NULL;
  for (unsigned w = 0; w < NURSERY_WAYS; w++) {
    if (!set[w].site) {
      slot = &set[w];
      break;
    }
    if (!slot || set[w].t < slot->t) slot = &set[w];
  }
  if (slot->site) {
    at.moved++;
    if (locus_cursor_put(&heap_stream, &at.heap, slot, sizeof *slot) != 0) {
      locus_me.records--; /* the old record is lost with its slot */
      locus_me.dropped++;
    }
  }
  slot_write(slot, r);
  locus_me.records++;
  if (++at.window == NURSERY_WINDOW) {
    int useless = at.moved >= NURSERY_USELESS;
    at.window = at.moved = 0;
    if (useless) {
      nursery_close(0);
      at.moved = NURSERY_SKIP; /* (a count of chunks while there is no nursery) */
    }
  }
}

/* The hot path's small records: a heap block without a call stack, a free. */
static void put_heap(const void *addr, size_t size, uint64_t site, uint64_t via_new) {
  const uint64_t max = (1ull << LOCUS_HEAP_SIZE_BITS) - 1;
  struct locus_heap r = {
      locus_ticks(), (uint64_t)(uintptr_t)addr,
      (size > max ? max : size) | (via_new ? LOCUS_HEAP_NEW : 0) |
          ((uint64_t)(locus_me.tid & LOCUS_HEAP_TID_MASK) << LOCUS_HEAP_SIZE_BITS),
      site ? site : 1};
  if (at.nursery) {
    nursery_put(&r);
    return;
  }
  count(locus_cursor_put(&heap_stream, &at.heap, &r, sizeof r));
  /* A chunk after the first just started (not a spare page: 4 KiB) */
  if (at.heap.pos == at.heap.base + sizeof r && at.heap.chunk > 4096 && !at.no_nursery &&
      (!at.moved || !--at.moved))
    nursery_open();
}

/* Whether the record r of a block the thread frees may be dropped: named by no record, and
 * no free of its address written since (by another thread: then r's block ended there and
 * the one freed now is a later one at the same address, whose record is elsewhere). */
static int droppable(const struct locus_heap *r) {
  return __atomic_load_n(&freed_tab[freed_slot(r->addr)], __ATOMIC_RELAXED) < r->t &&
         !was_named(r->addr, r->size_tid & ((1ull << LOCUS_HEAP_SIZE_BITS) - 1), r->t);
}

/* A freed block's record dropped from the nursery: its newest record of addr, if droppable. */
static int nursery_drop(const void *addr) {
  if (!at.nursery) return 0;
  struct locus_heap *set = nursery_set((uint64_t)(uintptr_t)addr), *r = NULL;
  for (unsigned w = 0; w < NURSERY_WAYS; w++)
    if (set[w].addr == (uint64_t)(uintptr_t)addr && set[w].site && (!r || set[w].t > r->t))
      r = &set[w];
  if (!r || !droppable(r)) return 0;
  __atomic_store_n(&r->site, 0, __ATOMIC_RELAXED);
  return 1;
}

/* The nursery unmapped. compact (at the thread's end): its records copied to the stream and
 * its range given back, unless a copy failed (a full disk: the range keeps them, the copies
 * made are duplicates). Else its slots stay in heap.bin as they are: a nursery closed for
 * moving most of its records is mostly full, a fork child's is the parent's. */
static void nursery_close(int compact) {
  if (!at.nursery) return;
  int moved_all = compact;
  for (unsigned i = 0; compact && i < NURSERY_RECS; i++)
    if (at.nursery[i].site &&
        locus_cursor_put(&heap_stream, &at.heap, &at.nursery[i], sizeof at.nursery[i]) != 0) {
      moved_all = 0;
      break;
    }
  locus_stream_release(at.nursery, NURSERY_BYTES);
  if (moved_all) locus_stream_punch(&heap_stream, (uint64_t)at.nursery_page * 4096, NURSERY_BYTES);
  at.nursery = NULL;
}

/* A freed block's malloc record dropped, if it is among the thread's last HEAP_LOOKBACK heap
 * records in its current chunk and droppable: 1, and its free is not recorded either; else
 * 0. The newest record of addr decides (an older one is an earlier block at that address).
 * Records before the thread's first in a spare page are an ended thread's, as final as
 * ours. */
#define HEAP_LOOKBACK 8
static int drop_young(const void *addr) {
  struct locus_cursor *c = &at.heap;
  if (!c->base) return 0;
  struct locus_heap *lo = (struct locus_heap *)(void *)c->base;
  struct locus_heap *end = (struct locus_heap *)(void *)c->pos, *r = end;
  for (int k = 0; k < HEAP_LOOKBACK && r > lo; k++) {
    r--;
    if (r->addr != (uint64_t)(uintptr_t)addr || !r->site) continue;
    if (!droppable(r)) return 0;
    __atomic_store_n(&r->site, 0, __ATOMIC_RELAXED); /* reads as unused from here on */
    while (end > lo && !end[-1].site) end--;
    c->pos = (char *)end;
    return 1;
  }
  return 0;
}

static void put_free(const void *addr) {
  if (!heap_all && (nursery_drop(addr) || drop_young(addr))) {
    locus_me.records--;
    if (++at.young >= YOUNG_BATCH) young_flush();
    return;
  }
  struct locus_free r = {locus_ticks(), (uint64_t)(uintptr_t)addr};
  max_store(&freed_tab[freed_slot(r.addr)], r.t);
  count(locus_cursor_put(&free_stream, &at.frees, &r, sizeof r));
}

static int put_rec_at(struct locus_cursor *cur, struct locus_alloc *rp, uint16_t kind,
                      const void *addr, size_t size, uint64_t site, uint32_t stack) {
  struct locus_alloc r = *rp;
  r.t = locus_ticks();
  r.addr = (uint64_t)(uintptr_t)addr;
  r.size = size;
  r.site = site;
  r.tid = locus_me.tid;
  r.stack = stack;
  r.kind = kind;
  int rc = locus_cursor_put(&stream, cur, &r, sizeof r);
  count(rc);
  return rc;
}

static int put_rec(struct locus_alloc *rp, uint16_t kind, const void *addr, size_t size,
                   uint64_t site, uint32_t stack) {
  return put_rec_at(&at.cur, rp, kind, addr, size, site, stack);
}

/* One cursor the threads share, under a lock, for the records each writes once at its start
 * (its stack) and the process's once (its modules' TLS blocks): on the thread's own cursor
 * that one record claimed a page of allocs.bin, which a thread that never allocates kept
 * resident for its 64 bytes (1000 threads started and waiting: 4 MB of the program's RSS).
 * Normal context only (thread starts), never in a signal handler. */
static struct locus_cursor shared_cur;
static atomic_flag shared_lock = ATOMIC_FLAG_INIT;

static int put_rec_shared(struct locus_alloc *rp, uint16_t kind, const void *addr, size_t size,
                          uint64_t site) {
  for (unsigned spins = 0; atomic_flag_test_and_set_explicit(&shared_lock, memory_order_acquire);)
    if (++spins % 64 == 0) syscall(SYS_sched_yield); /* (its holder may be descheduled) */
  int rc = put_rec_at(&shared_cur, rp, kind, addr, size, site, 0);
  atomic_flag_clear_explicit(&shared_lock, memory_order_release);
  return rc;
}

static int put(uint16_t kind, const void *addr, size_t size, uint64_t site, uint32_t stack,
               uint16_t flags) {
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.flags = flags;
  return put_rec(&r, kind, addr, size, site, stack);
}

void locus_allocs_record(uint16_t kind, const void *addr, size_t size, uint64_t site) {
  struct locus_self *me = &locus_me;
  /* Unregistered threads are skipped rather than adopted here: a new thread frees its
   * start-up block before pthread_create's trampoline registers it. */
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  uint64_t via_new = site & LOCUS_SITE_NEW;
  site &= ~LOCUS_SITE_NEW;
  if (kind == LOCUS_AL_FREE && addr) {
    put_free(addr);
  } else if (kind == LOCUS_AL_MALLOC && addr && !locus_cfg.call_stack) {
    put_heap(addr, size, site, via_new);
  } else {
    uint32_t stack = locus_cfg.call_stack ? locus_stack_capture(site) : 0;
    put(kind, addr, size, site, stack, via_new ? LOCUS_ALF_NEW : 0);
  }
  me->guard--;
  errno = saved;
}

void locus_allocs_record_remap(const void *old, size_t old_n, const void *p, size_t n,
                               uint64_t site) {
  struct locus_self *me = &locus_me;
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  /* Moved: the old range ends (grown or shrunk in place, the new record ends it). */
  if (p != old) put(LOCUS_AL_MUNMAP, old, old_n, site, 0, 0);
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.flags = LOCUS_ALF_REMAP;
  r.reserved[0] = (uint64_t)(uintptr_t)old;
  put_rec(&r, LOCUS_AL_MMAP, p, n, site, 0);
  me->guard--;
  errno = saved;
}

/* v in decimal at p (no NUL; stdio's formatting would fault in libc pages the program may
 * never use); returns the digits written. */
static int put_dec(char *p, uint64_t v) {
  char d[20];
  int n = 0, k = 0;
  do d[n++] = (char)('0' + v % 10);
  while ((v /= 10) != 0);
  while (n) p[k++] = d[--n];
  return k;
}

/* The path of a mapped file, as mapped_files.txt lines "INODE DEV PATH" (the maps at start
 * and exit miss a file mapped and unmapped in between: a database's -shm index). Once per
 * file of the last few, one readlink and one write. */
static void note_path(int fd, uint64_t ino, uint32_t dev) {
  static _Atomic uint64_t recent[16];
  static _Atomic uint32_t next;
  static int out = -1;
  static pid_t out_pid, recent_pid;
  /* This process (tracking is on only once its streams are open: no getpid per mapping). */
  pid_t pid = stream_pid;
  if (recent_pid != pid) { /* a fork child writes its own file: the parent's list is not it */
    for (int i = 0; i < 16; i++) atomic_store_explicit(&recent[i], 0, memory_order_relaxed);
    recent_pid = pid;
  }
  for (int i = 0; i < 16; i++)
    if (atomic_load_explicit(&recent[i], memory_order_relaxed) == (ino ^ ((uint64_t)dev << 40)))
      return;
  atomic_store_explicit(&recent[atomic_fetch_add(&next, 1) % 16], ino ^ ((uint64_t)dev << 40),
                        memory_order_relaxed);
  char link[64] = "/proc/self/fd/", line[4200];
  int n = put_dec(line, ino);
  line[n++] = ' ';
  n += put_dec(line + n, dev);
  line[n++] = ' ';
  link[14 + put_dec(link + 14, (uint64_t)(unsigned)fd)] = 0;
  long len = (long)syscall(SYS_readlinkat, AT_FDCWD, link, line + n, sizeof line - (size_t)n - 1);
  if (len <= 0) return;
  line[n + len] = '\n';
  if (out < 0 || out_pid != pid) {
    out = locus_fd_keep_high(openat(locus_proc_dirfd, "mapped_files.txt",
                                    O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    out_pid = pid;
  }
  if (out >= 0) (void)!write(out, line, (size_t)(n + len + 1));
}

void locus_allocs_record_mapping(const void *addr, size_t size, uint64_t site, int fd, uint64_t off,
                                 uint16_t flags) {
  struct locus_self *me = &locus_me;
  if (me->guard || me->state != 1 || at.closed || !locus_enabled) return;
  int saved = errno;
  me->guard++;
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  struct stat st;
  r.flags = (uint16_t)((fd >= 0 ? LOCUS_ALF_FILE : 0u) | flags);
  r.reserved[0] = fd >= 0 ? off : 0;
  if (fd >= 0 && syscall(SYS_fstat, fd, &st) == 0) {
    r.reserved[1] = (uint64_t)st.st_ino;
    r.dev = (uint32_t)st.st_dev;
    note_path(fd, r.reserved[1], r.dev);
  }
  uint32_t stack = locus_cfg.call_stack ? locus_stack_capture(site) : 0;
  put_rec(&r, LOCUS_AL_MMAP, addr, size, site, stack);
  me->guard--;
  errno = saved;
}

/* Calls whose frames are recorded, by a hash of (thread, stack pointer) and the site: a
 * loop that opens a parallel region at each turn writes its frames once. Another call from
 * the same depth of the same thread since (a driver's next function with a parallel region,
 * whose locals took the same stack bytes) is recorded again when the first comes back, so
 * that the report tells by the records' times whose locals an access reached (a, b, a: the
 * third phase is a's); at most FRAMES_AGAIN such records a process (two regions of one
 * function in a loop would write two a turn). Process-wide, not thread-local (static TLS is
 * in every thread's stack); a race writes records twice, which the report merges. Only the
 * calls are kept, not the frames above them, which would evict them: a call from a
 * recursion walked at every depth, again and again. */
#define FRAMES_SEEN 256u /* (the slot: 8 bits) */
#define FRAMES_AGAIN 1024u
static _Atomic uint32_t frames_again;
static _Atomic uint64_t frames_seen[FRAMES_SEEN];
/* The same for the calls that start OpenMP tasks (locus_allocs_task_frame): a table of their
 * own, as a task-heavy program's would evict the regions' calls. */
static _Atomic uint64_t tasks_seen[FRAMES_SEEN];

/* Whether the call was seen before in `seen` (it is from now on): in frames_seen its slot
 * is the depth's (thread, stack pointer), the top 48 bits of its word the depth's and the
 * low 16 the site's hash, so another site at the same depth replaces it. */
static int seen_call(_Atomic uint64_t *seen, uint64_t cfa, uint64_t site) {
  /* (the top bits of a product: bits 32-39 alone put 200 stack depths 80 bytes apart in 15
   * slots) */
  uint64_t depth = ((cfa * 0xc2b2ae3d27d4eb4full) ^ locus_me.tid) * 0x9e3779b97f4a7c15ull;
  uint64_t key = (depth & ~0xffffull) | ((site * 0x9e3779b97f4a7c15ull) >> 48) | 1; /* (0: empty) */
  /* (tasks by call, not by depth: a function that starts two kinds of task in a loop would
   * spend the task frames' budget on records of the same two frames) */
  _Atomic uint64_t *slot = &seen[(seen == frames_seen ? depth : key * 0x9e3779b97f4a7c15ull) >> 56];
  uint64_t was = atomic_load_explicit(slot, memory_order_relaxed);
  if (was == key) return 1;
  /* (another site at this depth past the budget: as before it; read first, so that the
   * count stops at the budget and its line is not written at every call past it) */
  if ((was ^ key) >> 16 == 0 && seen == frames_seen &&
      (atomic_load_explicit(&frames_again, memory_order_relaxed) >= FRAMES_AGAIN ||
       atomic_fetch_add_explicit(&frames_again, 1, memory_order_relaxed) >= FRAMES_AGAIN))
    return 1;
  atomic_store_explicit(slot, key, memory_order_relaxed);
  return 0;
}

/* A frame's record; inside the guard. */
static void put_frame(uint64_t cfa, uint64_t fp, uint64_t site) {
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.reserved[0] = fp;
  r.flags = LOCUS_ALF_TIMED;
  put_rec(&r, LOCUS_AL_FRAME, (const void *)(uintptr_t)cfa, 0, site, 0);
}

static int frames_wanted(void) {
  struct locus_self *me = &locus_me;
  return (__atomic_load_n(&locus_alloc_state, __ATOMIC_RELAXED) & LOCUS_ALLOC_TRACKING) &&
         !me->guard && me->state == 1 && !at.closed && locus_enabled;
}

/* The frames above the caller, up to FRAMES_UP of them (std::thread's constructor calls
 * pthread_create from libstdc++, a program's helper may start threads on its caller's array:
 * the frame whose locals the new thread is given is a few calls up), by the runtime's own
 * unwinder, which reads the objects' call frame information from their files (comm/unwind.c:
 * libgcc's, which this used, read it where it is mapped, and its pages then counted in the
 * program's memory). Walked once per call site and stack depth (seen_call); the frames in
 * system libraries (libc's start of main, libstdc++'s thread code) are passed through, not
 * recorded: their locals are not the program's. */
#define FRAMES_UP 8

void locus_allocs_frames(uint64_t cfa, uint64_t fp, uint64_t site) {
  if (!frames_wanted()) return;
  int saved = errno;
  locus_me.guard++;
  uintptr_t lo, hi;
  /* (a call already seen from this stack depth: the frames above it were walked then) */
  if (!seen_call(frames_seen, cfa, site)) {
    put_frame(cfa, fp, site);
    struct locus_uframe f[FRAMES_UP + 1] = {{cfa, fp, site, 0}};
    /* (only on the thread's own stack, all of it mapped above the caller's frame: not on a
     * signal stack or a coroutine's) */
    int n = locus_thread_stack(&lo, &hi) == 0 && cfa >= lo && cfa < hi
                ? locus_unwind(f, FRAMES_UP + 1, hi)
                : 1;
    for (int i = 1; i < n; i++)
      if (!f[i].sys) put_frame(f[i].sp, f[i].fp, f[i].pc);
  }
  locus_me.guard--;
  errno = saved;
}

/* The frame of a call that starts an OpenMP task (GOMP_task, __kmpc_omp_task): the task gets
 * the addresses of its creator's shared locals, which the thread that runs it reaches. The
 * caller's frame alone, not the frames above it: a task-heavy program starts millions of
 * tasks, from every depth of a recursion, on every thread. Once per (thread, site, depth)
 * while its slot holds, and at most TASK_FRAMES records a process (a recursion's depths
 * evict each other's slots); the check before it is a load and a hash. */
#define TASK_FRAMES 256u
static _Atomic uint32_t task_frames;
/* Set once no task frame will be recorded any more (the budget spent, or a runtime that
 * does not track allocations: no comm lens): the task stubs (intercept/omp.c) then jump
 * straight to the real function. */
LOCUS_HIDDEN uint8_t locus_allocs_task_frames_done;

void locus_allocs_task_frame(uint64_t cfa, uint64_t fp, uint64_t site) {
  if (atomic_load_explicit(&task_frames, memory_order_relaxed) >= TASK_FRAMES) {
    __atomic_store_n(&locus_allocs_task_frames_done, 1, __ATOMIC_RELAXED);
    return;
  }
  if (!frames_wanted()) {
    /* (a started thread of a run without allocation tracking: none will be recorded) */
    if (locus_me.state == 1 && !locus_me.guard &&
        !(__atomic_load_n(&locus_alloc_state, __ATOMIC_RELAXED) & LOCUS_ALLOC_TRACKING))
      __atomic_store_n(&locus_allocs_task_frames_done, 1, __ATOMIC_RELAXED);
    return;
  }
  int saved = errno;
  locus_me.guard++;
  if (!seen_call(tasks_seen, cfa, site) &&
      atomic_fetch_add_explicit(&task_frames, 1, memory_order_relaxed) < TASK_FRAMES)
    put_frame(cfa, fp, site);
  locus_me.guard--;
  errno = saved;
}

static void on_thread_end(void *arg) {
  (void)arg;
  locus_me.guard++;
  young_flush();
  nursery_close(1);
  locus_cursor_finish(&stream, &at.cur);
  locus_cursor_finish(&heap_stream, &at.heap);
  locus_cursor_finish(&free_stream, &at.frees);
  at.closed = 1;
  locus_me.guard--;
}

/* In a fork child the thread's cursor maps a chunk of the parent's file: stop recording
 * at once (this handler was registered before proc.c's, so it runs first), until the
 * child's own thread_init reopens allocs.bin in the child's directory. */
static void child_after_fork(void) {
  __atomic_fetch_and(&locus_alloc_state, ~LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
  atomic_store_explicit(&task_frames, 0, memory_order_relaxed); /* (its own allocs.bin) */
  __atomic_store_n(&locus_allocs_task_frames_done, 0, __ATOMIC_RELAXED);
  locus_me.guard++;
  at.young = 0;     /* the parent's to count */
  nursery_close(0); /* the parent's */
  at.no_nursery = 0;
  locus_cursor_close(&at.cur);
  locus_cursor_close(&at.heap);
  locus_cursor_close(&at.frees);
  locus_cursor_close(&shared_cur); /* (the parent's chunk; and its lock, if a thread held it) */
  atomic_flag_clear(&shared_lock);
  locus_me.guard--;
  stream_pid = 0;
  locus_stream_reset_after_fork(&stream);
  locus_stream_reset_after_fork(&heap_stream);
  locus_stream_reset_after_fork(&free_stream);
  atomic_flag_clear(&open_lock);
}

static void open_stream(void) {
  pid_t pid = getpid();
  while (atomic_flag_test_and_set_explicit(&open_lock, memory_order_acquire)) {
  }
  if (stream_pid != pid) {
    if (locus_stream_open(&stream, locus_proc_dirfd, "allocs.bin") == 0 &&
        locus_stream_open(&heap_stream, locus_proc_dirfd, "heap.bin") == 0 &&
        locus_stream_open(&free_stream, locus_proc_dirfd, "frees.bin") == 0) {
      stream_pid = pid;
      if (heap_all < 0) {
        const char *all = getenv("LOCUS_HEAP_ALL");
        heap_all = locus_comm_cfg.backend == LOCUS_BK_EXACT || (all && *all == '1');
      }
      if (!end_key_ok) end_key_ok = pthread_key_create(&end_key, on_thread_end) == 0;
      if (!atfork_done) atfork_done = pthread_atfork(NULL, NULL, child_after_fork) == 0;
      __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_TRACKING, __ATOMIC_RELEASE);
    } else {
      locus_warn(
          "comm: cannot create allocs.bin, heap.bin or frees.bin; objects will not be named");
    }
  }
  atomic_flag_clear_explicit(&open_lock, memory_order_release);
}

/* The thread pointer: the address of the thread's control block, from which the static TLS
 * blocks of the modules lie at fixed offsets (below it on x86-64, TLS variant II). */
static uintptr_t thread_pointer(void) {
#if defined(__x86_64__)
  uintptr_t tp;
  __asm__("mov %%fs:0, %0" : "=r"(tp));
  return tp;
#elif defined(__aarch64__)
  uintptr_t tp;
  __asm__("mrs %0, tpidr_el0" : "=r"(tp));
  return tp;
#else
  return 0;
#endif
}

/* The thread's stack as an object, so accesses to stack variables are named as such; with
 * its thread pointer, which places the thread's copies of the modules' TLS variables. */
static void put_stack_range(void) {
  uintptr_t lo, hi;
  if (locus_thread_stack(&lo, &hi) != 0) return;
  struct locus_alloc r;
  memset(&r, 0, sizeof r);
  r.reserved[0] = thread_pointer();
  put_rec_shared(&r, LOCUS_AL_STACK, (void *)lo, hi - lo, 0);
}

static int put_tls_block(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  uintptr_t tp = *(uintptr_t *)data;
  if (!info->dlpi_tls_modid || !info->dlpi_tls_data) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_TLS || !ph->p_memsz) continue;
    struct locus_alloc r;
    memset(&r, 0, sizeof r);
    r.reserved[0] = (uint64_t)(tp - (uintptr_t)info->dlpi_tls_data);
    put_rec_shared(&r, LOCUS_AL_TLS, info->dlpi_tls_data, ph->p_memsz,
                   info->dlpi_addr + ph->p_vaddr);
  }
  return 0;
}

/* The modules' static TLS blocks, once per process: the report names an address in a
 * thread's block by the module's TLS symbols (`__thread long mine[4]`, OpenMP's
 * threadprivate), whichever thread's copy it is. */
static void put_tls_blocks(void) {
  uintptr_t tp = thread_pointer();
  if (tp) dl_iterate_phdr(put_tls_block, &tp);
}

void locus_allocs_proc_fini(void) { young_flush(); }

void locus_allocs_thread_init(void) {
  locus_me.guard++;
  if (stream_pid != getpid()) open_stream();
  if (stream_pid) {
    at.closed = 0;
    static pid_t tls_pid;
    if (end_key_ok && locus_me.tid != (uint32_t)getpid()) pthread_setspecific(end_key, &at);
    put_stack_range();
    if (tls_pid != stream_pid) {
      tls_pid = stream_pid;
      put_tls_blocks();
    }
  }
  locus_me.guard--;
}
