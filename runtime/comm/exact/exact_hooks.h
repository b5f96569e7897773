/* The hit path of the `exact` backend and the instrumentation hooks, shared by two builds:
 *   - exact.c (inside liblocus.so) includes it for the model's state, the fast path and the
 *     exported hooks (used by programs linked without the hooks object);
 *   - `locus cc` links every instrumented program with build/locus_exact_hooks.o, this file
 *     compiled alone with -DLOCUS_EXACT_PROGRAM: the same hooks, hidden in the program, so the
 *     instrumented code calls them directly (no PLT) and a hit never enters liblocus.so.
 * Both read the one state liblocus.so exports (locus_exact_v1_g, the initial-exec TLS
 * locus_exact_v1_xt) and take the same slow path (locus_exact_v1_slow / _line_miss), so the
 * per-thread block cache has one set of semantics wherever the hook runs. The _v1 suffix is
 * the layout version: change it with any change to the structures below.
 *
 * When liblocus.so is loaded but the lens is off (or the program runs without `locus
 * record`), g.on is 0 and every hook returns at once. */
#ifndef LOCUS_EXACT_HOOKS_H
#define LOCUS_EXACT_HOOKS_H

#include "../comm.h"

#define L2_BITS 16 /* lines per second-level block: 2^16 (4 MiB of memory with 64-byte lines) */
#define L2_MASK ((1u << L2_BITS) - 1)

struct shadow {
  _Atomic uint64_t wip;    /* writer serial << 48 | pc of its last write; 0 = never written */
  _Atomic uint64_t bytes;  /* granules written by the writer since it took the line */
  _Atomic uint64_t copies; /* slots holding a copy since the last write */
};

struct xslot;

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
struct xglobal {
  volatile int on;
  uint32_t lshift;
  uint64_t lmask;
  uint32_t line, gshift;
  uint32_t bshift; /* lshift + L2_BITS: address >> bshift = second-level block */
  _Atomic(struct shadow *) *l1;
  uint64_t l1_n;
} __attribute__((aligned(64)));

#define XH_EXPORT __attribute__((visibility("default")))
extern XH_EXPORT struct xglobal locus_exact_v1_g;
extern XH_EXPORT __thread struct xthread locus_exact_v1_xt
    __attribute__((tls_model("initial-exec")));
/* Every access the hit path does not take (exported by liblocus.so). */
XH_EXPORT void locus_exact_v1_slow(uintptr_t a, uint64_t len, uint32_t fl, uint64_t ip);
/* A miss on a line of the cached block: e is its shadow entry. */
XH_EXPORT void locus_exact_v1_line_miss(struct shadow *e, uint64_t ln, uint32_t off, uint32_t len,
                                        uint32_t fl, uint64_t ip);
XH_EXPORT void __tsan_read_range(void *p, unsigned long size);
XH_EXPORT void __tsan_write_range(void *p, unsigned long size);

#define g locus_exact_v1_g
#define xt locus_exact_v1_xt

#define XH_INLINE inline __attribute__((always_inline))

#ifdef LOCUS_EXACT_PROGRAM
#define XH_HOOK __attribute__((visibility("hidden")))
#define XH_LINE_MISS(x, e, ln, off, len, fl, ip) locus_exact_v1_line_miss(e, ln, off, len, fl, ip)
#define XH_SLOW locus_exact_v1_slow
#else
#define XH_HOOK XH_EXPORT
static void xh_line_miss(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                         uint32_t len, uint32_t fl, uint64_t ip);
static void access_slow(uintptr_t a, uint64_t len, uint32_t fl, uint64_t ip);
#define XH_LINE_MISS xh_line_miss
#define XH_SLOW access_slow
#endif

/* Granule mask of bytes [off, off + len) of a line (off + len <= line). */
static XH_INLINE uint64_t granules(uint32_t off, uint32_t len) {
  /* Lines of <= 64 bytes (a granule is a byte): len is a constant in the hooks. */
  if (LOCUS_LIKELY(g.gshift == 0 && len < 64)) return ((1ull << len) - 1) << off;
  uint32_t a = off >> g.gshift, b = (off + len - 1) >> g.gshift;
  uint32_t n = b - a + 1;
  return (n >= 64 ? ~0ull : ((1ull << n) - 1)) << a;
}

/* An access inside one line whose shadow entry is e (l64: lines are 64 bytes). Hits (a read
 * of a line this thread holds; a write from the same pc as its last one to a line it last
 * wrote and holds alone) touch only e and return. */
static XH_INLINE void line_access(struct xthread *x, struct shadow *e, uint64_t ln, uint32_t off,
                                  uint32_t len, uint32_t fl, uint64_t ip, int l64) {
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  if (!(fl & LOCUS_AC_STORE)) {
    if (LOCUS_LIKELY(c & x->bit)) return; /* holds a copy: a cache hit */
  } else {
    uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
    if (LOCUS_LIKELY((w == (x->token | ip)) & (c == x->bit))) {
      /* Already the modified, only copy, same pc: a hit; remember the bytes. */
      uint64_t mine = l64 ? ((1ull << len) - 1) << off : granules(off, len);
      uint64_t b = atomic_load_explicit(&e->bytes, memory_order_relaxed);
      if (LOCUS_UNLIKELY((b | mine) != b))
        atomic_store_explicit(&e->bytes, b | mine, memory_order_relaxed);
      return;
    }
  }
  XH_LINE_MISS(x, e, ln, off, len, fl, ip);
}

