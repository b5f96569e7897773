/* The numa lens with the exact backend: every load and store of code built with `locus cc`
 * reaches locus_numa_exact_access (from the comm exact hooks, comm/exact/exact.c).
 *
 * A page shadow (one 32-bit entry per 4 KiB page: node + 1, seen, unpinned-page, epoch)
 * gives each access its page's node; the first instrumented access to a page that is not
 * present yet is its first touch (LOCUS_NT_EXACT; a store places the page at once, as the
 * access itself would, a read leaves it unplaced, node -2). Pages already present when first
 * seen (touched by uninstrumented code: libc's memset, the kernel) have no touch record.
 * Nodes are asked again after mbind or move_pages (a global epoch). Accesses are counted per
 * thread in a hash table keyed by (page, instruction, page node, thread's nodes, flags) and
 * written to numa.counts.bin when the thread ends. Stack accesses are counted, not looked up. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "numa.h"

#define PAGE_SHIFT 12
#define PS_L2_BITS 16
#define PS_ADDR_BITS 47
#define CT_FIRST 4096u
#define CT_MAX (1u << 20)

#define E_SEEN 0x100u
#define E_UNPINNED 0x200u

LOCUS_EXPORT _Atomic int locus_numa_exact_on;
_Atomic uint32_t locus_numa_page_epoch = 1;
_Atomic uint32_t locus_numa_aff_epoch = 1;

static _Atomic(_Atomic uint32_t *) *ps_l1;
static size_t ps_l1_n;
static struct locus_stream count_stream;

struct count_entry {
  uint64_t page, ip, nodes, count, t;
  int16_t node;
  uint16_t flags;
  uint32_t used;
};

/* A thread's counting state. Slots are static so that the thread ending the process can
 * write the counts of the threads still running. */
#define NT_MAX 4096
struct nthread {
  _Atomic int live; /* the slot is claimed */
  int busy;
  uint32_t aff_epoch, tid;
  uint64_t nodes;
  uintptr_t stack_lo, stack_hi;
  struct count_entry *tab;
  uint32_t cap, n;
  uint64_t dropped;
  struct locus_cursor cursor;
};
static struct nthread nslots[NT_MAX];
static LOCUS_TLS struct nthread *me_nt;
static LOCUS_TLS int nt_state; /* 0 unknown, 1 counting, 2 not counted */

