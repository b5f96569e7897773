/* Allocator and anonymous-mapping interposers for the comm lens's object attribution.
 * They forward only: to the real function, then, when tracking is on, to
 * locus_allocs_record (comm/allocs.c). What the program gets is always exactly what the
 * real function returned.
 *
 * The real functions are found with dlsym(RTLD_NEXT), but dlsym itself may call calloc
 * (and ld.so calls malloc early): calls made before the real functions are known get
 * blocks from a static bootstrap arena. Those blocks are never handed to the real free or
 * realloc; free ignores them and realloc copies out of them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../comm/allocs.h"
#include "../comm/shared.h"
#include "../core/runtime.h"
#include "../numa/numa.h"

#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))

int locus_alloc_state;

static struct {
  void *(*malloc)(size_t);
  void *(*calloc)(size_t, size_t);
  void *(*realloc)(void *, size_t);
  void (*free)(void *);
  int (*posix_memalign)(void **, size_t, size_t);
  void *(*aligned_alloc)(size_t, size_t);
  void *(*memalign)(size_t, size_t);
  void *(*valloc)(size_t);
  void *(*pvalloc)(size_t);
  size_t (*usable)(void *);
  void *(*mmap)(void *, size_t, int, int, int, off_t);
  int (*munmap)(void *, size_t);
} real;

static inline int state(void) { return __atomic_load_n(&locus_alloc_state, __ATOMIC_ACQUIRE); }

/* ---- bootstrap arena ---- */
#define BOOT_SIZE (256u << 10)
static _Alignas(4096) unsigned char boot[BOOT_SIZE];
static size_t boot_used;

static int is_boot(const void *p) { return (uintptr_t)p - (uintptr_t)boot < (uintptr_t)BOOT_SIZE; }

/* Bump allocation, never reused: static memory is zero, so calloc needs no memset. The
 * requested size sits in the word before the block (for realloc and malloc_usable_size). */
static void *boot_alloc(size_t n, size_t align) {
  if (align < 16) align = 16;
  if (n > BOOT_SIZE || (align & (align - 1)) || align > 4096) {
    errno = ENOMEM;
    return NULL;
  }
  size_t need = (n + 16 + align + 15) & ~(size_t)15;
  size_t off = __atomic_fetch_add(&boot_used, need, __ATOMIC_RELAXED);
  if (off + need > BOOT_SIZE) {
    errno = ENOMEM;
    return NULL;
  }
  uintptr_t p = ((uintptr_t)(boot + off + 16) + align - 1) & ~(uintptr_t)(align - 1);
  ((size_t *)p)[-1] = n;
  __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_BOOT, __ATOMIC_RELEASE);
  return (void *)p;
}

static size_t boot_size(const void *p) { return ((const size_t *)p)[-1]; }

/* ---- resolution ---- */
static LOCUS_TLS int resolving; /* this thread is inside dlsym: allocate from the arena */
/* The runtime's own calls into the loader (the decoder's dlopen) allocate from the arena:
 * on the program's heap they would move every block the program allocates after them. */
static LOCUS_TLS int private_allocs;

void locus_alloc_private(int on) {
  if (on) __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_BOOT, __ATOMIC_RELEASE);
  private_allocs = on;
}

#define R(field, name) \
  __atomic_store_n((void **)&real.field, dlsym(RTLD_NEXT, name), __ATOMIC_RELAXED)

static int glibc_malloc; /* the next malloc is glibc's: blocks have its chunk header */

/* An mmap'd chunk of glibc's malloc (never for another allocator's blocks). */
static inline int chunk_mmapped(const void *p) { return glibc_malloc && locus_ft_chunk_mmapped(p); }

