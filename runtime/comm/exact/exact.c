/* The `exact` backend of the comm lens: every load and store of code built with `locus cc`
 * calls back into here (gcc: -fsanitize=thread hooks __tsan_*, linked without libtsan;
 * clang: -fsanitize-coverage=trace-loads,trace-stores hooks __sanitizer_cov_load/store*),
 * and a software model of the caches counts every cache-line transfer between threads.
 *
 * Ground-truth model. Per cache line (locus_comm_cfg.line bytes) one shadow entry holds
 *   - the last writer thread (its serial) and the pc of its last write,
 *   - the bytes that writer wrote since it last took the line from other holders (a mask of
 *     64 granules: bytes for lines of <= 64 bytes, line/64 bytes otherwise),
 *   - the set of threads that hold a copy since that write (a bit per thread slot).
 * An access (load or store) by thread T to a line last written by W != T, when T does not
 * hold a copy, is ONE cache-line transfer W -> T: true sharing when T's bytes overlap the
 * bytes W wrote, false sharing otherwise; then T holds a copy. A store by T makes T the last
 * writer and the only holder; a store by T while T is already the only holder and the last
 * writer adds its bytes to the written mask (it is the same modified line). Atomic
 * read-modify-writes are stores. Transfers are aggregated per (line, src, dst, true/false)
 * and written, with the last src/dst pc and byte ranges, as one struct locus_comm_event per
 * aggregate (flags LOCUS_CE_EXACT [| LOCUS_CE_TRUE], volume = number of transfers) when the
 * thread ends, or at process end for threads still running.
 *
 * Limits (all counted, never a crash):
 *   - copy sets are a 64-bit mask: the first 64 concurrently live threads have a bit
 *     (slots are reused after a thread ends; a reused bit may still be set on lines the old
 *     thread held, which hides the new thread's first transfer of those lines). Threads
 *     without a bit still write the shadow (so others see transfers from them) but their
 *     loads are not tracked (counted in `skipped`).
 *   - thread serials above 65535 and more than XS_MAX concurrent threads are not tracked.
 *   - the shadow is a two-level table over the 47-bit user address space; second-level
 *     blocks come from one reserved region of LOCUS_EXACT_SHADOW_MB (default 4096) MiB;
 *     accesses to lines it cannot cover are counted in `skipped`.
 *   - an aggregate table holds at most AGG_MAX entries per thread (more: counted dropped).
 *   - races between threads updating one entry are resolved without locks: an update can be
 *     lost (approximate under true data races; exact for programs whose accesses to a line
 *     are ordered by synchronisation).
 *   - not seen: uninstrumented code (libc's memcpy/memset, libraries not built with locus
 *     cc, inline asm), clang's atomics (sancov does not trace them).
 *
 * Per thread record (comm.threads.bin): samples = accesses seen, skipped = accesses not
 * tracked, detections = events written, dropped = aggregates or events lost. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../comm.h"
#include "../../numa/numa.h"

#define L2_BITS 16 /* lines per second-level block: 2^16 (4 MiB of memory with 64-byte lines) */
#define ADDR_BITS 47
#define XS_MAX 1024 /* thread slots */
#define XS_BITS 64  /* slots with a copy-set bit */
#define AGG_FIRST 1024u
#define AGG_MAX (1u << 20)
#define IP_MASK ((1ull << 48) - 1)

struct shadow {
  _Atomic uint64_t wip;    /* writer serial << 48 | pc of its last write; 0 = never written */
  _Atomic uint64_t bytes;  /* granules written by the writer since it took the line */
  _Atomic uint64_t copies; /* slots holding a copy since the last write */
};

struct agg {
  uint64_t line; /* line number (address >> line shift); 0 = empty slot */
  uint64_t src_ip, dst_ip;
  uint64_t count, t;
  uint32_t src_serial;
  uint32_t dst_flags;
  uint8_t is_true, src_off, src_len, dst_off, dst_len;
  uint8_t pad[3];
  uint64_t pad2[2];
};

struct agg_table {
  uint32_t cap, n;
  struct agg *e;
  struct agg_table *older; /* tables outgrown: unmapped at the thread's end only */
  size_t bytes;
};