static void *raw_map(size_t n) {
  void *p = (void *)syscall(SYS_mmap, NULL, n, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static _Atomic uint32_t *ps_entry(uintptr_t a) {
  uint64_t pg = a >> PAGE_SHIFT, hi = pg >> PS_L2_BITS;
  if (hi >= ps_l1_n) return NULL;
  _Atomic uint32_t *b = atomic_load_explicit(&ps_l1[hi], memory_order_acquire);
  if (LOCUS_UNLIKELY(!b)) {
    _Atomic uint32_t *fresh = raw_map(sizeof(uint32_t) << PS_L2_BITS), *expect = NULL;
    if (!fresh) return NULL;
    if (atomic_compare_exchange_strong(&ps_l1[hi], &expect, fresh))
      b = fresh;
    else {
      syscall(SYS_munmap, fresh, sizeof(uint32_t) << PS_L2_BITS);
      b = expect;
    }
  }
  return &b[pg & ((1u << PS_L2_BITS) - 1)];
}

static int query_node(uintptr_t page) {
  int status = locus_numa_page_status(page);
  return status >= 0 ? status : (status == -ENOENT || status == -EFAULT) ? -2 : -1;
}

/* The page node for this access (first touch recorded when it is one). */
static int page_node(struct nthread *nt, uintptr_t a, uint32_t fl, uint64_t ip, uint16_t *eflags) {
  uintptr_t page = a & ~(uintptr_t)4095;
  _Atomic uint32_t *e = ps_entry(a);
  if (!e) return -1;
  uint32_t epoch = atomic_load_explicit(&locus_numa_page_epoch, memory_order_relaxed) & 0xffff;
  uint32_t v = atomic_load_explicit(e, memory_order_relaxed);
  if (LOCUS_LIKELY((v >> 16) == epoch && (v & 0xff))) {
    *eflags = (v & E_UNPINNED) ? LOCUS_NC_UNPINNED_PAGE : 0;
    return (int)(v & 0xff) - 1;
  }
  int node;
  uint32_t keep = v & (E_SEEN | E_UNPINNED);
  if (!(v & E_SEEN)) {
    uint32_t want = (v & 0xffff) | E_SEEN;
    if (atomic_compare_exchange_strong(e, &v, want)) {
      node = query_node(page);
      keep = E_SEEN;
      if (node == -2) {
        /* Not present: this access is the page's first touch. */
        int unpinned = __builtin_popcountll(nt->nodes) > 1;
        if (unpinned) keep |= E_UNPINNED;
        if (fl & LOCUS_AC_STORE) {
          __atomic_fetch_or((volatile unsigned char *)page, (unsigned char)0, __ATOMIC_RELAXED);
          node = query_node(page);
        }
        locus_ft_touch(page, ip, 0, 1, node, nt->nodes,
                       (uint16_t)(LOCUS_NT_EXACT | ((fl & LOCUS_AC_STORE) ? LOCUS_NT_WRITE : 0)));
      }
    } else {
      node = query_node(page);
      keep = v & (E_SEEN | E_UNPINNED);
    }
  } else {
    if ((fl & LOCUS_AC_STORE) && query_node(page) == -2)
      __atomic_fetch_or((volatile unsigned char *)page, (unsigned char)0, __ATOMIC_RELAXED);
    node = query_node(page);
  }
  if (locus_numa.emulated) node = node == -2 ? -2 : -1;
  uint32_t nv = (epoch << 16) | keep | (node >= 0 && node < 255 ? (uint32_t)node + 1 : 0);
  atomic_store_explicit(e, nv, memory_order_relaxed);
  *eflags = (keep & E_UNPINNED) ? LOCUS_NC_UNPINNED_PAGE : 0;
  return node;
}

static uint32_t ct_hash(uint64_t page, uint64_t ip, uint64_t nodes, int node, uint16_t flags) {
  uint64_t h = page * 0x9e3779b97f4a7c15ull ^ ip * 0xbf58476d1ce4e5b9ull ^ nodes ^
               ((uint64_t)(uint16_t)node << 16 | flags);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  return (uint32_t)(h ^ (h >> 32));
}

static struct count_entry *ct_find(struct count_entry *tab, uint32_t cap, uint64_t page,
                                   uint64_t ip, uint64_t nodes, int node, uint16_t flags) {
  uint32_t m = cap - 1;
  for (uint32_t i = ct_hash(page, ip, nodes, node, flags) & m;; i = (i + 1) & m) {
    struct count_entry *c = &tab[i];
    if (!c->used || (c->page == page && c->ip == ip && c->nodes == nodes && c->node == node &&
                     c->flags == flags))
      return c;
  }
}

static int ct_grow(struct nthread *nt) {
  uint32_t cap = nt->cap ? nt->cap * 2 : CT_FIRST;
  if (cap > CT_MAX) return -1;
  struct count_entry *t = raw_map((size_t)cap * sizeof *t);
  if (!t) return -1;
  for (uint32_t i = 0; i < nt->cap; i++) {
    struct count_entry *o = &nt->tab[i];
    if (o->used) *ct_find(t, cap, o->page, o->ip, o->nodes, o->node, o->flags) = *o;
  }
  if (nt->tab) syscall(SYS_munmap, nt->tab, (size_t)nt->cap * sizeof *nt->tab);
  nt->tab = t;
  nt->cap = cap;
  return 0;
}

static void thread_start(void) {
  nt_state = 2;
  if (!locus_me.tid || locus_me.state != 1) return;
  struct nthread *nt = NULL;
  for (int i = 0; i < NT_MAX && !nt; i++) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&nslots[i].live, &expect, 1)) nt = &nslots[i];
  }
  if (!nt) return;
  nt->busy = 0;
  nt->tid = locus_me.tid;
  nt->aff_epoch = 0;
  nt->tab = NULL;
  nt->cap = nt->n = 0;
  nt->dropped = 0;
  memset(&nt->cursor, 0, sizeof nt->cursor);
  nt->stack_lo = nt->stack_hi = 0;
  uintptr_t lo, hi;
  if (locus_thread_stack(&lo, &hi) == 0) {
    nt->stack_lo = lo;
    nt->stack_hi = hi;
  }
  me_nt = nt;
  nt_state = 1;
}

