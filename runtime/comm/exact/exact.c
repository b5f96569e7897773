/* The `exact` backend of the comm lens: every load and store of code built with `locus cc`
 * calls back into here (gcc and clang: -fsanitize=thread hooks __tsan_*, linked without
 * libtsan; the hit test is in fast.h, which clang LTO builds inline: runtime/cc/), and a
 * software model of the caches counts every cache-line transfer between threads.
 *
 * Ground-truth model. Per cache line (locus_comm_cfg.line bytes) one shadow entry holds
 *   - the last writer thread (its serial) and the pc of the store that took the line (began
 *     its modified epoch: later stores to the line it holds alone are hits and do not
 *     change it, so the hit test stays a compare of the writer),
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
 * thread ends, or at process end for threads still running. The aggregate is also keyed by
 * the CPU pair: the reader's CPU at the transfer (sched_getcpu, read from rseq by glibc) and
 * the writer's CPU at its last write miss.
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
 *   - races between threads updating one entry are resolved without locks. The writer and
 *     its bytes change together (one 16-byte compare-and-swap), so a transfer's true/false
 *     verdict never mixes two threads' epochs; the copy set is a separate word, so a
 *     transfer can be lost or counted twice when two threads take a line at the same instant
 *     (exact for programs whose accesses to a line are ordered by synchronisation).
 *   - not seen: uninstrumented code (libraries not built with locus cc, libc's functions
 *     but memcpy/memmove/memset called from instrumented code, which are wrapped below;
 *     inline asm).
 *
 * Per thread record (comm.threads.bin): samples = accesses seen, skipped = accesses not
 * tracked, detections = events written, dropped = aggregates or events lost. */
#define _GNU_SOURCE
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../comm.h"
#include "../../numa/numa.h"
#include "fast.h"
#include <malloc.h>

#define L2_BITS LOCUS_X_L2_BITS /* 2^16 lines per second-level block (4 MiB of 64-byte lines) */
#define ADDR_BITS 47
#define XS_MAX 1024 /* thread slots */
#define XS_BITS 64  /* slots with a copy-set bit */
#define AGG_FIRST 1024u
#define AGG_MAX (1u << 20)
#define IP_MASK ((1ull << 48) - 1)