/* Thread slots live in a static array so that proc_fini can flush the aggregates of
 * threads still running. state: NEVER (fresh), LIVE, FLUSHING (claimed by the owner at its
 * end or by proc_fini), FREE (reusable). */
enum { XS_NEVER = 0, XS_LIVE = 1, XS_FLUSHING = 2, XS_FREE = 3 };
struct xslot {
  _Atomic int state;
  uint32_t tid, serial;
  struct agg_table *_Atomic agg;
  uint64_t dropped;
};

/* Per-thread state, read by every callback. The first fields are the fast path's: a
 * one-entry cache of the second-level shadow block of the last access. key = ~(address >>
 * g.bshift), 0 = empty; it is set only while the thread is tracked, not busy and the block
 * exists, so a key hit implies all three (the fast path checks nothing else). Blocks never
 * move (the pool is unmapped only in a forked child, which starts with an empty cache). */
struct xthread {
  uint64_t key;      /* ~(block number) of the cached block; 0 = none */
  struct shadow *b;  /* the block */
  uint64_t accesses; /* accesses seen */
  uint64_t bit;      /* copy-set bit, 0 if none */
  uint64_t token;    /* serial << 48 */
  uint32_t serial;
  int state; /* 0 unknown, 1 tracking, 2 not tracked */
  int busy;  /* inside the slow path: a signal handler's accesses are skipped */
  struct xslot *slot;
  uint64_t skipped;
};

/* Read by every callback: one cache line, written only at start and end. */
enum { X_OFF = 0, X_ON = 1, X_ON64 = 2 }; /* g.on: X_ON64 when lines are 64 bytes */
static struct {
  volatile int on;
  uint32_t lshift;
  uint64_t lmask;
  uint32_t line, gshift;
  uint32_t bshift; /* lshift + L2_BITS: address >> bshift = second-level block */
  _Atomic(struct shadow *) *l1;
  uint64_t l1_n;
} __attribute__((aligned(64))) g;

static char *pool;
static size_t pool_bytes, l1_bytes;
static _Atomic uint64_t pool_next;
static _Atomic uint64_t shadow_lost_blocks;
static struct xslot slots[XS_MAX];
static _Atomic uint32_t slots_hi;
static uint32_t tid_of[1u << 16];

static LOCUS_TLS struct xthread xt;
static LOCUS_TLS struct shadow *xt_spare; /* a block that lost an install race */

/* ---- shadow ---- */

#define L2_BYTES (((size_t)1 << L2_BITS) * sizeof(struct shadow))

static __attribute__((noinline)) struct shadow *shadow_block(uint64_t hi) {
  struct shadow *b = xt_spare;
  if (!b) {
    uint64_t off = atomic_fetch_add(&pool_next, L2_BYTES);
    if (off + L2_BYTES > pool_bytes) {
      atomic_fetch_add(&shadow_lost_blocks, 1);
      return NULL;
    }
    b = (struct shadow *)(pool + off);
  }
  struct shadow *expect = NULL;
  if (atomic_compare_exchange_strong(&g.l1[hi], &expect, b)) {
    xt_spare = NULL;
    return b;
  }
  xt_spare = b; /* another thread installed one first: keep ours for the next block */
  return expect;
}

static inline struct shadow *shadow_of(uint64_t ln) {
  uint64_t hi = ln >> L2_BITS;
  if (LOCUS_UNLIKELY(hi >= g.l1_n)) return NULL;
  struct shadow *b = atomic_load_explicit(&g.l1[hi], memory_order_acquire);
  if (LOCUS_UNLIKELY(!b)) b = shadow_block(hi);
  return b ? &b[ln & ((1u << L2_BITS) - 1)] : NULL;
}

/* Granule mask of bytes [off, off + len) of a line (off + len <= line). */
static inline __attribute__((always_inline)) uint64_t granules(uint32_t off, uint32_t len) {
  /* Lines of <= 64 bytes (a granule is a byte): len is a constant in the hooks. */
  if (LOCUS_LIKELY(g.gshift == 0 && len < 64)) return ((1ull << len) - 1) << off;
  uint32_t a = off >> g.gshift, b = (off + len - 1) >> g.gshift;
  uint32_t n = b - a + 1;
  return (n >= 64 ? ~0ull : ((1ull << n) - 1)) << a;
}

