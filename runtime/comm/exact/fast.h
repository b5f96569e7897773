/* The exact backend's fast path: the cache-line model's hit test, inlined into every hook.
 *
 * Two users: exact.c (liblocus.so's hooks, which the instrumented program calls through its
 * GOT) and runtime/cc/lto_hooks.c, which `locus cc` compiles with the program's own clang
 * and links into it with -flto (LOCUS_CC_LTO=1), so that the hooks are inlined into the
 * program's loops. This header therefore only uses the C11 library and declares what it
 * needs from liblocus.so with default visibility: the model's global and per-thread state
 * and the out-of-line slow paths. Everything the hit test reads is described in exact.c. */
#ifndef LOCUS_EXACT_FAST_H
#define LOCUS_EXACT_FAST_H

#include <stdatomic.h>
#include <stdint.h>

#define LOCUS_X_L2_BITS 16 /* lines per second-level shadow block: 2^16 */
#define LOCUS_X_L2_MASK ((1u << LOCUS_X_L2_BITS) - 1)
#define LOCUS_X_STORE 1u                     /* = LOCUS_AC_STORE (locus_format.h) */
#define LOCUS_X_ATOMIC 4u                    /* = LOCUS_AC_ATOMIC */
#define LOCUS_X_WRITER (~((1ull << 48) - 1)) /* the writer's serial in wip */
#define LOCUS_X_API __attribute__((visibility("default")))
#define LOCUS_X_INLINE static inline __attribute__((always_inline))
#define LOCUS_X_LIKELY(x) __builtin_expect(!!(x), 1)
#define LOCUS_X_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* {wip, bytes} change together, with one 16-byte compare-and-swap (exact.c): written as
 * two stores, a thread that lost the line could leave its own bytes under the new writer's
 * serial, and its next access then read as true sharing with itself (2.7 % of a pure false
 * sharing pair's transfers, 18 % under OpenMP, were). */
struct locus_xshadow {
  _Atomic uint64_t wip;    /* writer serial << 48 | pc of the write that took the line; 0: never */
  _Atomic uint64_t bytes;  /* granules written by the writer since it took the line */
  _Atomic uint64_t copies; /* slots holding a copy since the last write */
  _Atomic uint64_t gen;    /* heap blocks freed over the line: transfers of each block apart
                            * (32 bytes: every entry's {wip, bytes} is 16-byte aligned) */
};

struct locus_xslot;

/* Per thread. The first fields are the fast path's: a one-entry cache of the second-level
 * shadow block of the last access. key = ~(address >> bshift), 0 = empty; it is set only
 * while the thread is tracked, not busy and the block exists, so a key hit implies all three
 * (the fast path checks nothing else). Blocks never move. */
struct locus_xthread {
  uint64_t key;            /* ~(block number) of the cached block; 0 = none */
  struct locus_xshadow *b; /* the block */
  uint64_t accesses;       /* accesses seen */
  uint64_t bit;            /* copy-set bit, 0 if none */
  uint64_t token;          /* serial << 48 */
  uint32_t serial;
  int state; /* 0 unknown, 1 tracking, 2 not tracked */
  int busy;  /* inside the slow path: a signal handler's accesses are skipped */
  struct locus_xslot *slot;
  uint64_t skipped;
};

/* Read by every hook: one cache line, written only at start and end. */
enum { LOCUS_X_OFF = 0, LOCUS_X_ON = 1, LOCUS_X_ON64 = 2 }; /* ON64: 64-byte lines */
struct locus_xglobal {
  volatile int on;
  uint32_t lshift;
  uint64_t lmask;
  uint32_t line, gshift;
  uint32_t bshift; /* lshift + L2_BITS: address >> bshift = second-level block */
  _Atomic(struct locus_xshadow *) *l1;
  uint64_t l1_n;
} __attribute__((aligned(64)));

/* Programs built by `locus cc` compile this layout in (gas.py's offsets, lto_hooks.c): when
 * struct locus_xthread, struct locus_xshadow or the block size change, rename locus_xt (and
 * gas.py's reference to it, e.g. locus_xt_v2), so that a stale build is refused by `locus
 * record` (launcher.check_runtime_abi) instead of being run with the wrong offsets. */
extern LOCUS_X_API struct locus_xglobal locus_xg;
extern LOCUS_X_API __thread struct locus_xthread locus_xt
    __attribute__((tls_model("initial-exec")));
extern LOCUS_X_API _Atomic int locus_numa_exact_on;

LOCUS_X_API void locus_numa_exact_access(uintptr_t a, uint32_t len, uint32_t fl, uint64_t ip);
LOCUS_X_API void locus_x_slow(uintptr_t a, uint64_t len, uint32_t fl, uint64_t ip);
LOCUS_X_API void locus_x_read_miss(struct locus_xthread *x, struct locus_xshadow *e, uint64_t ln,
                                   uint32_t off, uint32_t len, uint32_t fl, uint64_t ip);
LOCUS_X_API void locus_x_write_other(struct locus_xthread *x, struct locus_xshadow *e, uint64_t ln,
                                     uint32_t off, uint32_t len, uint32_t fl, uint64_t ip);
LOCUS_X_API void locus_x_add_bytes(struct locus_xthread *x, struct locus_xshadow *e, uint64_t ln,
                                   uint32_t off, uint32_t len, uint32_t fl, uint64_t ip);

/* Granule mask of bytes [off, off + len) of a line (off + len <= line). */
LOCUS_X_INLINE uint64_t locus_x_granules(uint32_t off, uint32_t len) {
  /* Lines of <= 64 bytes (a granule is a byte): len is a constant in the hooks. */
  if (LOCUS_X_LIKELY(locus_xg.gshift == 0 && len < 64)) return ((1ull << len) - 1) << off;
  uint32_t a = off >> locus_xg.gshift, b = (off + len - 1) >> locus_xg.gshift;
  uint32_t n = b - a + 1;
  return (n >= 64 ? ~0ull : ((1ull << n) - 1)) << a;
}

/* {wip, bytes} of e = {w1, b1} if they are {w0, b0}; 1 if so (lock cmpxchg16b: x86-64,
 * every CPU since 2008; the runtime is x86-64 only). */
LOCUS_X_INLINE int locus_x_cas16(struct locus_xshadow *e, uint64_t w0, uint64_t b0, uint64_t w1,
                                 uint64_t b1) {
  unsigned char ok;
  __asm__ __volatile__("lock cmpxchg16b (%[p])\n\tsete %[ok]"
                       : [ok] "=q"(ok), "+a"(w0), "+d"(b0)
                       : [p] "r"(&e->wip), "b"(w1), "c"(b1)
                       : "memory", "cc");
  return ok;
}

/* An access inside one line whose shadow entry is e (l64: lines are 64 bytes). Hits (a read
 * of a line this thread holds; a write to a line it last wrote and holds alone) touch only e
 * and return. */
LOCUS_X_INLINE void locus_x_line(struct locus_xthread *x, struct locus_xshadow *e, uint64_t ln,
                                 uint32_t off, uint32_t len, uint32_t fl, uint64_t ip, int l64) {
  uint64_t c = atomic_load_explicit(&e->copies, memory_order_relaxed);
  if (!(fl & LOCUS_X_STORE)) {
    if (LOCUS_X_LIKELY(c & x->bit)) return; /* holds a copy: a cache hit */
    locus_x_read_miss(x, e, ln, off, len, fl, ip);
    return;
  }
  uint64_t w = atomic_load_explicit(&e->wip, memory_order_relaxed);
  if (LOCUS_X_LIKELY(((w & LOCUS_X_WRITER) == x->token) & (c == x->bit))) {
    /* Already the last writer and the only copy: a hit; remember new bytes (once per
     * field per epoch) with {wip, bytes} as one pair, as long as the pair is still ours. */
    uint64_t mine = l64 ? ((1ull << len) - 1) << off : locus_x_granules(off, len);
    uint64_t b = atomic_load_explicit(&e->bytes, memory_order_relaxed);
    if (LOCUS_X_UNLIKELY((b | mine) != b) && !locus_x_cas16(e, w, b, w, b | mine))
      locus_x_add_bytes(x, e, ln, off, len, fl, ip); /* the pair changed meanwhile */
    return;
  }
  locus_x_write_other(x, e, ln, off, len, fl, ip);
}

/* One access of len bytes at p by the instruction at ip (fl: LOCUS_AC_* flags). The block
 * cache key is set only while the model runs with 64-byte lines and the numa lens's exact
 * counting is off, so a key hit needs no other test; everything else is locus_x_slow's. */
LOCUS_X_INLINE void locus_x_access(const volatile void *p, uint32_t len, uint32_t fl, uint64_t ip) {
  struct locus_xthread *x = &locus_xt;
  uintptr_t a = (uintptr_t)p;
  uint32_t off = (uint32_t)(a & 63);
  if (LOCUS_X_LIKELY((x->key == ~(a >> (6 + LOCUS_X_L2_BITS))) & (off + len <= 64))) {
    x->accesses++;
    locus_x_line(x, &x->b[(a >> 6) & LOCUS_X_L2_MASK], a >> 6, off, len, fl, ip, 1);
    return;
  }
  locus_x_slow(a, len, fl, ip);
}

/* The -fsanitize=thread hooks (gcc and clang compile with them, no libtsan is linked),
 * defined by exact.c with API = default visibility and PC = the return address, and by
 * runtime/cc/lto_hooks.c as inlinable definitions that take their own address. Atomics: the
 * access is recorded (loads as loads, everything else as a store with LOCUS_X_ATOMIC), then
 * the operation is done with sequential consistency, which is at least as strong as any
 * order the program asked for. */
#define LOCUS_X_TSAN_RW(API, PC, n)                                                          \
  API void __tsan_read##n(void *p) { locus_x_access(p, n, 0, PC); }                          \
  API void __tsan_write##n(void *p) { locus_x_access(p, n, LOCUS_X_STORE, PC); }             \
  API void __tsan_volatile_read##n(void *p) { locus_x_access(p, n, 0, PC); }                 \
  API void __tsan_volatile_write##n(void *p) { locus_x_access(p, n, LOCUS_X_STORE, PC); }    \
  API void __tsan_read##n##_pc(void *p, void *pc) { locus_x_access(p, n, 0, (uint64_t)pc); } \
  API void __tsan_write##n##_pc(void *p, void *pc) {                                         \
    locus_x_access(p, n, LOCUS_X_STORE, (uint64_t)pc);                                       \
  }