struct agg {
  uint64_t line; /* line number (address >> line shift); 0 = empty slot */
  uint64_t src_ip, dst_ip;
  uint64_t count, t;
  uint32_t src_serial;
  uint32_t dst_flags;
  uint8_t is_true, src_off, src_len, dst_off, dst_len;
  uint8_t dst_word; /* the reader's 8-byte word in the line (part of the key) */
  uint8_t pad[2];
  int16_t src_cpu, dst_cpu; /* -1 unknown */
  uint32_t gen;             /* the line's generation (locus_comm_exact_freed; part of the key) */
  uint32_t pad2[2];
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
struct locus_xslot {
  _Atomic int state;
  uint32_t tid, serial;
  struct agg_table *_Atomic agg;
  uint64_t dropped;
  uint64_t flushed;          /* locus_ticks() of the owner's last flush */
  uint64_t flush_gap;        /* ticks to the next one (doubling, see flush_own) */
  struct locus_xthread *x;   /* the owner's model state and comm counters (TLS), which */
  struct locus_comm_tls *ct; /* proc_fini reads while the slot is LIVE */
};

static char *pool;
static size_t pool_bytes, l1_bytes;
static _Atomic uint64_t pool_next;
static _Atomic uint64_t shadow_lost_blocks;
static struct locus_xslot slots[XS_MAX];
static _Atomic uint32_t slots_hi;
static uint32_t tid_of[1u << 16];
/* The CPU each thread was on at its last write miss (taking a line), +1 (0 unknown): the
 * source CPU of the transfers from it. Written only when it changes (no traffic of ours). */
static int16_t cpu_of[1u << 16];

LOCUS_EXPORT struct locus_xglobal locus_xg;
LOCUS_EXPORT LOCUS_TLS struct locus_xthread locus_xt;
/* python/locus/gas.py writes the hit test in assembly with these offsets and L2_BITS 16. */
_Static_assert(offsetof(struct locus_xthread, key) == 0 && offsetof(struct locus_xthread, b) == 8 &&
                   offsetof(struct locus_xthread, accesses) == 16 &&
                   offsetof(struct locus_xthread, bit) == 24 &&
                   offsetof(struct locus_xthread, serial) == 40,
               "struct locus_xthread as python/locus/gas.py reads it");
_Static_assert(sizeof(struct locus_xshadow) == 32 && offsetof(struct locus_xshadow, bytes) == 8 &&
                   offsetof(struct locus_xshadow, copies) == 16 && LOCUS_X_L2_BITS == 16,
               "struct locus_xshadow as python/locus/gas.py reads it");
static LOCUS_TLS struct locus_xshadow *xt_spare; /* a block that lost an install race */

/* ---- shadow ---- */

#define L2_BYTES (((size_t)1 << L2_BITS) * sizeof(struct locus_xshadow))

static __attribute__((noinline)) struct locus_xshadow *shadow_block(uint64_t hi) {
  struct locus_xshadow *b = xt_spare;
  if (!b) {
    uint64_t off = atomic_fetch_add(&pool_next, L2_BYTES);
    if (off + L2_BYTES > pool_bytes) {
      atomic_fetch_add(&shadow_lost_blocks, 1);
      return NULL;
    }
    b = (struct locus_xshadow *)(pool + off);
  }
  struct locus_xshadow *expect = NULL;
  if (atomic_compare_exchange_strong(&locus_xg.l1[hi], &expect, b)) {
    xt_spare = NULL;
    return b;
  }
  xt_spare = b; /* another thread installed one first: keep ours for the next block */
  return expect;
}

static inline struct locus_xshadow *shadow_of(uint64_t ln) {
  uint64_t hi = ln >> L2_BITS;
  if (LOCUS_UNLIKELY(hi >= locus_xg.l1_n)) return NULL;
  struct locus_xshadow *b = atomic_load_explicit(&locus_xg.l1[hi], memory_order_acquire);
  if (LOCUS_UNLIKELY(!b)) b = shadow_block(hi);
  return b ? &b[ln & ((1u << L2_BITS) - 1)] : NULL;
}

/* A heap block is being freed (or moved by realloc): its lines start a new generation, so that
 * the transfers of the block that comes next at the same address are aggregated apart (an
 * aggregate is attributed by its time: one spanning both blocks went to the later one).
 * Blocks up to 64 KiB: a bigger one's lines are left as they are (glibc returns those to
 * the system with munmap anyway). */
#define GEN_MAX_LINES 1024u
int locus_comm_exact_gens(void) { return locus_xg.on && locus_xg.l1; }

void locus_comm_exact_freed(void *p, size_t n) {
  if (!p || !locus_comm_exact_gens()) return;
  if (!n) n = malloc_usable_size(p);
  /* Lines wholly inside the block only: a line it shares with a live neighbour (a hot
   * counter beside a short-lived block) keeps its aggregates whole. */
  uint64_t a = ((uintptr_t)p + locus_xg.line - 1) >> locus_xg.lshift;
  uint64_t end = ((uintptr_t)p + n) >> locus_xg.lshift; /* the first line not wholly inside */
  if (end <= a || end - a > GEN_MAX_LINES) return;
  for (uint64_t ln = a; ln < end; ln++) {
    uint64_t hi = ln >> L2_BITS;
    if (hi >= locus_xg.l1_n) return;
    struct locus_xshadow *blk = atomic_load_explicit(&locus_xg.l1[hi], memory_order_acquire);
    if (blk)
      atomic_fetch_add_explicit(&blk[ln & ((1u << L2_BITS) - 1)].gen, 1, memory_order_relaxed);
  }
}

static void envelope(uint64_t m, uint8_t *off, uint8_t *len) {
  if (!m) {
    *off = *len = 0;
    return;
  }
  uint32_t lo = (uint32_t)__builtin_ctzll(m), hi = 63u - (uint32_t)__builtin_clzll(m);
  uint32_t o = lo << locus_xg.gshift, l = (hi - lo + 1) << locus_xg.gshift;
  if (l > 255) l = 255;
  *off = (uint8_t)(o > 255 ? 255 : o);
  *len = (uint8_t)l;
}

/* ---- aggregates ---- */

static struct agg_table *agg_new(uint32_t cap, struct agg_table *older) {
  size_t bytes = sizeof(struct agg_table) + 64 + (size_t)cap * sizeof(struct agg);
  void *p = locus_sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  struct agg_table *t = p;
  t->cap = cap;
  t->n = 0;
  t->e = (struct agg *)((char *)p + 64);
  t->older = older;
  t->bytes = bytes;
  return t;
}

/* An aggregate: one line, source thread, verdict, CPU pair (a migration starts another)
 * and the reader's 8-byte word: a line that holds several objects (two counters side by
 * side, a struct and a union) gives each its own transfers; with the line alone, the whole
 * volume went to the object at the last access's offset, and the others vanished. */
struct agg_key {
  uint64_t line;
  uint32_t src;
  int is_true;
  int16_t src_cpu, dst_cpu;
  uint32_t word;
  uint32_t gen;
};

static inline uint32_t agg_hash(const struct agg_key *k) {
  uint64_t cpus = (uint64_t)(uint16_t)k->src_cpu << 16 | (uint16_t)k->dst_cpu;
  uint64_t h = (k->line * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)k->src << 1 | (uint64_t)k->is_true) ^
               (cpus << 32) ^ ((uint64_t)k->word << 56) ^ ((uint64_t)k->gen << 40);
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(h ^ (h >> 32));
}