static void envelope(uint64_t m, uint8_t *off, uint8_t *len) {
  if (!m) {
    *off = *len = 0;
    return;
  }
  uint32_t lo = (uint32_t)__builtin_ctzll(m), hi = 63u - (uint32_t)__builtin_clzll(m);
  uint32_t o = lo << g.gshift, l = (hi - lo + 1) << g.gshift;
  if (l > 255) l = 255;
  *off = (uint8_t)(o > 255 ? 255 : o);
  *len = (uint8_t)l;
}

/* ---- aggregates ---- */

static struct agg_table *agg_new(uint32_t cap, struct agg_table *older) {
  size_t bytes = sizeof(struct agg_table) + 64 + (size_t)cap * sizeof(struct agg);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  struct agg_table *t = p;
  t->cap = cap;
  t->n = 0;
  t->e = (struct agg *)((char *)p + 64);
  t->older = older;
  t->bytes = bytes;
  return t;
}

static inline uint32_t agg_hash(uint64_t line, uint32_t src, int is_true) {
  uint64_t h = (line * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)src << 1 | (uint64_t)is_true);
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(h ^ (h >> 32));
}

static struct agg *agg_find(struct agg_table *t, uint64_t line, uint32_t src, int is_true) {
  uint32_t m = t->cap - 1;
  for (uint32_t i = agg_hash(line, src, is_true) & m;; i = (i + 1) & m) {
    struct agg *a = &t->e[i];
    if (a->line == 0 || (a->line == line && a->src_serial == src && a->is_true == is_true))
      return a;
  }
}

static struct agg_table *agg_grow(struct xslot *s, struct agg_table *t) {
  uint32_t cap = t ? t->cap * 2 : AGG_FIRST;
  if (cap > AGG_MAX) return NULL;
  struct agg_table *n = agg_new(cap, t);
  if (!n) return NULL;
  if (t) {
    for (uint32_t i = 0; i < t->cap; i++) {
      if (!t->e[i].line) continue;
      *agg_find(n, t->e[i].line, t->e[i].src_serial, t->e[i].is_true) = t->e[i];
      n->n++;
    }
  }
  atomic_store_explicit(&s->agg, n, memory_order_release);
  return n;
}

/* One transfer src -> this thread of line `ln`. */
static __attribute__((noinline)) void transfer(struct xthread *x, uint64_t ln, uint64_t wip,
                                               uint64_t wbytes, uint64_t mine, uint32_t off,
                                               uint32_t len, uint32_t fl, uint64_t ip) {
  struct xslot *s = x->slot;
  if (!s) return;
  /* A signal handler's accesses meanwhile take the slow path (empty cache) and are skipped. */
  uint64_t key = x->key;
  x->key = 0;
  x->busy = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  int is_true = (wbytes & mine) != 0;
  uint32_t src = (uint32_t)(wip >> 48);
  struct agg_table *t = atomic_load_explicit(&s->agg, memory_order_relaxed);
  if (!t || t->n * 2 >= t->cap) {
    struct agg_table *n = agg_grow(s, t);
    if (!n && (!t || t->n + 1 >= t->cap)) {
      s->dropped++;
      goto out;
    }
    if (n) t = n;
  }
  struct agg *a = agg_find(t, ln, src, is_true);
  if (!a->line) {
    a->src_serial = src;
    a->is_true = (uint8_t)is_true;
    a->line = ln;
    t->n++;
  }
  a->count++;
  a->t = locus_ticks();
  a->src_ip = wip & IP_MASK;
  a->dst_ip = ip;
  a->dst_flags = fl;
  envelope(wbytes, &a->src_off, &a->src_len);
  a->dst_off = (uint8_t)(off > 255 ? 255 : off);
  a->dst_len = (uint8_t)(len > 255 ? 255 : len);
out:
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  x->busy = 0;
  x->key = key;
}