#define LOCUS_X_TSAN_UNALIGNED(API, PC, n)                                    \
  API void __tsan_unaligned_read##n(void *p) { locus_x_access(p, n, 0, PC); } \
  API void __tsan_unaligned_write##n(void *p) { locus_x_access(p, n, LOCUS_X_STORE, PC); }

/* One atomic read-modify-write hook, __tsan_atomic<n>_fetch_<op>. */
#define LOCUS_X_TSAN_RMW(API, PC, n, T, op)                           \
  API T __tsan_atomic##n##_fetch_##op(volatile T *a, T v, int mo) {   \
    (void)mo;                                                         \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC); \
    return __atomic_fetch_##op(a, v, __ATOMIC_SEQ_CST);               \
  }

#define LOCUS_X_TSAN_ATOMIC(API, PC, n, T)                                                        \
  API T __tsan_atomic##n##_load(const volatile T *a, int mo) {                                    \
    (void)mo;                                                                                     \
    locus_x_access(a, sizeof(T), LOCUS_X_ATOMIC, PC);                                             \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                  \
  }                                                                                               \
  API void __tsan_atomic##n##_store(volatile T *a, T v, int mo) {                                 \
    (void)mo;                                                                                     \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC);                             \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                     \
  }                                                                                               \
  API T __tsan_atomic##n##_exchange(volatile T *a, T v, int mo) {                                 \
    (void)mo;                                                                                     \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC);                             \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                               \
  LOCUS_X_TSAN_RMW(API, PC, n, T, add)                                                            \
  LOCUS_X_TSAN_RMW(API, PC, n, T, sub)                                                            \
  LOCUS_X_TSAN_RMW(API, PC, n, T, and)                                                            \
  LOCUS_X_TSAN_RMW(API, PC, n, T, or)                                                             \
  LOCUS_X_TSAN_RMW(API, PC, n, T, xor)                                                            \
  LOCUS_X_TSAN_RMW(API, PC, n, T, nand)                                                           \
  API int __tsan_atomic##n##_compare_exchange_strong(volatile T *a, T *c, T v, int mo, int fmo) { \
    (void)mo;                                                                                     \
    (void)fmo;                                                                                    \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC);                             \
    return __atomic_compare_exchange_n(a, c, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                               \
  API int __tsan_atomic##n##_compare_exchange_weak(volatile T *a, T *c, T v, int mo, int fmo) {   \
    (void)mo;                                                                                     \
    (void)fmo;                                                                                    \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC);                             \
    return __atomic_compare_exchange_n(a, c, v, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                               \
  API T __tsan_atomic##n##_compare_exchange_val(volatile T *a, T c, T v, int mo, int fmo) {       \
    (void)mo;                                                                                     \
    (void)fmo;                                                                                    \
    locus_x_access(a, sizeof(T), LOCUS_X_STORE | LOCUS_X_ATOMIC, PC);                             \
    __atomic_compare_exchange_n(a, &c, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                 \
    return c;                                                                                     \
  }

#define LOCUS_X_TSAN_HOOKS(API, PC)                                    \
  API void __tsan_init(void) {}                                        \
  API void __tsan_func_entry(void *pc) { (void)pc; }                   \
  API void __tsan_func_exit(void) {}                                   \
  API void __tsan_ignore_thread_begin(void) {}                         \
  API void __tsan_ignore_thread_end(void) {}                           \
  LOCUS_X_TSAN_RW(API, PC, 1)                                          \
  LOCUS_X_TSAN_RW(API, PC, 2)                                          \
  LOCUS_X_TSAN_RW(API, PC, 4)                                          \
  LOCUS_X_TSAN_RW(API, PC, 8)                                          \
  LOCUS_X_TSAN_RW(API, PC, 16)                                         \
  LOCUS_X_TSAN_UNALIGNED(API, PC, 2)                                   \
  LOCUS_X_TSAN_UNALIGNED(API, PC, 4)                                   \
  LOCUS_X_TSAN_UNALIGNED(API, PC, 8)                                   \
  LOCUS_X_TSAN_UNALIGNED(API, PC, 16)                                  \
  API void __tsan_read_range(void *p, unsigned long size) {            \
    locus_x_slow((uintptr_t)p, size, 0, PC);                           \
  }                                                                    \
  API void __tsan_write_range(void *p, unsigned long size) {           \
    locus_x_slow((uintptr_t)p, size, LOCUS_X_STORE, PC);               \
  }                                                                    \
  API void __tsan_vptr_read(void **p) { locus_x_access(p, 8, 0, PC); } \
  API void __tsan_vptr_update(void **p, void *v) {                     \
    (void)v;                                                           \
    locus_x_access(p, 8, LOCUS_X_STORE, PC);                           \
  }                                                                    \
  LOCUS_X_TSAN_ATOMIC(API, PC, 8, uint8_t)                             \
  LOCUS_X_TSAN_ATOMIC(API, PC, 16, uint16_t)                           \
  LOCUS_X_TSAN_ATOMIC(API, PC, 32, uint32_t)                           \
  LOCUS_X_TSAN_ATOMIC(API, PC, 64, uint64_t)                           \
  API void __tsan_atomic_thread_fence(int mo) {                        \
    (void)mo;                                                          \
    __atomic_thread_fence(__ATOMIC_SEQ_CST);                           \
  }                                                                    \
  API void __tsan_atomic_signal_fence(int mo) {                        \
    (void)mo;                                                          \
    __atomic_signal_fence(__ATOMIC_SEQ_CST);                           \
  }

#endif