static struct agg *agg_find(struct agg_table *t, const struct agg_key *k) {
  uint32_t m = t->cap - 1;
  for (uint32_t i = agg_hash(k) & m;; i = (i + 1) & m) {
    struct agg *a = &t->e[i];
    if (a->line == 0 || (a->line == k->line && a->src_serial == k->src &&
                         a->is_true == k->is_true && a->src_cpu == k->src_cpu &&
                         a->dst_cpu == k->dst_cpu && a->dst_word == k->word && a->gen == k->gen))
      return a;
  }
}

static inline struct agg_key key_of(const struct agg *a) {
  return (struct agg_key){a->line,    a->src_serial, a->is_true, a->src_cpu,
                          a->dst_cpu, a->dst_word,   a->gen};
}

static struct agg_table *agg_grow(struct locus_xslot *s, struct agg_table *t) {
  uint32_t cap = t ? t->cap * 2 : AGG_FIRST;
  if (cap > AGG_MAX) return NULL;
  struct agg_table *n = agg_new(cap, t);
  if (!n) return NULL;
  if (t) {
    for (uint32_t i = 0; i < t->cap; i++) {
      if (!t->e[i].line) continue;
      struct agg_key k = key_of(&t->e[i]);
      *agg_find(n, &k) = t->e[i];
      n->n++;
    }
  }
  atomic_store_explicit(&s->agg, n, memory_order_release);
  return n;
}

#define FLUSH_MS 100 /* see flush_own */
#define FLUSH_MAX_MS 10000
static uint64_t flush_ticks = UINT64_MAX, flush_max_ticks = UINT64_MAX;
static void flush_own(struct locus_xslot *s, uint64_t now);

/* One transfer src -> this thread of line `ln`. */
static __attribute__((noinline)) void transfer(struct locus_xthread *x, uint32_t gen, uint64_t ln,
                                               uint64_t wip, uint64_t wbytes, uint64_t mine,
                                               uint32_t off, uint32_t len, uint32_t fl,
                                               uint64_t ip) {
  struct locus_xslot *s = x->slot;
  if (!s) return;
  /* A signal handler's accesses meanwhile take the slow path (empty cache) and are skipped. */
  uint64_t key = x->key;
  x->key = 0;
  x->busy = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  uint32_t src = (uint32_t)(wip >> 48);
  struct agg_key k = {
      ln, src, (wbytes & mine) != 0, (int16_t)(cpu_of[src] - 1), -1, off / 8 > 255 ? 255 : off / 8,
      gen};
  int cpu = sched_getcpu(); /* glibc reads it from rseq: no system call */
  if (cpu >= 0 && cpu < INT16_MAX) k.dst_cpu = (int16_t)cpu;
  struct agg_table *t = atomic_load_explicit(&s->agg, memory_order_relaxed);
  if (!t || t->n * 2 >= t->cap) {
    struct agg_table *n = agg_grow(s, t);
    if (!n && (!t || t->n + 1 >= t->cap)) {
      s->dropped++;
      goto out;
    }
    if (n) t = n;
  }
  struct agg *a = agg_find(t, &k);
  if (!a->line) {
    a->src_serial = src;
    a->is_true = (uint8_t)k.is_true;
    a->src_cpu = k.src_cpu;
    a->dst_cpu = k.dst_cpu;
    a->dst_word = (uint8_t)k.word;
    a->gen = gen;
    a->line = ln;
    t->n++;
  }
  a->count++;
  uint64_t now = locus_ticks();
  a->t = now;
  a->src_ip = wip & IP_MASK;
  a->dst_ip = ip;
  a->dst_flags = fl;
  envelope(wbytes, &a->src_off, &a->src_len);
  a->dst_off = (uint8_t)(off > 255 ? 255 : off);
  a->dst_len = (uint8_t)(len > 255 ? 255 : len);
  if (now - s->flushed > s->flush_gap) flush_own(s, now);
out:
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  x->busy = 0;
  x->key = key;
}