static void flush_slot(struct xslot *s) {
  struct agg_table *t = atomic_load_explicit(&s->agg, memory_order_acquire);
  if (!t) return;
  for (uint32_t i = 0; i < t->cap; i++) {
    struct agg *a = &t->e[i];
    if (!a->line || !a->count) continue;
    struct locus_comm_event e;
    memset(&e, 0, sizeof e);
    e.t = a->t;
    e.line = a->line << g.lshift;
    e.src_ip = a->src_ip;
    e.dst_ip = a->dst_ip;
    e.volume = (double)a->count;
    e.src_tid = a->src_serial < (1u << 16) ? tid_of[a->src_serial] : 0;
    e.dst_tid = s->tid;
    e.src_cpu = e.dst_cpu = -1;
    e.src_off = a->src_off;
    e.src_len = a->src_len;
    e.dst_off = a->dst_off;
    e.dst_len = a->dst_len;
    e.flags = (uint16_t)(LOCUS_CE_EXACT | (a->is_true ? LOCUS_CE_TRUE : 0));
    e.kind = 1;
    e.dst_flags = a->dst_flags;
    locus_comm_put_event(&e);
  }
  locus_ct.st.dropped += s->dropped;
}

static void free_tables(struct xslot *s) {
  struct agg_table *t = atomic_exchange(&s->agg, NULL);
  while (t) {
    struct agg_table *o = t->older;
    munmap(t, t->bytes);
    t = o;
  }
  s->dropped = 0;
}

/* ---- the access path ---- */

#define COLD __attribute__((noinline, cold))
#define INLINE inline __attribute__((always_inline))

static COLD void read_miss(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                           uint32_t len, uint32_t fl, uint64_t ip) {
  if (!x->bit) {
    x->skipped++;
    return;
  }
  uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
  uint32_t ws = (uint32_t)(w >> 48);
  if (ws && ws != x->serial)
    transfer(x, ln, w, atomic_load_explicit(&e->bytes, memory_order_relaxed), granules(off, len),
             off, len, fl, ip);
  atomic_fetch_or_explicit(&e->copies, x->bit, memory_order_relaxed);
}

static COLD void write_miss(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                            uint32_t len, uint32_t fl, uint64_t ip) {
  uint64_t mine = granules(off, len);
  uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  uint32_t ws = (uint32_t)(w >> 48);
  if (ws && ws != x->serial && x->bit && !(c & x->bit))
    transfer(x, ln, w, atomic_load_explicit(&e->bytes, memory_order_relaxed), mine, off, len, fl,
             ip);
  /* A new modified epoch: T is the only holder, its bytes are the written ones. */
  atomic_store_explicit(&e->copies, x->bit, memory_order_relaxed);
  atomic_store_explicit(&e->bytes, mine, memory_order_relaxed);
  atomic_store_explicit(&e->wip, x->token | (ip & IP_MASK), memory_order_relaxed);
}

/* A store to a line this thread last wrote and holds alone, from another pc than its last
 * store (or a pc of more than 48 bits), or else a write miss. */
static COLD void write_other(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                             uint32_t len, uint32_t fl, uint64_t ip) {
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
  if ((w >> 48) == x->serial && c == x->bit) {
    uint64_t mine = granules(off, len);
    uint64_t b = atomic_load_explicit(&e->bytes, memory_order_relaxed);
    if ((b | mine) != b) atomic_store_explicit(&e->bytes, b | mine, memory_order_relaxed);
    uint64_t nw = x->token | (ip & IP_MASK);
    if (w != nw) atomic_store_explicit(&e->wip, nw, memory_order_relaxed);
    return;
  }
  write_miss(x, e, ln, off, len, fl, ip);
}

/* An access inside one line whose shadow entry is e (l64: lines are 64 bytes). Hits (a read
 * of a line this thread holds; a write from the same pc as its last one to a line it last
 * wrote and holds alone) touch only e and return. */
static INLINE void line_access(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                               uint32_t len, uint32_t fl, uint64_t ip, int l64) {
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  if (!(fl & LOCUS_AC_STORE)) {
    if (LOCUS_LIKELY(c & x->bit)) return; /* holds a copy: a cache hit */
    read_miss(x, e, ln, off, len, fl, ip);
    return;
  }
  uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
  if (LOCUS_LIKELY((w == (x->token | ip)) & (c == x->bit))) {
    /* Already the modified, only copy, same pc: a hit; remember the bytes. */
    uint64_t mine = l64 ? ((1ull << len) - 1) << off : granules(off, len);
    uint64_t b = atomic_load_explicit(&e->bytes, memory_order_relaxed);
    if (LOCUS_UNLIKELY((b | mine) != b))
      atomic_store_explicit(&e->bytes, b | mine, memory_order_relaxed);
    return;
  }
  write_other(x, e, ln, off, len, fl, ip);
}