LOCUS_EXPORT void locus_numa_exact_access(uintptr_t a, uint32_t len, uint32_t fl, uint64_t ip) {
  (void)len;
  if (LOCUS_UNLIKELY(nt_state != 1)) {
    if (nt_state == 2 || locus_me.guard || locus_me.state == 2) return;
    if (locus_me.state != 1) locus_self_get();
    if (nt_state == 0) thread_start();
    if (nt_state != 1) return;
  }
  struct nthread *nt = me_nt;
  if (nt->busy) return;
  nt->busy = 1;
  uint32_t ae = atomic_load_explicit(&locus_numa_aff_epoch, memory_order_relaxed);
  if (LOCUS_UNLIKELY(ae != nt->aff_epoch)) {
    nt->aff_epoch = ae;
    nt->nodes = locus_numa_self_nodes(NULL);
  }
  uint16_t flags = (uint16_t)(fl & LOCUS_AC_STORE), ef = 0;
  uint64_t page = a & ~(uint64_t)4095;
  int node;
  if (a >= nt->stack_lo && a < nt->stack_hi) {
    flags |= LOCUS_AC_STACK;
    node = -3;
  } else {
    node = page_node(nt, a, fl, ip, &ef);
    flags |= ef;
  }
  if ((!nt->tab || nt->n * 2 >= nt->cap) && ct_grow(nt) != 0 &&
      (!nt->tab || nt->n + 1 >= nt->cap)) {
    nt->dropped++;
    nt->busy = 0;
    return;
  }
  struct count_entry *c = ct_find(nt->tab, nt->cap, page, ip, nt->nodes, node, flags);
  if (!c->used) {
    c->used = 1;
    c->page = page;
    c->ip = ip;
    c->nodes = nt->nodes;
    c->node = (int16_t)node;
    c->flags = flags;
    nt->n++;
  }
  c->count++;
  c->t = locus_ticks();
  nt->busy = 0;
}

static void flush(struct nthread *nt) {
  nt->busy = 1;
  for (uint32_t i = 0; nt->tab && i < nt->cap; i++) {
    struct count_entry *c = &nt->tab[i];
    if (!c->used) continue;
    struct locus_numa_count r;
    memset(&r, 0, sizeof r);
    r.kind = 1;
    r.t = c->t;
    r.addr = c->page;
    r.ip = c->ip;
    r.nodes = c->nodes;
    r.count = c->count;
    r.tid = nt->tid;
    r.node = c->node;
    r.flags = c->flags;
    locus_cursor_put(&count_stream, &nt->cursor, &r, sizeof r);
  }
  locus_cursor_finish(&count_stream, &nt->cursor);
  if (nt->tab) syscall(SYS_munmap, nt->tab, (size_t)nt->cap * sizeof *nt->tab);
  nt->tab = NULL;
  nt->cap = nt->n = 0;
}

/* The calling thread ends: write its counts and free its slot. */
void locus_numa_exact_thread_fini(void) {
  if (nt_state != 1) return;
  nt_state = 2;
  struct nthread *nt = me_nt;
  flush(nt);
  me_nt = NULL;
  atomic_store(&nt->live, 0);
}

/* The process ends: this thread's counts and those of the threads still running. */
void locus_numa_exact_proc_fini(void) {
  atomic_store(&locus_numa_exact_on, 0);
  nt_state = 2;
  for (int i = 0; i < NT_MAX; i++)
    if (atomic_load(&nslots[i].live) == 1) {
      flush(&nslots[i]);
      atomic_store(&nslots[i].live, 0);
    }
}

int locus_numa_exact_init(void) {
  ps_l1_n = 1ull << (PS_ADDR_BITS - PAGE_SHIFT - PS_L2_BITS);
  ps_l1 = raw_map(ps_l1_n * sizeof *ps_l1);
  if (!ps_l1) return -1;
  if (locus_stream_open(&count_stream, locus_proc_dirfd, "numa.counts.bin") != 0) return -1;
  atomic_store(&locus_numa_exact_on, 1);
  return 0;
}

/* In the child: only the forking thread lives on, with an empty table. */
void locus_numa_exact_after_fork(void) {
  for (int i = 0; i < NT_MAX; i++) atomic_store(&nslots[i].live, 0);
  me_nt = NULL;
  nt_state = 0;
  locus_stream_reset_after_fork(&count_stream);
  if (locus_stream_open(&count_stream, locus_proc_dirfd, "numa.counts.bin") != 0)
    atomic_store(&locus_numa_exact_on, 0);
}