static void flush_slot(struct locus_xslot *s) {
  struct agg_table *t = atomic_load_explicit(&s->agg, memory_order_acquire);
  if (!t) return;
  for (uint32_t i = 0; i < t->cap; i++) {
    struct agg *a = &t->e[i];
    if (!a->line || !a->count) continue;
    struct locus_comm_event e;
    memset(&e, 0, sizeof e);
    e.t = a->t;
    e.line = a->line << locus_xg.lshift;
    e.src_ip = a->src_ip;
    e.dst_ip = a->dst_ip;
    e.volume = (double)a->count;
    e.src_tid = a->src_serial < (1u << 16) ? tid_of[a->src_serial] : 0;
    e.dst_tid = s->tid;
    e.src_cpu = a->src_cpu;
    e.dst_cpu = a->dst_cpu;
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

/* A running thread writes its aggregates out every FLUSH_MS and starts them again: an
 * aggregate's time then places its transfers within FLUSH_MS (a block freed and another
 * allocated at its address got the earlier one's transfers: attribution is by time), and
 * a killed process loses at most that much. proc_fini skips a slot the owner is flushing. */
static void flush_own(struct locus_xslot *s, uint64_t now) {
  s->flushed = now;
  /* The period doubles up to FLUSH_MAX_MS: the records of a long run stay bounded (a
   * window's aggregates are written each time), its start stays finely placed. */
  if (s->flush_gap < flush_max_ticks) s->flush_gap *= 2;
  int expect = XS_LIVE;
  if (!atomic_compare_exchange_strong(&s->state, &expect, XS_FLUSHING)) return;
  flush_slot(s);
  struct agg_table *t = atomic_load_explicit(&s->agg, memory_order_relaxed);
  if (t) {
    memset(t->e, 0, (size_t)t->cap * sizeof *t->e);
    t->n = 0;
  }
  s->dropped = 0;
  atomic_store(&s->state, XS_LIVE);
}

static void free_tables(struct locus_xslot *s) {
  struct agg_table *t = atomic_exchange(&s->agg, NULL);
  while (t) {
    struct agg_table *o = t->older;
    locus_sys_munmap(t, t->bytes);
    t = o;
  }
  s->dropped = 0;
}

/* ---- the access path ---- */

#define COLD __attribute__((noinline, cold))

/* The process is ending and the model is off: forget the cached block (the fast path then
 * calls the slow path, which forwards); 1 when so. */
static inline int model_off(struct locus_xthread *x) {
  if (LOCUS_LIKELY(locus_xg.on)) return 0;
  x->key = 0;
  return 1;
}

/* {wip, bytes} of e: replaced together by cas16, read as a pair whose wip did not change
 * meanwhile. */
static inline uint64_t pair_of(struct locus_xshadow *e, uint64_t *bytes) {
  for (int i = 0;; i++) {
    uint64_t w = atomic_load_explicit(&e->wip, memory_order_acquire);
    *bytes = atomic_load_explicit(&e->bytes, memory_order_acquire);
    if (atomic_load_explicit(&e->wip, memory_order_acquire) == w || i == 8) return w;
  }
}

LOCUS_EXPORT COLD void locus_x_read_miss(struct locus_xthread *x, struct locus_xshadow *e,
                                         uint64_t ln, uint32_t off, uint32_t len, uint32_t fl,
                                         uint64_t ip) {
  if (model_off(x)) return;
  if (!x->bit) {
    x->skipped++;
    return;
  }
  uint64_t b, w = pair_of(e, &b);
  uint32_t ws = (uint32_t)(w >> 48);
  if (ws && ws != x->serial)
    transfer(x, (uint32_t)atomic_load_explicit(&e->gen, memory_order_relaxed), ln, w, b,
             locus_x_granules(off, len), off, len, fl, ip);
  atomic_fetch_or_explicit(&e->copies, x->bit, memory_order_relaxed);
}

/* A store to a line this thread did not write last or does not hold alone: a write miss. */
LOCUS_EXPORT COLD void locus_x_write_other(struct locus_xthread *x, struct locus_xshadow *e,
                                           uint64_t ln, uint32_t off, uint32_t len, uint32_t fl,
                                           uint64_t ip) {
  if (model_off(x)) return;
  uint64_t mine = locus_x_granules(off, len);
  uint64_t b, w = pair_of(e, &b);
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  uint32_t ws = (uint32_t)(w >> 48);
  if (ws && ws != x->serial && x->bit && !(c & x->bit))
    transfer(x, (uint32_t)atomic_load_explicit(&e->gen, memory_order_relaxed), ln, w, b, mine, off,
             len, fl, ip);
  if (x->serial) {
    int cpu = sched_getcpu();
    int16_t v = (int16_t)(cpu >= 0 && cpu < INT16_MAX - 1 ? cpu + 1 : 0);
    if (cpu_of[x->serial] != v) cpu_of[x->serial] = v;
  }
  /* A new modified epoch: T is the only holder, its bytes are the written ones. */
  atomic_store_explicit(&e->copies, x->bit, memory_order_relaxed);
  while (!locus_x_cas16(e, w, b, x->token | (ip & IP_MASK), mine)) w = pair_of(e, &b);
}

/* A store by the line's last writer and only holder that adds bytes to its epoch (the hit
 * path's rare case): added only while the epoch is still this thread's; if another thread
 * took the line meanwhile, the store is a write miss. */
LOCUS_EXPORT COLD void locus_x_add_bytes(struct locus_xthread *x, struct locus_xshadow *e,
                                         uint64_t ln, uint32_t off, uint32_t len, uint32_t fl,
                                         uint64_t ip) {
  if (model_off(x)) return;
  uint64_t mine = locus_x_granules(off, len);
  for (;;) {
    uint64_t b, w = pair_of(e, &b);
    if ((w & LOCUS_X_WRITER) != x->token ||
        atomic_load_explicit(&e->copies, memory_order_relaxed) != x->bit) {
      locus_x_write_other(x, e, ln, off, len, fl, ip);
      return;
    }
    if ((b | mine) == b || locus_x_cas16(e, w, b, w, b | mine)) return;
  }
}

static int thread_enter(struct locus_xthread *x);

/* Everything the fast path does not take: untracked or busy threads, the first access to a
 * line (shadow table walk; fills the cache), accesses spanning lines, ranges. */
LOCUS_EXPORT __attribute__((noinline)) void locus_x_slow(uintptr_t a, uint64_t len, uint32_t fl,
                                                         uint64_t ip) {
  struct locus_xthread *x = &locus_xt;
  int on = locus_xg.on;
  int numa = atomic_load_explicit(&locus_numa_exact_on, memory_order_relaxed);
  if (LOCUS_UNLIKELY(numa)) locus_numa_exact_access(a, len, fl, ip);
  if (LOCUS_UNLIKELY(on == LOCUS_X_OFF)) return;
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
    uint32_t off = (uint32_t)(a & locus_xg.lmask);
    uint64_t n = locus_xg.line - off;
    if (n > end - a) n = end - a;
    uint64_t ln = a >> locus_xg.lshift;
    struct locus_xshadow *e = shadow_of(ln);
    if (LOCUS_UNLIKELY(!e)) {
      x->skipped++;
    } else {
      /* The fast path's cache: 64-byte lines and no numa counting only (fast.h). */
      if (on == LOCUS_X_ON64 && !numa) {
        x->b = e - (ln & ((1u << L2_BITS) - 1));
        x->key = ~(ln >> L2_BITS);
      }
      locus_x_line(x, e, ln, off, (uint32_t)n, fl, ip, 0);
    }
    a += n;
  }
}

/* The access's instruction address: inside the hook's call instruction (its return address
 * - 1), which carries the access's line; the return address itself is the next instruction,
 * often of the next line (a loop's back edge, the next statement). */
#define RA ((uint64_t)__builtin_return_address(0) - 1)

/* ---- -fsanitize=thread (gcc and clang), hooks called through the GOT ---- */

LOCUS_X_TSAN_HOOKS(LOCUS_EXPORT, RA)

/* 16-byte atomics (gcc and clang emit __tsan_atomic128_* for __int128 atomics): done with
 * lock cmpxchg16b here, not with the __atomic builtins, which would need libatomic. A load
 * is a compare-and-swap of 0 with 0 (it writes only what is there). */
typedef unsigned __int128 u128;

static inline int cas128(volatile u128 *a, u128 *expected, u128 desired) {
  uint64_t lo = (uint64_t)*expected, hi = (uint64_t)(*expected >> 64);
  unsigned char ok;
  __asm__ __volatile__("lock cmpxchg16b %[m]\n\tsete %[ok]"
                       : [ok] "=q"(ok), [m] "+m"(*a), "+a"(lo), "+d"(hi)
                       : "b"((uint64_t)desired), "c"((uint64_t)(desired >> 64))
                       : "memory", "cc");
  *expected = (u128)hi << 64 | lo;
  return ok;
}

static inline u128 load128(volatile u128 *a) {
  u128 v = 0;
  cas128(a, &v, 0);
  return v;
}

#define RMW128(name, expr)                                                      \
  LOCUS_EXPORT u128 __tsan_atomic128_##name(volatile u128 *a, u128 v, int mo) { \
    (void)mo;                                                                   \
    locus_x_access(a, 16, LOCUS_X_STORE | LOCUS_X_ATOMIC, RA);                  \
    u128 old = load128(a);                                                      \
    while (!cas128(a, &old, (expr))) {                                          \
    }                                                                           \
    return old;                                                                 \
  }