static int thread_enter(struct xthread *x);

/* Everything the fast path does not take: untracked or busy threads, the first access to a
 * line (shadow table walk; fills the cache), accesses spanning lines, ranges. */
static __attribute__((noinline)) void access_slow(uintptr_t a, uint64_t len, uint32_t fl,
                                                  uint64_t ip) {
  struct xthread *x = &xt;
  if (LOCUS_UNLIKELY(x->state != 1) && !thread_enter(x)) return;
  if (LOCUS_UNLIKELY(x->busy)) {
    x->skipped++;
    return;
  }
  x->accesses++;
  if (LOCUS_UNLIKELY(a >= (1ull << ADDR_BITS) || len == 0)) {
    x->skipped++;
    return;
  }
  /* Spans lines (unaligned, ranges): one access per line. */
  uintptr_t end = a + len;
  if (end > (1ull << ADDR_BITS) || end < a) end = (uintptr_t)1 << ADDR_BITS;
  while (a < end) {
    uint32_t off = (uint32_t)(a & g.lmask);
    uint64_t n = g.line - off;
    if (n > end - a) n = end - a;
    uint64_t ln = a >> g.lshift;
    struct shadow *e = shadow_of(ln);
    if (LOCUS_UNLIKELY(!e)) {
      x->skipped++;
    } else {
      x->b = e - (ln & ((1u << L2_BITS) - 1));
      x->key = ~(ln >> L2_BITS);
      line_access(x, e, ln, off, (uint32_t)n, fl, ip, 0);
    }
    a += n;
  }
}

#define L2_MASK ((1u << L2_BITS) - 1)

static INLINE void x_access(const volatile void *p, uint32_t len, uint32_t fl, uint64_t ip) {
  int on = g.on;
  struct xthread *x = &xt;
  uintptr_t a = (uintptr_t)p;
  if (LOCUS_UNLIKELY(atomic_load_explicit(&locus_numa_exact_on, memory_order_relaxed)))
    locus_numa_exact_access(a, len, fl, ip);
  if (LOCUS_LIKELY(on == X_ON64)) {
    /* In the cached block (so a tracked, not busy thread and a valid address), not spanning
     * lines. */
    uint32_t off = (uint32_t)(a & 63);
    if (LOCUS_LIKELY((x->key == ~(a >> (6 + L2_BITS))) & (off + len <= 64))) {
      x->accesses++;
      line_access(x, &x->b[(a >> 6) & L2_MASK], a >> 6, off, len, fl, ip, 1);
      return;
    }
  } else if (LOCUS_UNLIKELY(on == X_OFF)) {
    return;
  } else {
    uint64_t ln = a >> g.lshift;
    uint32_t off = (uint32_t)(a & g.lmask);
    if (LOCUS_LIKELY((x->key == ~(a >> g.bshift)) & (off + len <= g.line))) {
      x->accesses++;
      line_access(x, &x->b[ln & L2_MASK], ln, off, len, fl, ip, 0);
      return;
    }
  }
  access_slow(a, len, fl, ip);
}

#define RA ((uint64_t)__builtin_return_address(0))

/* ---- gcc -fsanitize=thread ---- */

LOCUS_EXPORT void __tsan_init(void) {}
LOCUS_EXPORT void __tsan_func_entry(void *pc) { (void)pc; }
LOCUS_EXPORT void __tsan_func_exit(void) {}
LOCUS_EXPORT void __tsan_ignore_thread_begin(void) {}
LOCUS_EXPORT void __tsan_ignore_thread_end(void) {}