/* Returns the state after trying; RESOLVED is set once every essential function is known. */
static __attribute__((noinline)) int resolve(void) {
  if (resolving) return state();
  resolving = 1;
  R(malloc, "malloc");
  R(calloc, "calloc");
  R(realloc, "realloc");
  R(free, "free");
  R(posix_memalign, "posix_memalign");
  R(aligned_alloc, "aligned_alloc");
  R(memalign, "memalign");
  R(valloc, "valloc");
  R(pvalloc, "pvalloc");
  R(usable, "malloc_usable_size");
  R(mmap, "mmap");
  R(munmap, "munmap");
  /* Whose malloc is next: glibc's keeps a size word before each block (its mmap'd chunks
   * are found by it); another allocator's (jemalloc linked by redis, tcmalloc, mimalloc)
   * has no such header, and a page-aligned block's previous page may be unmapped or
   * protected. Those allocators call mmap through the PLT, so their regions are seen there. */
  Dl_info di;
  const char *f = NULL;
  if (real.malloc && dladdr((void *)real.malloc, &di) && di.dli_fname) {
    f = strrchr(di.dli_fname, '/');
    f = f ? f + 1 : di.dli_fname;
  }
  glibc_malloc = f && (!strncmp(f, "libc.so", 7) || !strncmp(f, "libc-", 5));
  resolving = 0;
  /* pvalloc and malloc_usable_size are optional (checked where used); the rest must be
   * there for the fast path to call them unchecked. */
  if (real.malloc && real.calloc && real.realloc && real.free && real.posix_memalign &&
      real.aligned_alloc && real.memalign && real.valloc && real.mmap && real.munmap)
    __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_RESOLVED, __ATOMIC_RELEASE);
  return state();
}

/* C++ operator new: its caller, for the allocation it makes (see the interposers below),
 * marked LOCUS_SITE_NEW (the advice for its blocks is alignas in the type, not
 * aligned_alloc). */
static LOCUS_TLS uint64_t new_site;

static inline uint64_t caller_site(uint64_t site) {
  uint64_t s = new_site;
  if (!s) return site;
  new_site = 0;
  return s | LOCUS_SITE_NEW;
}

/* The numa lens: an mmap'd chunk is fresh memory whose first touches it tracks. */
static inline void numa_fresh(int s, void *p, size_t n, uint64_t site) {
  if ((s & LOCUS_ALLOC_NUMA) && p && n >= 16 * 4096 && chunk_mmapped(p))
    locus_ft_track(p, n, p, PROT_READ | PROT_WRITE, site & ~LOCUS_SITE_NEW);
}

/* ---- the slow paths (tracking on, not resolved yet, or bootstrap blocks exist) ---- */
static __attribute__((noinline)) void *malloc_slow(size_t n, uint64_t site) {
  site = caller_site(site);
  int s = state();
  if (private_allocs || (!(s & LOCUS_ALLOC_RESOLVED) && !((s = resolve()) & LOCUS_ALLOC_RESOLVED)))
    return boot_alloc(n, 16);
  void *p = real.malloc(n);
  if ((s & LOCUS_ALLOC_TRACKING) && p) locus_allocs_record(LOCUS_AL_MALLOC, p, n, site);
  numa_fresh(s, p, n, site);
  return p;
}

static __attribute__((noinline)) void *calloc_slow(size_t k, size_t n, uint64_t site) {
  int s = state();
  if (private_allocs ||
      (!(s & LOCUS_ALLOC_RESOLVED) && !((s = resolve()) & LOCUS_ALLOC_RESOLVED))) {
    size_t bytes;
    if (__builtin_mul_overflow(k, n, &bytes)) {
      errno = ENOMEM;
      return NULL;
    }
    return boot_alloc(bytes, 16);
  }
  void *p = real.calloc(k, n);
  if ((s & LOCUS_ALLOC_TRACKING) && p) locus_allocs_record(LOCUS_AL_MALLOC, p, k * n, site);
  numa_fresh(s, p, k * n, site);
  return p;
}

static __attribute__((noinline)) void free_slow(void *p, uint64_t site) {
  if (!p || is_boot(p)) return;
  int s = state();
  if (!(s & LOCUS_ALLOC_RESOLVED)) s = resolve();
  /* A real block while nothing is resolved cannot happen (it came from the real malloc). */
  if (!(s & LOCUS_ALLOC_RESOLVED)) return;
  /* Only an mmap'd chunk can be a tracked region: no region scan for heap blocks. Its
   * census (a record naming the block) comes before the free's record, which drops the
   * records of a block no record named. */
  if ((s & LOCUS_ALLOC_NUMA) && chunk_mmapped(p)) locus_ft_release(p, 0);
  if (s & LOCUS_ALLOC_TRACKING) {
    locus_allocs_record(LOCUS_AL_FREE, p, 0, site);
    locus_comm_exact_freed(p, 0);
  }
  real.free(p);
}