RMW128(exchange, v)
RMW128(fetch_add, old + v)
RMW128(fetch_sub, old - v)
RMW128(fetch_and, old &v)
RMW128(fetch_or, old | v)
RMW128(fetch_xor, old ^ v)
RMW128(fetch_nand, ~(old &v))

LOCUS_EXPORT u128 __tsan_atomic128_load(const volatile u128 *a, int mo) {
  (void)mo;
  locus_x_access(a, 16, LOCUS_X_ATOMIC, RA);
  return load128((volatile u128 *)a);
}

LOCUS_EXPORT void __tsan_atomic128_store(volatile u128 *a, u128 v, int mo) {
  (void)mo;
  locus_x_access(a, 16, LOCUS_X_STORE | LOCUS_X_ATOMIC, RA);
  u128 old = load128(a);
  while (!cas128(a, &old, v)) {
  }
}

/* Strong and weak alike: cmpxchg16b does not fail spuriously. */
#define CAS128_HOOK(name)                                                                      \
  LOCUS_EXPORT int __tsan_atomic128_compare_exchange_##name(volatile u128 *a, u128 *c, u128 v, \
                                                            int mo, int fmo) {                 \
    (void)mo;                                                                                  \
    (void)fmo;                                                                                 \
    locus_x_access(a, 16, LOCUS_X_STORE | LOCUS_X_ATOMIC, RA);                                 \
    return cas128(a, c, v);                                                                    \
  }
