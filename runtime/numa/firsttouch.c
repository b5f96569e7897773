/* First touch without Pin: fresh anonymous memory is kept inaccessible until its first
 * access, which faults in the touching thread.
 *
 * Regions: a tracked block (an mmap'd malloc chunk, an anonymous private read-write mmap of
 * at least FT_MIN_PAGES pages) has its whole pages set PROT_NONE and an entry here, with two
 * bits per page: `seen` (its first touch is recorded) and `open` (it has the region's
 * protection back). The SIGSEGV handler, on an access fault inside a region:
 *   - a write to an unseen page: record a first touch (LOCUS_NT_WRITE), open the page, place
 *     it now (an atomic or of 0: a write fault in this thread, under its memory policy, as
 *     the faulting instruction would have done), ask move_pages where it landed;
 *   - a read of an unseen page: record the first touch (node -2: a read maps the shared zero
 *     page, nothing is placed yet) and make the page read-only, so that
 *   - the first write to a seen page that is not open faults again: open and place it, and
 *     record where it landed (LOCUS_NT_PLACE: the page's placement, not a new first touch).
 * Then it returns and the access runs again. Two threads faulting on one page: the first to
 * set a bit records; the other returns and retries until the page is open.
 *
 * Limits: each open page may split a mapping (vm.max_map_count); past a budget of mappings
 * this file opens 64 pages at once (LOCUS_NT_RANGE: the faulting thread stands for all of
 * them). Huge pages: where transparent huge pages are enabled for a region (THP "always", or
 * "madvise" and the program's MADV_HUGEPAGE), a fault in an aligned huge page's worth of
 * pages none of which is touched yet opens all of them at once (LOCUS_NT_HUGE), so the
 * kernel can back them with one huge page as it would without locus: one first touch per
 * huge page. MADV_DONTNEED/MADV_REMOVE protect the dropped pages again (their next access
 * is a new first touch). The kernel writing into a
 * protected page fails with EFAULT, so the interposers of read-like calls open the buffer
 * first (locus_ft_prepare); calls made with syscall() directly are not seen. Not tracked:
 * the brk heap and the arenas glibc maps itself, static data, stacks, shared mappings. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "numa.h"
#include "../comm/allocs.h"

#define FT_MAX 4096
#define FT_MIN_PAGES 4
#define PAGE 4096ul

struct ft_region {
  _Atomic int state; /* FREE, BUSY (being set up or released), LIVE */
  uintptr_t start, end;
  uintptr_t alloc; /* start of the allocation (the `region` of touch records) */
  int prot;
  _Atomic uintptr_t huge_lo, huge_hi; /* where THP is enabled: huge-page first touches */
  _Atomic uint64_t *seen, *open;      /* bit per page; never unmapped, reused by the slot */
  size_t words_cap;                   /* words available in each of seen/open */
};
/* FT_CENSUS: tracked for its final placement only (exact backend: no protection). */
enum { FT_FREE = 0, FT_BUSY = 1, FT_LIVE = 2, FT_CENSUS = 3 };

static struct ft_region regions[FT_MAX];
static _Atomic uint32_t regions_hi;
_Atomic int locus_ft_live;
static _Atomic long vma_estimate, vma_budget;
static _Atomic uint64_t untracked; /* regions not tracked: table full */

static struct locus_stream touch_stream;
static LOCUS_TLS struct locus_cursor touch_cursor;
static LOCUS_TLS uintptr_t retry_addr;
static LOCUS_TLS unsigned retry_n;
static LOCUS_TLS uint32_t my_aff_epoch; /* my_nodes is valid for this affinity epoch */
static LOCUS_TLS uint64_t my_nodes;
/* Sequential first touches: the page this thread's next fault would be, in which region, and
 * how many faults in a row were sequential. */
static LOCUS_TLS uintptr_t streak_next;
static LOCUS_TLS const void *streak_region;
static LOCUS_TLS unsigned streak;

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static struct sigaction app_segv;
static _Atomic int installed;
static int census_only;         /* LOCUS_NUMA_FIRST_TOUCH=0: regions for the census only */
static int thp_always;          /* /sys/kernel/mm/transparent_hugepage/enabled is "always" */
static size_t thp_pages;        /* base pages per PMD huge page; 0: no THP here */
static _Atomic int census_live; /* FT_CENSUS regions */