#define TSAN_RW(n)                                                                              \
  LOCUS_EXPORT void __tsan_read##n(void *p) { x_access(p, n, 0, RA); }                          \
  LOCUS_EXPORT void __tsan_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }            \
  LOCUS_EXPORT void __tsan_volatile_read##n(void *p) { x_access(p, n, 0, RA); }                 \
  LOCUS_EXPORT void __tsan_volatile_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }   \
  LOCUS_EXPORT void __tsan_read##n##_pc(void *p, void *pc) { x_access(p, n, 0, (uint64_t)pc); } \
  LOCUS_EXPORT void __tsan_write##n##_pc(void *p, void *pc) {                                   \
    x_access(p, n, LOCUS_AC_STORE, (uint64_t)pc);                                               \
  }
TSAN_RW(1)
TSAN_RW(2)
TSAN_RW(4)
TSAN_RW(8)
TSAN_RW(16)

#define TSAN_UNALIGNED(n)                                                        \
  LOCUS_EXPORT void __tsan_unaligned_read##n(void *p) { x_access(p, n, 0, RA); } \
  LOCUS_EXPORT void __tsan_unaligned_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }
TSAN_UNALIGNED(2)
TSAN_UNALIGNED(4)
TSAN_UNALIGNED(8)
TSAN_UNALIGNED(16)

LOCUS_EXPORT void __tsan_read_range(void *p, unsigned long size) {
  if (g.on) access_slow((uintptr_t)p, size, 0, RA);
}
LOCUS_EXPORT void __tsan_write_range(void *p, unsigned long size) {
  if (g.on) access_slow((uintptr_t)p, size, LOCUS_AC_STORE, RA);
}
LOCUS_EXPORT void __tsan_vptr_read(void **p) { x_access(p, 8, 0, RA); }
LOCUS_EXPORT void __tsan_vptr_update(void **p, void *v) {
  (void)v;
  x_access(p, 8, LOCUS_AC_STORE, RA);
}

/* Atomics: the access is recorded (loads as loads, everything else as a store with
 * LOCUS_AC_ATOMIC), then the operation is done with sequential consistency, which is at
 * least as strong as any order the program asked for. */
#define SC __ATOMIC_SEQ_CST
#define ST (LOCUS_AC_STORE | LOCUS_AC_ATOMIC)
#define TSAN_ATOMIC(n, T)                                                                       \
  LOCUS_EXPORT T __tsan_atomic##n##_load(const volatile T *a, int mo) {                         \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), LOCUS_AC_ATOMIC, RA);                                                \
    return __atomic_load_n(a, SC);                                                              \
  }                                                                                             \
  LOCUS_EXPORT void __tsan_atomic##n##_store(volatile T *a, T v, int mo) {                      \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    __atomic_store_n(a, v, SC);                                                                 \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_exchange(volatile T *a, T v, int mo) {                      \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_exchange_n(a, v, SC);                                                       \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_add(volatile T *a, T v, int mo) {                     \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_add(a, v, SC);                                                        \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_sub(volatile T *a, T v, int mo) {                     \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_sub(a, v, SC);                                                        \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_and(volatile T *a, T v, int mo) {                     \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_and(a, v, SC);                                                        \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_or(volatile T *a, T v, int mo) {                      \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_or(a, v, SC);                                                         \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_xor(volatile T *a, T v, int mo) {                     \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_xor(a, v, SC);                                                        \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_fetch_nand(volatile T *a, T v, int mo) {                    \
    (void)mo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_fetch_nand(a, v, SC);                                                       \
  }                                                                                             \
  LOCUS_EXPORT int __tsan_atomic##n##_compare_exchange_strong(volatile T *a, T *c, T v, int mo, \
                                                              int fmo) {                        \
    (void)mo;                                                                                   \
    (void)fmo;                                                                                  \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_compare_exchange_n(a, c, v, 0, SC, SC);                                     \
  }                                                                                             \
  LOCUS_EXPORT int __tsan_atomic##n##_compare_exchange_weak(volatile T *a, T *c, T v, int mo,   \
                                                            int fmo) {                          \
    (void)mo;                                                                                   \
    (void)fmo;                                                                                  \
    x_access(a, sizeof(T), ST, RA);                                                             \
    return __atomic_compare_exchange_n(a, c, v, 1, SC, SC);                                     \
  }                                                                                             \
  LOCUS_EXPORT T __tsan_atomic##n##_compare_exchange_val(volatile T *a, T c, T v, int mo,       \
                                                         int fmo) {                             \
    (void)mo;                                                                                   \
    (void)fmo;                                                                                  \
    x_access(a, sizeof(T), ST, RA);                                                             \
    __atomic_compare_exchange_n(a, &c, v, 0, SC, SC);                                           \
    return c;                                                                                   \
  }