CAS128_HOOK(strong)
CAS128_HOOK(weak)

LOCUS_EXPORT u128 __tsan_atomic128_compare_exchange_val(volatile u128 *a, u128 c, u128 v, int mo,
                                                        int fmo) {
  (void)mo;
  (void)fmo;
  locus_x_access(a, 16, LOCUS_X_STORE | LOCUS_X_ATOMIC, RA);
  cas128(a, &c, v);
  return c;
}

/* ThreadSanitizer's annotation interface (<sanitizer/tsan_interface.h>) and the dynamic
 * annotations libtsan also defines (abseil's, folly's, Valgrind's ANNOTATE_* under
 * __SANITIZE_THREAD__, which `locus cc` defines): they tell a race detector about
 * synchronisation it cannot see. The cache-line model needs none of it: accepted and
 * ignored, so that such code links. */
static char fiber_token;
#define LOCUS_X_IGNORED(name) \
  LOCUS_EXPORT void name(void) {}
LOCUS_X_IGNORED(__tsan_acquire)
LOCUS_X_IGNORED(__tsan_release)
LOCUS_X_IGNORED(__tsan_mutex_create)
LOCUS_X_IGNORED(__tsan_mutex_destroy)
LOCUS_X_IGNORED(__tsan_mutex_pre_lock)
LOCUS_X_IGNORED(__tsan_mutex_post_lock)
LOCUS_X_IGNORED(__tsan_mutex_post_unlock)
LOCUS_X_IGNORED(__tsan_mutex_pre_signal)
LOCUS_X_IGNORED(__tsan_mutex_post_signal)
LOCUS_X_IGNORED(__tsan_mutex_pre_divert)
LOCUS_X_IGNORED(__tsan_mutex_post_divert)
LOCUS_X_IGNORED(__tsan_external_register_header)
LOCUS_X_IGNORED(__tsan_external_assign_tag)
LOCUS_X_IGNORED(__tsan_external_read)
LOCUS_X_IGNORED(__tsan_external_write)
LOCUS_X_IGNORED(__tsan_destroy_fiber)
LOCUS_X_IGNORED(__tsan_switch_to_fiber)
LOCUS_X_IGNORED(__tsan_set_fiber_name)
LOCUS_X_IGNORED(__tsan_on_initialize)
LOCUS_X_IGNORED(__tsan_flush_memory)
LOCUS_X_IGNORED(AnnotateHappensBefore)
LOCUS_X_IGNORED(AnnotateHappensAfter)
LOCUS_X_IGNORED(AnnotateCondVarSignal)
LOCUS_X_IGNORED(AnnotateCondVarSignalAll)
LOCUS_X_IGNORED(AnnotateMutexIsNotPHB)
LOCUS_X_IGNORED(AnnotateCondVarWait)
LOCUS_X_IGNORED(AnnotateRWLockCreate)
LOCUS_X_IGNORED(AnnotateRWLockCreateStatic)
LOCUS_X_IGNORED(AnnotateRWLockDestroy)
LOCUS_X_IGNORED(AnnotateRWLockAcquired)
LOCUS_X_IGNORED(AnnotateRWLockReleased)
LOCUS_X_IGNORED(AnnotateTraceMemory)
LOCUS_X_IGNORED(AnnotateFlushState)
LOCUS_X_IGNORED(AnnotateNewMemory)
LOCUS_X_IGNORED(AnnotateNoOp)
LOCUS_X_IGNORED(AnnotateFlushExpectedRaces)
LOCUS_X_IGNORED(AnnotateEnableRaceDetection)
LOCUS_X_IGNORED(AnnotateMutexIsUsedAsCondVar)
LOCUS_X_IGNORED(AnnotatePCQGet)
LOCUS_X_IGNORED(AnnotatePCQPut)
LOCUS_X_IGNORED(AnnotatePCQDestroy)
LOCUS_X_IGNORED(AnnotatePCQCreate)
LOCUS_X_IGNORED(AnnotateExpectRace)
LOCUS_X_IGNORED(AnnotateBenignRaceSized)
LOCUS_X_IGNORED(AnnotateBenignRace)
LOCUS_X_IGNORED(AnnotateIgnoreReadsBegin)
LOCUS_X_IGNORED(AnnotateIgnoreReadsEnd)
LOCUS_X_IGNORED(AnnotateIgnoreWritesBegin)
LOCUS_X_IGNORED(AnnotateIgnoreWritesEnd)
LOCUS_X_IGNORED(AnnotateIgnoreSyncBegin)
LOCUS_X_IGNORED(AnnotateIgnoreSyncEnd)
LOCUS_X_IGNORED(AnnotatePublishMemoryRange)
LOCUS_X_IGNORED(AnnotateUnpublishMemoryRange)
LOCUS_X_IGNORED(AnnotateThreadName)
LOCUS_X_IGNORED(AnnotateMemoryIsInitialized)
LOCUS_X_IGNORED(AnnotateMemoryIsUninitialized)
LOCUS_EXPORT int __tsan_mutex_pre_unlock(void) { return 0; }
LOCUS_EXPORT int __tsan_on_finalize(int failed) { return failed; }
LOCUS_EXPORT void *__tsan_external_register_tag(void) { return &fiber_token; }
LOCUS_EXPORT void *__tsan_get_current_fiber(void) { return &fiber_token; }
LOCUS_EXPORT void *__tsan_create_fiber(void) { return &fiber_token; }