static long sys_mprotect(uintptr_t a, size_t n, int prot) {
  return syscall(SYS_mprotect, (void *)a, n, prot);
}

/* ---- records ---- */

/* The program's call into the system library whose code is first-touching a page (memset,
 * memcpy), while the fault handler runs; 0 otherwise. */
static LOCUS_TLS uint64_t fault_caller;

void locus_ft_touch(uintptr_t page, uint64_t ip, uintptr_t region, uint32_t pages, int node,
                    uint64_t nodes, uint16_t flags) {
  struct locus_numa_touch r;
  memset(&r, 0, sizeof r);
  r.kind = 1;
  r.t = locus_ticks();
  r.addr = page;
  r.ip = ip;
  r.caller = fault_caller;
  r.region = region;
  r.nodes = nodes;
  if (__builtin_popcountll(nodes) > 1) flags |= LOCUS_NT_UNPINNED;
  r.tid = locus_me.tid ? locus_me.tid : (uint32_t)syscall(SYS_gettid);
  r.pages = pages;
  int cpu = sched_getcpu();
  r.cpu = (int16_t)cpu;
  if (locus_numa.emulated && node != -2) node = locus_numa_cpu_node(cpu);
  r.node = (int16_t)node;
  r.flags = flags;
  locus_named_all(r.t);
  locus_cursor_put(&touch_stream, &touch_cursor, &r, sizeof r);
}

/* A touch record of the faulting thread (its nodes cached per affinity epoch). */
static void put_touch(uintptr_t page, uint64_t ip, uintptr_t alloc, uint32_t pages, int node,
                      uint16_t flags) {
  uint32_t ae = atomic_load_explicit(&locus_numa_aff_epoch, memory_order_relaxed);
  if (ae != my_aff_epoch) {
    my_aff_epoch = ae;
    my_nodes = locus_numa_self_nodes(NULL);
  }
  locus_ft_touch(page, ip, alloc, pages, node, my_nodes, flags);
}

/* Write-fault the page in this thread and return its node (move_pages), -1 if unknown. */
static int place(uintptr_t page) {
  __atomic_fetch_or((volatile unsigned char *)page, (unsigned char)0, __ATOMIC_RELAXED);
  if (locus_numa.emulated) return -1;
  int status = locus_numa_page_status(page);
  return status >= 0 ? status : -1;
}

/* ---- regions ---- */

static struct ft_region *find(uintptr_t a) {
  uint32_t hi = atomic_load_explicit(&regions_hi, memory_order_acquire);
  for (uint32_t i = 0; i < hi; i++) {
    struct ft_region *r = &regions[i];
    if (atomic_load_explicit(&r->state, memory_order_acquire) == FT_LIVE && a >= r->start &&
        a < r->end)
      return r;
  }
  return NULL;
}

static int bit_of(_Atomic uint64_t *words, size_t i) {
  return (int)(atomic_load(&words[i >> 6]) >> (i & 63) & 1);
}

/* Mapping-count change when pages [idx, idx + n) open: -2 .. +2 from their neighbours. */
static long vma_delta(struct ft_region *r, size_t idx, size_t n, size_t npages) {
  int l = idx > 0 && bit_of(r->open, idx - 1);
  int rr = idx + n < npages && bit_of(r->open, idx + n);
  return l && rr ? -2 : (l || rr) ? 0 : 2;
}

/* Set bits [idx, idx + n) of `words`; the number of them that were already set. */
static size_t bits_set(_Atomic uint64_t *words, size_t idx, size_t n) {
  size_t had = 0;
  while (n) {
    size_t b = idx & 63, k = 64 - b < n ? 64 - b : n;
    uint64_t m = (k == 64 ? ~0ull : ((1ull << k) - 1)) << b;
    had += (size_t)__builtin_popcountll(atomic_fetch_or(&words[idx >> 6], m) & m);
    idx += k;
    n -= k;
  }
  return had;
}