static XH_INLINE void x_access(const volatile void *p, uint32_t len, uint32_t fl, uint64_t ip) {
  int on = g.on;
  struct xthread *x = &xt;
  uintptr_t a = (uintptr_t)p;
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
  XH_SLOW(a, len, fl, ip);
}

#define RA ((uint64_t)__builtin_return_address(0))

/* ---- gcc -fsanitize=thread ---- */

#define TSAN_RW(n)                                                                           \
  XH_HOOK void __tsan_read##n(void *p) { x_access(p, n, 0, RA); }                            \
  XH_HOOK void __tsan_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }              \
  XH_HOOK void __tsan_volatile_read##n(void *p) { x_access(p, n, 0, RA); }                   \
  XH_HOOK void __tsan_volatile_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }     \
  XH_HOOK void __tsan_read##n##_pc(void *p, void *pc) { x_access(p, n, 0, (uint64_t)pc); }   \
  XH_HOOK void __tsan_write##n##_pc(void *p, void *pc) {                                     \
    x_access(p, n, LOCUS_AC_STORE, (uint64_t)pc);                                            \
  }
TSAN_RW(1)
TSAN_RW(2)
TSAN_RW(4)
TSAN_RW(8)
TSAN_RW(16)

#define TSAN_UNALIGNED(n)                                                   \
  XH_HOOK void __tsan_unaligned_read##n(void *p) { x_access(p, n, 0, RA); } \
  XH_HOOK void __tsan_unaligned_write##n(void *p) { x_access(p, n, LOCUS_AC_STORE, RA); }
TSAN_UNALIGNED(2)
TSAN_UNALIGNED(4)
TSAN_UNALIGNED(8)
TSAN_UNALIGNED(16)

XH_HOOK void __tsan_vptr_read(void **p) { x_access(p, 8, 0, RA); }
XH_HOOK void __tsan_vptr_update(void **p, void *v) {
  (void)v;
  x_access(p, 8, LOCUS_AC_STORE, RA);
}

/* Atomics: the access is recorded (loads as loads, everything else as a store with
 * LOCUS_AC_ATOMIC), then the operation is done with sequential consistency, which is at
 * least as strong as any order the program asked for. */
#define SC __ATOMIC_SEQ_CST
#define ST (LOCUS_AC_STORE | LOCUS_AC_ATOMIC)
#define TSAN_ATOMIC(n, T)                                                                        \
  XH_HOOK T __tsan_atomic##n##_load(const volatile T *a, int mo) {                               \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), LOCUS_AC_ATOMIC, RA);                                                 \
    return __atomic_load_n(a, SC);                                                               \
  }                                                                                              \
  XH_HOOK void __tsan_atomic##n##_store(volatile T *a, T v, int mo) {                            \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    __atomic_store_n(a, v, SC);                                                                  \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_exchange(volatile T *a, T v, int mo) {                            \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_exchange_n(a, v, SC);                                                        \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_add(volatile T *a, T v, int mo) {                           \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_add(a, v, SC);                                                         \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_sub(volatile T *a, T v, int mo) {                           \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_sub(a, v, SC);                                                         \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_and(volatile T *a, T v, int mo) {                           \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_and(a, v, SC);                                                         \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_or(volatile T *a, T v, int mo) {                            \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_or(a, v, SC);                                                          \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_xor(volatile T *a, T v, int mo) {                           \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_xor(a, v, SC);                                                         \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_fetch_nand(volatile T *a, T v, int mo) {                          \
    (void)mo;                                                                                    \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_fetch_nand(a, v, SC);                                                        \
  }                                                                                              \
  XH_HOOK int __tsan_atomic##n##_compare_exchange_strong(volatile T *a, T *c, T v, int mo,       \
                                                         int fmo) {                              \
    (void)mo;                                                                                    \
    (void)fmo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_compare_exchange_n(a, c, v, 0, SC, SC);                                      \
  }                                                                                              \
  XH_HOOK int __tsan_atomic##n##_compare_exchange_weak(volatile T *a, T *c, T v, int mo,         \
                                                       int fmo) {                                \
    (void)mo;                                                                                    \
    (void)fmo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                              \
    return __atomic_compare_exchange_n(a, c, v, 1, SC, SC);                                      \
  }                                                                                              \
  XH_HOOK T __tsan_atomic##n##_compare_exchange_val(volatile T *a, T c, T v, int mo, int fmo) {  \
    (void)mo;                                                                                    \
    (void)fmo;                                                                                   \
    x_access(a, sizeof(T), ST, RA);                                                              \
    __atomic_compare_exchange_n(a, &c, v, 0, SC, SC);                                            \
    return c;                                                                                    \
  }
TSAN_ATOMIC(8, uint8_t)
TSAN_ATOMIC(16, uint16_t)
TSAN_ATOMIC(32, uint32_t)
TSAN_ATOMIC(64, uint64_t)

/* ---- clang -fsanitize-coverage=trace-loads,trace-stores ---- */

#define SANCOV(n, T)                                                    \
  XH_HOOK void __sanitizer_cov_load##n(T *p) { x_access(p, n, 0, RA); } \
  XH_HOOK void __sanitizer_cov_store##n(T *p) { x_access(p, n, LOCUS_AC_STORE, RA); }
SANCOV(1, uint8_t)
SANCOV(2, uint16_t)
SANCOV(4, uint32_t)
SANCOV(8, uint64_t)
SANCOV(16, unsigned __int128)

#endif