static __attribute__((noinline)) void *realloc_slow(void *p, size_t n, uint64_t site) {
  int s = state();
  if (!(s & LOCUS_ALLOC_RESOLVED)) s = resolve();
  if (private_allocs && (!p || is_boot(p))) {
    void *q = boot_alloc(n, 16);
    if (q && p) memcpy(q, p, boot_size(p) < n ? boot_size(p) : n);
    return q;
  }
  if (p && is_boot(p)) {
    /* Out of the arena: a new block (real if possible) with the old contents. */
    void *q = (s & LOCUS_ALLOC_RESOLVED) ? real.malloc(n) : boot_alloc(n, 16);
    if (!q) return NULL;
    size_t old = boot_size(p);
    memcpy(q, p, old < n ? old : n);
    if ((s & LOCUS_ALLOC_TRACKING) && !is_boot(q)) locus_allocs_record(LOCUS_AL_MALLOC, q, n, site);
    return q;
  }
  if (!(s & LOCUS_ALLOC_RESOLVED)) return p ? NULL : boot_alloc(n, 16);
  /* mremap would carry PROT_NONE along; only an mmap'd chunk can be a tracked region. */
  if ((s & LOCUS_ALLOC_NUMA) && p && chunk_mmapped(p)) locus_ft_release(p, 0);
  /* The old size only when the exact model keeps generations (a lookup per realloc). */
  size_t before =
      (s & LOCUS_ALLOC_TRACKING) && p && locus_comm_exact_gens() ? malloc_usable_size(p) : 0;
  void *q = real.realloc(p, n);
  if (before && q && q != p) locus_comm_exact_freed(p, before); /* moved: p's lines are free */
  if (s & LOCUS_ALLOC_TRACKING) {
    if (q) {
      if (p) locus_allocs_record(LOCUS_AL_FREE, p, 0, site);
      locus_allocs_record(LOCUS_AL_MALLOC, q, n, site);
    } else if (p && n == 0) {
      locus_allocs_record(LOCUS_AL_FREE, p, 0, site); /* glibc: realloc(p, 0) frees */
    }
  }
  return q;
}

/* memalign, aligned_alloc, valloc, pvalloc (which = 0..3) and posix_memalign. */
static __attribute__((noinline)) void *align_slow(int which, size_t align, size_t n,
                                                  uint64_t site) {
  site = caller_site(site);
  int s = state();
  if (private_allocs || (!(s & LOCUS_ALLOC_RESOLVED) && !((s = resolve()) & LOCUS_ALLOC_RESOLVED)))
    return boot_alloc(n, which >= 2 ? 4096 : align);
  void *p = NULL;
  switch (which) {
    case 0:
      p = real.memalign ? real.memalign(align, n) : NULL;
      break;
    case 1:
      p = real.aligned_alloc ? real.aligned_alloc(align, n) : NULL;
      break;
    case 2:
      p = real.valloc ? real.valloc(n) : NULL;
      break;
    default:
      p = real.pvalloc ? real.pvalloc(n) : NULL;
  }
  if ((s & LOCUS_ALLOC_TRACKING) && p) locus_allocs_record(LOCUS_AL_MALLOC, p, n, site);
  numa_fresh(s, p, n, site);
  return p;
}

static __attribute__((noinline)) int posix_memalign_slow(void **out, size_t align, size_t n,
                                                         uint64_t site) {
  site = caller_site(site);
  int s = state();
  if (!(s & LOCUS_ALLOC_RESOLVED) && !((s = resolve()) & LOCUS_ALLOC_RESOLVED)) {
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = boot_alloc(n, align);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
  }
  int rc = real.posix_memalign ? real.posix_memalign(out, align, n) : ENOMEM;
  if ((s & LOCUS_ALLOC_TRACKING) && rc == 0) locus_allocs_record(LOCUS_AL_MALLOC, *out, n, site);
  if (rc == 0) numa_fresh(s, *out, n, site);
  return rc;
}