/* How many of bits [idx, idx + n) are set. */
static size_t bits_count(_Atomic uint64_t *words, size_t idx, size_t n) {
  size_t had = 0;
  while (n) {
    size_t b = idx & 63, k = 64 - b < n ? 64 - b : n;
    uint64_t m = (k == 64 ? ~0ull : ((1ull << k) - 1)) << b;
    had += (size_t)__builtin_popcountll(atomic_load(&words[idx >> 6]) & m);
    idx += k;
    n -= k;
  }
  return had;
}

/* Clear bits [idx, idx + n). */
static void bits_clear(_Atomic uint64_t *words, size_t idx, size_t n) {
  while (n) {
    size_t b = idx & 63, k = 64 - b < n ? 64 - b : n;
    uint64_t m = (k == 64 ? ~0ull : ((1ull << k) - 1)) << b;
    atomic_fetch_and(&words[idx >> 6], ~m);
    idx += k;
    n -= k;
  }
}

/* A fault at `a` in a region where THP is enabled: when the aligned huge page holding it
 * lies inside the region and none of its pages is touched yet, open all of them at once (a
 * read: read-only, nothing placed; a write: placed, which lets the kernel allocate one huge
 * page), or, after a read, the first write opens and places them all. 1: handled (or
 * another thread is at it: retry); 0: not a huge-page case, take the page path. */