TSAN_ATOMIC(8, uint8_t)
TSAN_ATOMIC(16, uint16_t)
TSAN_ATOMIC(32, uint32_t)
TSAN_ATOMIC(64, uint64_t)

LOCUS_EXPORT void __tsan_atomic_thread_fence(int mo) {
  (void)mo;
  __atomic_thread_fence(SC);
}
LOCUS_EXPORT void __tsan_atomic_signal_fence(int mo) {
  (void)mo;
  __atomic_signal_fence(SC);
}

/* ---- clang -fsanitize-coverage=trace-loads,trace-stores ---- */

#define SANCOV(n, T)                                                         \
  LOCUS_EXPORT void __sanitizer_cov_load##n(T *p) { x_access(p, n, 0, RA); } \
  LOCUS_EXPORT void __sanitizer_cov_store##n(T *p) { x_access(p, n, LOCUS_AC_STORE, RA); }
SANCOV(1, uint8_t)
SANCOV(2, uint16_t)
SANCOV(4, uint32_t)
SANCOV(8, uint64_t)
SANCOV(16, unsigned __int128)

/* -fsanitize-coverage=func implies trace-pc-guard when no other instrumentation point is
 * given: the guards are set to 0 at init, so the (unconditional) call returns at once. */
LOCUS_EXPORT void __sanitizer_cov_trace_pc_guard_init(uint32_t *start, uint32_t *stop) {
  for (uint32_t *p = start; p < stop; p++) *p = 0;
}
LOCUS_EXPORT void __sanitizer_cov_trace_pc_guard(uint32_t *guard) { (void)guard; }

/* ---- life cycle ---- */

static struct xslot *claim_slot(uint32_t *index) {
  uint32_t n = atomic_load(&slots_hi);
  if (n < XS_BITS) {
    n = atomic_fetch_add(&slots_hi, 1);
    if (n < XS_MAX) {
      atomic_store(&slots[n].state, XS_LIVE);
      *index = n;
      return &slots[n];
    }
  }
  uint32_t hi = atomic_load(&slots_hi);
  if (hi > XS_MAX) hi = XS_MAX;
  for (uint32_t i = 0; i < hi; i++) {
    int expect = XS_FREE;
    if (atomic_compare_exchange_strong(&slots[i].state, &expect, XS_LIVE)) {
      *index = i;
      return &slots[i];
    }
  }
  n = atomic_fetch_add(&slots_hi, 1);
  if (n >= XS_MAX) return NULL;
  atomic_store(&slots[n].state, XS_LIVE);
  *index = n;
  return &slots[n];
}

static void thread_init(void) {
  struct xthread *x = &xt;
  memset(x, 0, sizeof *x); /* also empties the line cache */
  xt_spare = NULL;
  x->state = 2;
  uint32_t serial = locus_me.serial;
  if (!serial || serial >= (1u << 16)) return;
  uint32_t index = 0;
  struct xslot *s = claim_slot(&index);
  if (!s) return;
  s->tid = locus_me.tid;
  s->serial = serial;
  s->dropped = 0;
  atomic_store(&s->agg, NULL);
  tid_of[serial] = locus_me.tid;
  x->serial = serial;
  x->token = (uint64_t)serial << 48;
  x->bit = index < XS_BITS ? 1ull << index : 0;
  x->slot = s;
  x->state = 1;
}

/* First access of a thread the runtime has not registered yet (adopted threads). */
static int thread_enter(struct xthread *x) {
  if (x->state == 2 || locus_me.guard || locus_me.state == 2) return 0;
  if (locus_me.state != 1) {
    locus_self_get(); /* registers the thread: the lens calls thread_init */
    if (x->state != 1) x->state = 2;
  } else if (x->state == 0) {
    x->state = 2; /* registered before the lens was on: not tracked */
  }
  return x->state == 1;
}