/* ---- memcpy, memmove, memset of instrumented code (`locus cc` links with
 * -Wl,--wrap=memcpy,...): neither compiler instruments the calls (libtsan intercepts them),
 * so each is a read of the source range and a write of the destination range here, then
 * libc's function (this library is not linked with --wrap: the names below are libc's). */

static inline void ranges(const void *src, void *dst, size_t n, uint64_t ip) {
  if (n == 0) return;
  if (src) locus_x_slow((uintptr_t)src, n, 0, ip); /* returns at once when not recording */
  locus_x_slow((uintptr_t)dst, n, LOCUS_X_STORE, ip);
}

LOCUS_EXPORT void *__wrap_memcpy(void *d, const void *s, size_t n) {
  ranges(s, d, n, RA);
  return memcpy(d, s, n);
}

LOCUS_EXPORT void *__wrap_memmove(void *d, const void *s, size_t n) {
  ranges(s, d, n, RA);
  return memmove(d, s, n);
}

LOCUS_EXPORT void *__wrap_memset(void *d, int c, size_t n) {
  ranges(NULL, d, n, RA);
  return memset(d, c, n);
}

/* _FORTIFY_SOURCE's checked variants, as glibc's (debug/memcpy_chk.c): an overflow aborts
 * through __chk_fail. Not by calling glibc's __memcpy_chk: it is an IFUNC, and binding it at load
 * (this library is linked -z now) runs its resolver, which faults 64 KiB of libc's code into
 * every recorded program, instrumented or not. */
extern void __chk_fail(void) __attribute__((noreturn));

LOCUS_EXPORT void *__wrap___memcpy_chk(void *d, const void *s, size_t n, size_t dn) {
  if (n > dn) __chk_fail();
  ranges(s, d, n, RA);
  return memcpy(d, s, n);
}

LOCUS_EXPORT void *__wrap___memmove_chk(void *d, const void *s, size_t n, size_t dn) {
  if (n > dn) __chk_fail();
  ranges(s, d, n, RA);
  return memmove(d, s, n);
}

LOCUS_EXPORT void *__wrap___memset_chk(void *d, int c, size_t n, size_t dn) {
  if (n > dn) __chk_fail();
  ranges(NULL, d, n, RA);
  return memset(d, c, n);
}

/* ---- life cycle ---- */

static struct locus_xslot *claim_slot(uint32_t *index) {
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
  struct locus_xthread *x = &locus_xt;
  memset(x, 0, sizeof *x); /* also empties the line cache */
  xt_spare = NULL;
  x->state = 2;
  uint32_t serial = locus_me.serial;
  uint32_t index = 0;
  struct locus_xslot *s = serial && serial < (1u << 16) ? claim_slot(&index) : NULL;
  if (!s) { /* said in the thread's record: the report counts such threads */
    locus_ct.st.flags |= LOCUS_CT_UNTRACKED;
    return;
  }
  s->tid = locus_me.tid;
  s->serial = serial;
  s->dropped = 0;
  s->flushed = locus_ticks();
  s->flush_gap = flush_ticks;
  s->x = x;
  s->ct = &locus_ct;
  atomic_store(&s->agg, NULL);
  tid_of[serial] = locus_me.tid;
  x->serial = serial;
  x->token = (uint64_t)serial << 48;
  x->bit = index < XS_BITS ? 1ull << index : 0;
  x->slot = s;
  x->state = 1;
}