static int huge_fault(struct ft_region *r, uintptr_t a, int write, uint64_t ip, uint16_t extra) {
  size_t hp = thp_pages;
  uintptr_t hb = a & ~(hp * PAGE - 1);
  /* The program may have turned THP off for itself (prctl PR_SET_THP_DISABLE). */
  if (syscall(SYS_prctl, PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) return 0;
  if (hb < atomic_load_explicit(&r->huge_lo, memory_order_relaxed) ||
      hb + hp * PAGE > atomic_load_explicit(&r->huge_hi, memory_order_relaxed))
    return 0;
  size_t idx = (hb - r->start) / PAGE, npages = (r->end - r->start) / PAGE;
  size_t seen = bits_count(r->seen, idx, hp), open = bits_count(r->open, idx, hp);
  uint16_t fl = (uint16_t)(LOCUS_NT_RANGE | LOCUS_NT_HUGE | extra);
  if (seen == 0) {
    /* Fresh: the thread that sets the first page's bit first owns the huge page. */
    if (bits_set(r->seen, idx, 1)) return 1;
    size_t had = bits_set(r->seen, idx + 1, hp - 1); /* seen meanwhile by the page path */
    if (write) {
      bits_set(r->open, idx, hp);
      sys_mprotect(hb, hp * PAGE, r->prot);
    } else {
      sys_mprotect(hb, hp * PAGE, PROT_READ);
    }
    atomic_fetch_add(&vma_estimate, vma_delta(r, idx, hp, npages));
    int node = write ? place(a & ~(PAGE - 1)) : -2;
    put_touch(hb, ip, r->alloc, (uint32_t)(hp - had), node,
              (uint16_t)(fl | (write ? LOCUS_NT_WRITE : 0)));
    return 1;
  }
  if (write && seen == hp && open == 0) {
    /* Read first as a huge page: its first write opens and places them all. */
    if (bits_set(r->open, idx, 1)) return 1;
    bits_set(r->open, idx + 1, hp - 1);
    sys_mprotect(hb, hp * PAGE, r->prot);
    int node = place(a & ~(PAGE - 1));
    put_touch(hb, ip, r->alloc, (uint32_t)hp, node,
              (uint16_t)(fl | LOCUS_NT_WRITE | LOCUS_NT_PLACE));
    return 1;
  }
  return 0;
}

/* A fault on a page the bitmaps call accessible: another thread set the bits and has not
 * changed the protection yet, or a thread's read-only protection overtook another's write
 * opening (huge or single pages, set by two threads at once). Give the page what its bits
 * say, as its opener will: the access then goes through instead of faulting until the
 * opener runs, and no interleaving leaves a page faulting forever. 1 (handled). */
static int heal(struct ft_region *r, uintptr_t page, size_t idx) {
  sys_mprotect(page, PAGE, bit_of(r->open, idx) ? r->prot : PROT_READ);
  return 1;
}

/* Handle an access fault at `a` (write: from the fault's error code); 1 if it was ours. */
static int on_fault(uintptr_t a, int write, uint64_t ip, uint16_t extra) {
  struct ft_region *r = find(a);
  if (!r) return 0;
  uintptr_t page = a & ~(PAGE - 1);
  size_t idx = (page - r->start) / PAGE, npages = (r->end - r->start) / PAGE;
  size_t w = idx >> 6;
  uint64_t bit = 1ull << (idx & 63);
  int huge = thp_pages && atomic_load_explicit(&r->huge_hi, memory_order_relaxed);
  if (huge && huge_fault(r, a, write, ip, extra)) return 1;
  if (atomic_load(&vma_estimate) > atomic_load(&vma_budget)) {
    /* Range mode: the 64 pages of this bitmap word at once. */
    uint64_t mask = ~0ull;
    size_t first = w << 6;
    if (npages - first < 64) mask = (1ull << (npages - first)) - 1;
    uint64_t was_open = atomic_fetch_or(&r->open[w], mask);
    uint64_t was_seen = atomic_fetch_or(&r->seen[w], mask);
    if (!(mask & ~was_open)) return 1;
    uintptr_t lo = r->start + first * PAGE, n = (size_t)__builtin_popcountll(mask) * PAGE;
    sys_mprotect(lo, n, r->prot);
    int node = place(page);
    uint32_t fresh = (uint32_t)__builtin_popcountll(mask & ~was_seen);
    if (fresh)
      put_touch(page, ip, r->alloc, fresh, node,
                (uint16_t)(LOCUS_NT_RANGE | (write ? LOCUS_NT_WRITE : 0) | extra));
    return 1;
  }
  /* A thread touching page after page (a serial or chunked initialisation) opens growing
   * blocks ahead of it: 2, 4, ... 64 pages (never past its bitmap word), one fault each. The
   * block is attributed to this thread (LOCUS_NT_RANGE); pages in it are placed by whoever
   * writes them first, as without locus. */
  unsigned run = (page == streak_next && streak_region == r) ? streak + 1 : 0;
  size_t block = run >= 2 ? (size_t)1 << (run - 1 < 6 ? run - 1 : 6) : 1;
  size_t room = 64 - (idx & 63);
  if (block > room) block = room;
  if (block > npages - idx) block = npages - idx;
  if (huge) {
    /* Never into the next huge page: it can still be first-touched whole. */
    size_t to_huge = (((page / PAGE) | (thp_pages - 1)) + 1) - page / PAGE;
    if (block > to_huge) block = to_huge;
  }
  if (block > 1) {
    uint64_t mask = (block == 64 ? ~0ull : ((1ull << block) - 1)) << (idx & 63);
    uint64_t was_open = atomic_fetch_or(&r->open[w], mask);
    uint64_t was_seen = atomic_fetch_or(&r->seen[w], mask);
    /* Open every page whose bit this thread set, even when its own page was being opened
     * by another thread (it then retries): a page marked open must become accessible, or
     * its next fault would be taken for a race forever (numpy's two BLAS threads zeroing
     * one matrix livelocked on such a page). */
    uint64_t mine = mask & ~was_open;
    if (!mine) return 1;
    uint32_t b0 = (uint32_t)__builtin_ctzll(mine), b1 = 63u - (uint32_t)__builtin_clzll(mine);
    sys_mprotect(r->start + ((w << 6) + b0) * PAGE, (size_t)(b1 - b0 + 1) * PAGE, r->prot);
    atomic_fetch_add(&vma_estimate, vma_delta(r, idx, block, npages));
    if (!(mine & bit)) return 1;
    int node = write ? place(page) : -2;
    uint32_t fresh = (uint32_t)__builtin_popcountll(mask & ~was_seen);
    if (fresh)
      put_touch(page, ip, r->alloc, fresh, node,
                (uint16_t)(LOCUS_NT_RANGE | (write ? LOCUS_NT_WRITE : 0) | extra));
    streak = run;
    streak_next = page + block * PAGE;
    streak_region = r;
    return 1;
  }
  uint64_t was_seen = atomic_fetch_or(&r->seen[w], bit) & bit;
  if (!was_seen) {
    streak = run;
    streak_next = page + PAGE;
    streak_region = r;
  }
  if (!write) {
    /* Seen: another thread opened it, or is opening it (make sure; see heal()). */
    if (was_seen) return heal(r, page, idx);
    sys_mprotect(page, PAGE, PROT_READ);
    atomic_fetch_add(&vma_estimate, vma_delta(r, idx, 1, npages));
    put_touch(page, ip, r->alloc, 1, -2, extra);
    return 1;
  }
  uint64_t was_open = atomic_fetch_or(&r->open[w], bit) & bit;
  if (was_open) return heal(r, page, idx);
  sys_mprotect(page, PAGE, r->prot);
  if (!was_seen) atomic_fetch_add(&vma_estimate, vma_delta(r, idx, 1, npages));
  int node = place(page);
  put_touch(page, ip, r->alloc, 1, node,
            (uint16_t)(LOCUS_NT_WRITE | (was_seen ? LOCUS_NT_PLACE : 0) | extra));
  return 1;
}

static void chain(int sig, siginfo_t *si, void *uc) {
  struct sigaction a = app_segv;
  if (!(a.sa_flags & SA_SIGINFO) && (a.sa_handler == SIG_DFL || a.sa_handler == SIG_IGN)) {
    /* Default action: restore it and return; the access faults again and ends the process
     * as it would have without us. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction_fn real = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (real) real(SIGSEGV, &dfl, NULL);
    return;
  }
  /* What the kernel would have done for the handler: SA_RESETHAND (locus's own fatal-signal
   * handler re-raises under it; without the reset the raise came back here forever). */
  if (a.sa_flags & SA_RESETHAND) {
    memset(&app_segv, 0, sizeof app_segv);
    app_segv.sa_handler = SIG_DFL;
  }
  if (a.sa_flags & SA_SIGINFO)
    a.sa_sigaction(sig, si, uc);
  else
    a.sa_handler(sig);
}

static void on_segv(int sig, siginfo_t *si, void *ucv) {
  int saved = errno;
  ucontext_t *uc = ucv;
  uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code == SEGV_ACCERR && atomic_load_explicit(&locus_ft_live, memory_order_relaxed)) {
    /* A seccomp filter is coming (locus_before_sandbox): the page gets its protection back
     * from the thread installing it, before the filter; until then the access faults again. */
    if (!locus_busy_enter()) {
      errno = saved;
      if (find(a)) return;
      goto not_ours;
    }
    int write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
    uint64_t ip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
    /* The same address faulting over and over is not a first touch any more (a protection
     * the program set itself): let it through to the program's handler. */
    if (a == retry_addr) {
      if (++retry_n > 10000) goto not_ours;
    } else {
      retry_addr = a;
      retry_n = 0;
    }
    fault_caller = locus_soft_caller(ip, uc);
    int mine = on_fault(a, write, ip, 0);
    fault_caller = 0;
    locus_busy_leave();
    if (mine) {
      errno = saved;
      return;
    }
  }
not_ours:
  retry_addr = 0;
  errno = saved;
  chain(sig, si, ucv);
}

int locus_ft_installed(void) { return atomic_load_explicit(&installed, memory_order_relaxed); }

/* Called by the sigaction() interposer (comm/soft/trap.c) for SIGSEGV: 1 if handled. */
int locus_ft_sigaction(const struct sigaction *act, struct sigaction *old) {
  if (!atomic_load(&installed)) return 0;
  /* The runtime's finishing handler (chained to) reads as, and stays for, SIG_DFL. */
  struct sigaction was = app_segv;
  if (locus_fatal_held(&was, act, old)) app_segv = *act;
  return 1;
}

static void take_slot_words(struct ft_region *r, size_t words) {
  if (r->words_cap >= words) {
    memset((void *)r->seen, 0, words * 8);
    memset((void *)r->open, 0, words * 8);
    return;
  }
  size_t bytes = (words * 16 + PAGE - 1) & ~(PAGE - 1);
  void *m = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    r->words_cap = 0;
    return;
  }
  r->seen = m;
  r->open = (_Atomic uint64_t *)m + bytes / 16;
  r->words_cap = bytes / 16;
}