static void publish_counts(struct xthread *x) {
  locus_ct.st.samples += x->accesses;
  locus_ct.st.skipped += x->skipped;
  locus_ct.st.period_ns = 0;
  x->accesses = x->skipped = 0;
}

static void thread_fini(void) {
  struct xthread *x = &xt;
  if (x->state != 1) {
    x->state = 2;
    return;
  }
  x->key = 0;
  x->busy = 1;
  struct xslot *s = x->slot;
  int expect = XS_LIVE;
  if (s && atomic_compare_exchange_strong(&s->state, &expect, XS_FLUSHING)) {
    flush_slot(s);
    free_tables(s);
    atomic_store(&s->state, XS_FREE);
  }
  publish_counts(x);
  x->state = 2;
  x->busy = 0;
}

static void proc_fini(void) {
  g.on = 0;
  struct xthread *x = &xt;
  x->key = 0;
  x->busy = 1;
  if (x->state == 1) publish_counts(x);
  uint32_t hi = atomic_load(&slots_hi);
  if (hi > XS_MAX) hi = XS_MAX;
  /* This thread's aggregates and those of the threads still running. */
  for (uint32_t i = 0; i < hi; i++) {
    int expect = XS_LIVE;
    if (atomic_compare_exchange_strong(&slots[i].state, &expect, XS_FLUSHING))
      flush_slot(&slots[i]);
  }
  uint64_t lost = atomic_load(&shadow_lost_blocks);
  if (lost) locus_warn("comm exact: the shadow memory budget (LOCUS_EXACT_SHADOW_MB) ran out");
  x->state = 2;
  x->busy = 0;
}

static int setup_shadow(void) {
  uint32_t line = locus_comm_cfg.line;
  g.line = line;
  g.lshift = (uint32_t)__builtin_ctz(line);
  g.lmask = line - 1;
  g.gshift = g.lshift > 6 ? g.lshift - 6 : 0;
  g.bshift = g.lshift + L2_BITS;
  uint32_t l1_bits = ADDR_BITS - g.lshift - L2_BITS;
  g.l1_n = 1ull << l1_bits;
  l1_bytes = (size_t)g.l1_n * sizeof(void *);
  const char *mb = getenv("LOCUS_EXACT_SHADOW_MB");
  uint64_t budget = mb && *mb ? strtoull(mb, NULL, 10) : 4096;
  if (budget < 16) budget = 16;
  pool_bytes = (size_t)budget << 20;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void *l1 = mmap(NULL, l1_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  void *p = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (l1 == MAP_FAILED || p == MAP_FAILED) {
    if (l1 != MAP_FAILED) munmap(l1, l1_bytes);
    if (p != MAP_FAILED) munmap(p, pool_bytes);
    locus_warn("comm exact: cannot reserve the shadow memory; the comm lens is off");
    return -1;
  }
  g.l1 = l1;
  pool = p;
  atomic_store(&pool_next, 0);
  atomic_store(&shadow_lost_blocks, 0);
  return 0;
}

static int proc_init(void) {
  if (setup_shadow() != 0) return -1;
  memset(slots, 0, sizeof slots);
  atomic_store(&slots_hi, 0);
  /* The numa lens alone (no detection asked): its own hook only, no cache-line model. */
  g.on = !locus_comm_cfg.detect ? X_OFF : g.line == 64 ? X_ON64 : X_ON;
  return 0;
}

static void after_fork(void) {
  /* The child starts from an empty model: only the forking thread lives on, and thread
   * serials start again at 1. The parent's shadow is dropped (copy-on-write pages). */
  g.on = 0;
  if (g.l1) munmap((void *)g.l1, l1_bytes);
  if (pool) munmap(pool, pool_bytes);
  g.l1 = NULL;
  pool = NULL;
  if (proc_init() != 0) return;
  thread_init();
}

struct locus_comm_backend_ops locus_comm_exact = {
    .name = "exact",
    .proc_init = proc_init,
    .thread_init = thread_init,
    .thread_fini = thread_fini,
    .proc_fini = proc_fini,
    .after_fork = after_fork,
};