static __attribute__((noinline)) void *mmap_slow(void *a, size_t n, int prot, int flags, int fd,
                                                 off_t off, uint64_t site) {
  int s = state();
  if (!(s & LOCUS_ALLOC_RESOLVED)) s = resolve();
  if ((s & LOCUS_ALLOC_NUMA) && (flags & MAP_FIXED)) locus_ft_release(a, n);
  void *p = (s & LOCUS_ALLOC_RESOLVED) ? real.mmap(a, n, prot, flags, fd, off)
                                       : (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
  if ((s & LOCUS_ALLOC_TRACKING) && p != MAP_FAILED) {
    int anon = (flags & MAP_ANONYMOUS) != 0, shared = (flags & MAP_SHARED) && (prot & PROT_WRITE);
    if (anon && !shared)
      locus_allocs_record(LOCUS_AL_MMAP, p, n, site);
    else if (anon || fd >= 0)
      locus_allocs_record_mapping(p, n, site, anon ? -1 : fd, anon ? 0 : (uint64_t)off,
                                  shared ? LOCUS_ALF_SHARED : 0);
  }
  /* Memory processes share, keyed for the board between them (comm/shared.c). */
  if (locus_shared_tracking && p != MAP_FAILED) {
    if (flags & MAP_SHARED)
      locus_shared_mapped((uint64_t)(uintptr_t)p, n, (flags & MAP_ANONYMOUS) ? 0 : (uint64_t)off);
    else
      locus_shared_remove((uint64_t)(uintptr_t)p, n);
  }
  /* Fresh private anonymous memory that the kernel places at first touch. */
  if ((s & LOCUS_ALLOC_NUMA) && p != MAP_FAILED && (flags & MAP_ANONYMOUS) &&
      (flags & MAP_PRIVATE) &&
      !(flags & (MAP_POPULATE | MAP_LOCKED | MAP_HUGETLB | MAP_STACK | MAP_GROWSDOWN)))
    locus_ft_track(p, n, p, prot, site);
  return p;
}

static __attribute__((noinline)) int munmap_slow(void *a, size_t n, uint64_t site) {
  int s = state();
  if (!(s & LOCUS_ALLOC_RESOLVED)) s = resolve();
  if (s & LOCUS_ALLOC_NUMA) locus_ft_release(a, n);
  int rc = (s & LOCUS_ALLOC_RESOLVED) ? real.munmap(a, n) : (int)syscall(SYS_munmap, a, n);
  if ((s & LOCUS_ALLOC_NUMA) && rc == 0) locus_numa_pages_changed();
  if ((s & LOCUS_ALLOC_TRACKING) && rc == 0) locus_allocs_record(LOCUS_AL_MUNMAP, a, n, site);
  if (locus_shared_tracking && rc == 0) locus_shared_remove((uint64_t)(uintptr_t)a, n);
  return rc;
}

/* ---- the interposers: one test, then a tail call ---- */
#define FAST (LOCUS_LIKELY(state() == LOCUS_ALLOC_RESOLVED))

LOCUS_EXPORT void *malloc(size_t n) {
  if (FAST) return real.malloc(n);
  return malloc_slow(n, SITE);
}

LOCUS_EXPORT void *calloc(size_t k, size_t n) {
  if (FAST) return real.calloc(k, n);
  return calloc_slow(k, n, SITE);
}

LOCUS_EXPORT void free(void *p) {
  if (FAST) return real.free(p);
  free_slow(p, SITE);
}

LOCUS_EXPORT void *realloc(void *p, size_t n) {
  if (FAST) return real.realloc(p, n);
  return realloc_slow(p, n, SITE);
}

LOCUS_EXPORT void *reallocarray(void *p, size_t k, size_t n) {
  size_t bytes;
  if (__builtin_mul_overflow(k, n, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  if (FAST) return real.realloc(p, bytes);
  return realloc_slow(p, bytes, SITE);
}

LOCUS_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  if (FAST) return real.posix_memalign(out, align, n);
  return posix_memalign_slow(out, align, n, SITE);
}

LOCUS_EXPORT void *memalign(size_t align, size_t n) {
  if (FAST) return real.memalign(align, n);
  return align_slow(0, align, n, SITE);
}

LOCUS_EXPORT void *aligned_alloc(size_t align, size_t n) {
  if (FAST) return real.aligned_alloc(align, n);
  return align_slow(1, align, n, SITE);
}

LOCUS_EXPORT void *valloc(size_t n) {
  if (FAST) return real.valloc(n);
  return align_slow(2, 0, n, SITE);
}

LOCUS_EXPORT void *pvalloc(size_t n) {
  if (FAST && real.pvalloc) return real.pvalloc(n);
  return align_slow(3, 0, n, SITE);
}

/* C++ operator new (the eight replaceable forms, Itanium ABI names): libstdc++'s runs (its
 * new_handler loop, std::bad_alloc), and the malloc or aligned_alloc it calls records the
 * block with operator new's caller as its site. Without this every heap object of a C++
 * program came "from operator new(unsigned long)".
 * The C++ runtime may sit in a local scope (a Python extension dlopen'ed with RTLD_LOCAL
 * brings libstdc++ in, and its calls still bind to this global definition): RTLD_NEXT cannot
 * see it there, so the loaded runtime is also asked by name. If none has the symbol (never
 * expected), malloc stands in, and an allocation failure aborts as an uncaught bad_alloc
 * would. */
static void *cxx_next(const char *sym) {
  void *f = dlsym(RTLD_NEXT, sym);
  static const char *const libs[] = {"libstdc++.so.6", "libc++.so.1"};
  for (size_t i = 0; !f && i < sizeof libs / sizeof libs[0]; i++) {
    void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
    if (h) f = dlsym(h, sym);
  }
  return f;
}

static void *cxx_fallback(size_t n, size_t align, int nothrow) {
  void *p = align > 16 ? aligned_alloc(align, (n + align - 1) / align * align) : malloc(n ? n : 1);
  if (!p && !nothrow) abort();
  return p;
}

/* libstdc++'s operator new[] calls operator new (a tail call, through the PLT: this one),
 * whose return address is then in the operator new[] here: the outermost operator new keeps
 * its caller as the site. */
#define CXX_NEW(sym, params, args, n, align, nothrow)  \
  LOCUS_EXPORT void *sym params {                      \
    static void *(*next)params;                        \
    if (!next) next = (void *(*)params)cxx_next(#sym); \
    if (!next) return cxx_fallback(n, align, nothrow); \
    if (FAST) return next args;                        \
    int outer = !new_site;                             \
    if (outer) new_site = SITE;                        \
    void *p = next args;                               \
    if (outer) new_site = 0;                           \
    return p;                                          \
  }
CXX_NEW(_Znwm, (size_t n), (n), n, 0, 0)
CXX_NEW(_Znam, (size_t n), (n), n, 0, 0)
CXX_NEW(_ZnwmRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), n, 0, 1)
CXX_NEW(_ZnamRKSt9nothrow_t, (size_t n, const void *nt), (n, nt), n, 0, 1)
CXX_NEW(_ZnwmSt11align_val_t, (size_t n, size_t al), (n, al), n, al, 0)
CXX_NEW(_ZnamSt11align_val_t, (size_t n, size_t al), (n, al), n, al, 0)
CXX_NEW(_ZnwmSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), n,
        al, 1)
CXX_NEW(_ZnamSt11align_val_tRKSt9nothrow_t, (size_t n, size_t al, const void *nt), (n, al, nt), n,
        al, 1)

LOCUS_EXPORT size_t malloc_usable_size(void *p) {
  if (!p) return 0;
  if (is_boot(p)) return boot_size(p);
  if (!(state() & LOCUS_ALLOC_RESOLVED)) resolve();
  return real.usable ? real.usable(p) : 0;
}

LOCUS_EXPORT void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
  if (FAST && !locus_shared_tracking) return real.mmap(a, n, prot, flags, fd, off);
  return mmap_slow(a, n, prot, flags, fd, off, SITE);
}

LOCUS_EXPORT void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off) {
  if (FAST && !locus_shared_tracking) return real.mmap(a, n, prot, flags, fd, off);
  return mmap_slow(a, n, prot, flags, fd, off, SITE);
}

LOCUS_EXPORT int munmap(void *a, size_t n) {
  if (FAST && !locus_shared_tracking) return real.munmap(a, n);
  return munmap_slow(a, n, SITE);
}