/* The runtime's own code: its mmaps (alternate signal stacks, tables) are never tracked. */
static uintptr_t self_lo, self_hi;

static int find_self(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  if (info->dlpi_addr != (uintptr_t)arg) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (!self_lo || lo < self_lo) self_lo = lo;
    if (hi > self_hi) self_hi = hi;
  }
  return 1;
}

/* mlockall(MCL_FUTURE): new mappings are populated (placed) at once, nothing to track. */
static _Atomic int locked_future;

void locus_ft_mlockall(int flags, uint64_t ip) {
  if (flags & MCL_CURRENT) { /* every page is populated now, by this thread */
    uint32_t top = atomic_load(&regions_hi);
    for (uint32_t i = 0; i < top; i++) {
      struct ft_region *r = &regions[i];
      if (atomic_load(&r->state) == FT_LIVE) locus_ft_prepare(r->start, r->end - r->start, ip, 1);
    }
  }
  if (flags & MCL_FUTURE) atomic_store(&locked_future, 1);
}

void locus_ft_track(void *p, size_t n, void *from, int prot, uint64_t site) {
  if (!locus_numa.on || !(census_only || atomic_load(&installed))) return;
  if (atomic_load_explicit(&locked_future, memory_order_relaxed)) return;
  if (site >= self_lo && site < self_hi) return;
  if ((prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE) || (prot & PROT_EXEC)) return;
  uintptr_t lo = ((uintptr_t)from + PAGE - 1) & ~(PAGE - 1);
  /* The tail page is the block's own too (mmap and mmap'd chunks end on a page). */
  uintptr_t hi = ((uintptr_t)p + n + PAGE - 1) & ~(PAGE - 1);
  if (hi <= lo || (hi - lo) / PAGE < FT_MIN_PAGES) return;
  size_t words = ((hi - lo) / PAGE + 63) / 64;
  for (uint32_t i = 0; i < FT_MAX; i++) {
    struct ft_region *r = &regions[i];
    int expect = FT_FREE;
    if (!atomic_compare_exchange_strong(&r->state, &expect, FT_BUSY)) continue;
    take_slot_words(r, words);
    if (r->words_cap < words) {
      atomic_store(&r->state, FT_FREE);
      break;
    }
    r->start = lo;
    r->end = hi;
    r->alloc = (uintptr_t)p;
    r->prot = prot;
    atomic_store(&r->huge_lo, thp_always ? lo : 0);
    atomic_store(&r->huge_hi, thp_always ? hi : 0);
    if (census_only) {
      uint32_t h = atomic_load(&regions_hi);
      while (h < i + 1 && !atomic_compare_exchange_weak(&regions_hi, &h, i + 1)) {
      }
      atomic_fetch_add(&census_live, 1);
      atomic_store_explicit(&r->state, FT_CENSUS, memory_order_release);
      return;
    }
    if (sys_mprotect(lo, hi - lo, PROT_NONE) != 0) {
      atomic_store(&r->state, FT_FREE);
      return;
    }
    atomic_fetch_add(&vma_estimate, 1);
    uint32_t h = atomic_load(&regions_hi);
    while (h < i + 1 && !atomic_compare_exchange_weak(&regions_hi, &h, i + 1)) {
    }
    atomic_fetch_add(&locus_ft_live, 1);
    atomic_store_explicit(&r->state, FT_LIVE, memory_order_release);
    /* The block's first partial page (malloc's chunk header) was touched by the allocator,
     * in this thread: its first touch. */
    uintptr_t head = (uintptr_t)p & ~(PAGE - 1);
    if (head < lo) {
      int status = locus_numa.emulated ? -1 : locus_numa_page_status(head);
      put_touch(head, site, (uintptr_t)p, 1, status >= 0 ? status : -1, LOCUS_NT_WRITE);
    }
    return;
  }
  atomic_fetch_add(&untracked, 1);
}