/* First access of a thread the runtime has not registered yet (adopted threads). */
static int thread_enter(struct locus_xthread *x) {
  if (x->state == 2 || locus_me.guard || locus_me.state == 2) return 0;
  if (locus_me.state != 1) {
    locus_self_get(); /* registers the thread: the lens calls thread_init */
    if (x->state != 1) x->state = 2;
  } else if (x->state == 0) {
    x->state = 2; /* registered before the lens was on: not tracked */
  }
  return x->state == 1;
}

/* A thread's access counters into its comm record (x and ct: the thread's own, or those of
 * a thread still running at exit, read as they are). */
static void publish_counts(struct locus_xthread *x, struct locus_comm_tls *ct) {
  ct->st.samples += x->accesses;
  ct->st.skipped += x->skipped;
  if (x->state == 1 && !x->bit) ct->st.flags |= LOCUS_CT_NO_COPY_BIT;
  ct->st.period_ns = 0;
  x->accesses = x->skipped = 0;
}

static void thread_fini(void) {
  struct locus_xthread *x = &locus_xt;
  if (x->state != 1) {
    x->state = 2;
    return;
  }
  x->key = 0;
  x->busy = 1;
  struct locus_xslot *s = x->slot;
  int expect = XS_LIVE;
  if (s && atomic_compare_exchange_strong(&s->state, &expect, XS_FLUSHING)) {
    flush_slot(s);
    free_tables(s);
    atomic_store(&s->state, XS_FREE);
    publish_counts(x, &locus_ct);
  } else if (!s) {
    publish_counts(x, &locus_ct);
  } else {
    /* The process is exiting and proc_fini took this thread's counters: it reads and
     * writes this thread's TLS until it sets the slot FREE, so wait for that. */
    while (atomic_load(&s->state) == XS_FLUSHING) sched_yield();
  }
  x->state = 2;
  x->busy = 0;
}

static void proc_fini(void) {
  locus_xg.on = 0;
  struct locus_xthread *x = &locus_xt;
  x->key = 0;
  x->busy = 1;
  if (x->state == 1) publish_counts(x, &locus_ct);
  uint32_t hi = atomic_load(&slots_hi);
  if (hi > XS_MAX) hi = XS_MAX;
  /* This thread's aggregates and those of the threads still running, with their access
   * counters (an OpenMP pool, unjoined workers: comm.c writes their records next). */
  for (uint32_t i = 0; i < hi; i++) {
    int expect = XS_LIVE;
    if (!atomic_compare_exchange_strong(&slots[i].state, &expect, XS_FLUSHING)) continue;
    flush_slot(&slots[i]);
    if (slots[i].x && slots[i].x != x) publish_counts(slots[i].x, slots[i].ct);
    atomic_store(&slots[i].state, XS_FREE); /* its owner, ending meanwhile, may go on */
  }
  uint64_t lost = atomic_load(&shadow_lost_blocks);
  if (lost) locus_warn("comm exact: the shadow memory budget (LOCUS_EXACT_SHADOW_MB) ran out");
  x->state = 2;
  x->busy = 0;
}

static int setup_shadow(void) {
  uint32_t line = locus_comm_cfg.line;
  locus_xg.line = line;
  locus_xg.lshift = (uint32_t)__builtin_ctz(line);
  locus_xg.lmask = line - 1;
  locus_xg.gshift = locus_xg.lshift > 6 ? locus_xg.lshift - 6 : 0;
  locus_xg.bshift = locus_xg.lshift + L2_BITS;
  uint32_t l1_bits = ADDR_BITS - locus_xg.lshift - L2_BITS;
  locus_xg.l1_n = 1ull << l1_bits;
  l1_bytes = (size_t)locus_xg.l1_n * sizeof(void *);
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
  locus_xg.l1 = l1;
  pool = p;
  atomic_store(&pool_next, 0);
  atomic_store(&shadow_lost_blocks, 0);
  return 0;
}

static int proc_init(void) {
  if (setup_shadow() != 0) return -1;
  flush_ticks = (uint64_t)(FLUSH_MS * 1000.0 * locus_ticks_per_us);
  flush_max_ticks = (uint64_t)(FLUSH_MAX_MS * 1000.0 * locus_ticks_per_us);
  memset(slots, 0, sizeof slots);
  atomic_store(&slots_hi, 0);
  /* The numa lens alone (no detection asked): its own hook only, no cache-line model. */
  locus_xg.on = !locus_comm_cfg.detect ? LOCUS_X_OFF
                : locus_xg.line == 64  ? LOCUS_X_ON64
                                       : LOCUS_X_ON;
  return 0;
}

static void after_fork(void) {
  /* The child starts from an empty model: only the forking thread lives on, and thread
   * serials start again at 1. The parent's shadow is dropped (copy-on-write pages). */
  locus_xg.on = 0;
  if (locus_xg.l1) munmap((void *)locus_xg.l1, l1_bytes);
  if (pool) munmap(pool, pool_bytes);
  locus_xg.l1 = NULL;
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