/* Where the region's pages are now (move_pages, in batches): one LOCUS_NT_FINAL record per
 * node (node -2: pages never placed). */
#define FINAL_BATCH 512
static void final_placement(struct ft_region *r) {
  if (locus_numa.emulated) return;
  uint32_t counts[LOCUS_NUMA_MAX_NODES + 1] = {0};
  void *pages[FINAL_BATCH];
  int status[FINAL_BATCH];
  /* From the allocation's first page (a malloc chunk's header page is its own too). */
  for (uintptr_t a = r->alloc & ~(PAGE - 1); a < r->end;) {
    unsigned n = 0;
    for (; n < FINAL_BATCH && a < r->end; n++, a += PAGE) pages[n] = (void *)a;
    if (syscall(SYS_move_pages, 0, (unsigned long)n, pages, NULL, status, 0) != 0) return;
    for (unsigned i = 0; i < n; i++) {
      int s = status[i];
      counts[s >= 0 && s < LOCUS_NUMA_MAX_NODES ? s + 1 : 0]++;
    }
  }
  for (int k = 0; k <= LOCUS_NUMA_MAX_NODES; k++)
    if (counts[k]) put_touch(r->alloc, 0, r->alloc, counts[k], k ? k - 1 : -2, LOCUS_NT_FINAL);
}

void locus_ft_proc_fini(void) {
  uint32_t top = atomic_load(&regions_hi);
  for (uint32_t i = 0; i < top; i++) {
    struct ft_region *r = &regions[i];
    int was = atomic_load(&r->state);
    if ((was != FT_LIVE && was != FT_CENSUS) ||
        !atomic_compare_exchange_strong(&r->state, &was, FT_BUSY))
      continue;
    final_placement(r);
    atomic_store(&r->state, was);
  }
}

void locus_ft_release(const void *p, size_t n) {
  if (!atomic_load_explicit(&locus_ft_live, memory_order_relaxed) &&
      !atomic_load_explicit(&census_live, memory_order_relaxed))
    return;
  uintptr_t lo = (uintptr_t)p, hi = n ? lo + n : lo + 1;
  uint32_t top = atomic_load(&regions_hi);
  for (uint32_t i = 0; i < top; i++) {
    struct ft_region *r = &regions[i];
    int was = atomic_load(&r->state);
    if (was != FT_LIVE && was != FT_CENSUS) continue;
    int hit = n ? (r->start < hi && lo < r->end) : (r->alloc == lo);
    if (!hit) continue;
    if (!atomic_compare_exchange_strong(&r->state, &was, FT_BUSY)) continue;
    if (was == FT_CENSUS) {
      final_placement(r);
      atomic_fetch_sub(&census_live, 1);
      atomic_store(&r->state, FT_FREE);
      continue;
    }
    /* Whatever is still protected gets the region's protection back (untouched pages stay
     * unpopulated: nothing is placed). */
    final_placement(r);
    sys_mprotect(r->start, r->end - r->start, r->prot);
    atomic_fetch_sub(&locus_ft_live, 1);
    atomic_store(&r->state, FT_FREE);
  }
}

void locus_ft_madvise(void *p, size_t n, int advice) {
  int huge = advice == MADV_HUGEPAGE, nohuge = advice == MADV_NOHUGEPAGE;
  int drop = advice == MADV_DONTNEED || advice == MADV_REMOVE;
  if (!(huge || nohuge || drop) || !n) return;
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  uint32_t top = atomic_load(&regions_hi);
  for (uint32_t i = 0; i < top; i++) {
    struct ft_region *r = &regions[i];
    if (atomic_load(&r->state) != FT_LIVE || !(r->start < hi && lo < r->end)) continue;
    if (huge) { /* one eligible range per region: the union's hull */
      uintptr_t l = atomic_load(&r->huge_lo), h = atomic_load(&r->huge_hi);
      atomic_store(&r->huge_lo, h && l < lo ? l : lo);
      atomic_store(&r->huge_hi, h && h > hi ? h : hi);
      continue;
    }
    if (nohuge) { /* cut the eligible range down to its larger part outside [lo, hi) */
      uintptr_t l = atomic_load(&r->huge_lo), h = atomic_load(&r->huge_hi);
      uintptr_t left = lo > l ? lo - l : 0, right = h > hi ? h - hi : 0;
      if (left >= right)
        h = left ? lo : 0;
      else
        l = hi;
      atomic_store(&r->huge_lo, h ? l : 0);
      atomic_store(&r->huge_hi, h);
      continue;
    }
    /* The whole pages dropped inside the region: inaccessible again, not seen. */
    uintptr_t a = lo > r->start ? lo : r->start, b = hi < r->end ? hi : r->end;
    a = (a + PAGE - 1) & ~(PAGE - 1);
    b &= ~(PAGE - 1);
    if (b <= a) continue;
    size_t idx = (a - r->start) / PAGE, k = (b - a) / PAGE;
    if (sys_mprotect(a, b - a, PROT_NONE) != 0) continue;
    bits_clear(r->open, idx, k);
    bits_clear(r->seen, idx, k);
    atomic_fetch_add(&vma_estimate, 2);
  }
}

void locus_ft_prepare(uintptr_t p, size_t n, uint64_t ip, int write) {
  if (!n || !atomic_load_explicit(&locus_ft_live, memory_order_relaxed)) return;
  uintptr_t a = p & ~(PAGE - 1), end = p + n;
  for (; a < end && a + PAGE > p; a += PAGE) {
    struct ft_region *r = find(a);
    if (!r) continue;
    size_t idx = (a - r->start) / PAGE;
    if (bit_of(r->open, idx) || (!write && bit_of(r->seen, idx))) continue; /* accessible */
    on_fault(a, write, ip, 0);
  }
}

int locus_ft_chunk_mmapped(const void *p) {
  /* glibc: the size word before the block; bit 1 = IS_MMAPPED. */
  return p && (((const size_t *)p)[-1] & 2) != 0;
}

int locus_ft_init(void) {
  if (locus_stream_open(&touch_stream, locus_proc_dirfd, "numa.touch.bin") != 0) {
    locus_warn("numa: cannot create numa.touch.bin; the numa lens is off");
    return -1;
  }
  long maxmap = 65530;
  char b[128];
  if (locus_read_small("/proc/sys/vm/max_map_count", b, sizeof b) > 0) maxmap = strtol(b, NULL, 10);
  /* Half of the map count for our splits, less what a program typically maps itself. */
  atomic_store(&vma_budget, maxmap / 2 - 2000 > 64 ? maxmap / 2 - 2000 : 64);
  Dl_info di;
  if (dladdr((void *)locus_ft_init, &di) && di.dli_fbase) dl_iterate_phdr(find_self, di.dli_fbase);
  /* Transparent huge pages: the mode ("[always] madvise never") and the PMD page size. */
  if (locus_read_small("/sys/kernel/mm/transparent_hugepage/enabled", b, sizeof b) > 0) {
    thp_always = strstr(b, "[always]") != NULL;
    if (!strstr(b, "[never]") &&
        locus_read_small("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", b, sizeof b) > 0) {
      unsigned long hs = strtoul(b, NULL, 10);
      if (hs > PAGE && (hs & (hs - 1)) == 0) thp_pages = hs / PAGE;
    }
  }
  if (!thp_pages) thp_always = 0;
  const char *off = getenv("LOCUS_NUMA_FIRST_TOUCH");
  if (off && *off == '0') {
    census_only = 1;
    return 0;
  }
  sigaction_fn real = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  if (!real) return 0;
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (real(SIGSEGV, NULL, &old) != 0) return 0;
  app_segv = old;
  if (real(SIGSEGV, &sa, NULL) != 0) return 0;
  atomic_store(&installed, 1);
  return 0;
}

void locus_ft_after_fork(void) {
  memset(&touch_cursor, 0, sizeof touch_cursor);
  locus_stream_reset_after_fork(&touch_stream);
  if (locus_stream_open(&touch_stream, locus_proc_dirfd, "numa.touch.bin") != 0)
    atomic_store(&installed, 0);
}

/* Per-thread end: the numa lens closes the cursor through this. */
void locus_ft_thread_fini(void) { locus_cursor_finish(&touch_stream, &touch_cursor); }
