/* The numa lens: topology, the pinning log and the page-node query of samples. See numa.h. */
#define _GNU_SOURCE
#include "numa.h"

#include "../comm/allocs.h"
#include "../comm/comm.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

struct locus_numa_state locus_numa;

static struct locus_stream pin_stream;
static LOCUS_TLS struct locus_cursor pin_cursor;
static LOCUS_TLS int pin_busy; /* a pin record is being written (a signal may not nest one) */

int locus_numa_cpu_node(int cpu) {
  if (cpu < 0 || cpu >= locus_numa.ncpus) return -1;
  return locus_numa.cpu_node[cpu];
}

uint64_t locus_numa_mask_nodes(const void *set, size_t size, uint32_t *ncpus) {
  const unsigned char *b = set;
  uint64_t nodes = 0;
  uint32_t n = 0;
  for (size_t i = 0; i < size; i++) {
    if (!b[i]) continue;
    for (int k = 0; k < 8; k++) {
      if (!(b[i] >> k & 1)) continue;
      n++;
      int node = locus_numa_cpu_node((int)(i * 8 + (size_t)k));
      if (node >= 0 && node < 64) nodes |= 1ull << node;
    }
  }
  if (ncpus) *ncpus = n;
  return nodes;
}

uint64_t locus_numa_self_nodes(uint32_t *ncpus) {
  unsigned char set[LOCUS_NUMA_MAX_CPUS / 8];
  long n = syscall(SYS_sched_getaffinity, 0, sizeof set, set);
  if (n <= 0) {
    if (ncpus) *ncpus = 0;
    return 0;
  }
  return locus_numa_mask_nodes(set, (size_t)n, ncpus);
}

int locus_numa_page_status(uint64_t addr) {
  void *page = (void *)(uintptr_t)(addr & ~(uint64_t)4095);
  int status = -EINVAL;
  if (syscall(SYS_move_pages, 0, 1ul, &page, NULL, &status, 0) != 0) return -errno;
  return status;
}

/* The sampled backends' page -> node cache, per thread (the sampler's signal handler): a
 * direct-mapped table of placed pages. An entry holds while locus_numa_page_epoch is
 * unchanged (the program's mbind, move_pages, munmap, mremap and madvise dropping pages bump
 * it) and for NC_TTL_US at most (the kernel's own migrations, automatic NUMA balancing, are
 * seen within that). Pages not present are never cached: they may be placed any time. */
#define NC_SIZE 64
#define NC_TTL_US 100000.0
struct nc_entry {
  uint64_t page; /* page number + 1; 0 = empty */
  uint64_t t;    /* ticks of the query */
  uint32_t epoch;
  int32_t node;
};
/* Mapped by the thread's first sample (a signal handler: mmap, not malloc), not in
 * thread-local storage, which every thread of the program carries (its static TLS is zeroed
 * at each thread's creation, resident on the thread's stack mapping). */
static LOCUS_TLS struct nc_entry *nc;
static uint64_t nc_ttl_ticks;

static struct nc_entry *nc_table(void) {
  if (!nc) {
    void *p = (void *)syscall(SYS_mmap, NULL, NC_SIZE * sizeof *nc, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    nc = p == MAP_FAILED ? NULL : p;
  }
  return nc;
}

/* At the thread's end. Cleared first: a sample landing in between maps a new one (a page
 * left behind) instead of using an unmapped one. */
static void nc_free(void) {
  struct nc_entry *t = nc;
  nc = NULL;
  if (t) syscall(SYS_munmap, t, NC_SIZE * sizeof *t);
}

int locus_numa_sample_node(uint64_t addr, uint32_t flags) {
  if (flags & LOCUS_AC_STACK) return -3;
  if (locus_numa.emulated) return -1;
  uint64_t pg = (addr >> 12) + 1, now = locus_ticks();
  uint32_t epoch = atomic_load_explicit(&locus_numa_page_epoch, memory_order_relaxed);
  struct nc_entry *t = nc_table(), *e = t ? &t[(pg ^ (pg >> 6)) & (NC_SIZE - 1)] : NULL;
  if (e && e->page == pg && e->epoch == epoch && now - e->t < nc_ttl_ticks) return e->node;
  int status = locus_numa_page_status(addr);
  if (status >= 0) {
    if (e) {
      e->page = pg;
      e->t = now;
      e->epoch = epoch;
      e->node = status;
    }
    return status;
  }
  return status == -ENOENT ? -2 : -1;
}

void locus_numa_pages_changed(void) { atomic_fetch_add(&locus_numa_page_epoch, 1); }

void locus_numa_pin(uint8_t what, uint32_t tid, uint64_t nodes, uint32_t ncpus, uint8_t mode,
                    uint64_t policy_nodes, uint64_t addr, uint64_t len, uint64_t ip) {
  if (!locus_numa.on || pin_busy || !locus_self_get()) return;
  pin_busy = 1;
  struct locus_numa_pin r;
  memset(&r, 0, sizeof r);
  r.kind = 1;
  r.what = what;
  r.mode = mode;
  r.tid = tid;
  r.caller = locus_me.tid;
  r.ncpus = ncpus;
  r.t = locus_ticks();
  r.nodes = nodes;
  r.ip = ip;
  r.policy_nodes = policy_nodes;
  r.addr = addr;
  r.len = len;
  locus_cursor_put(&pin_stream, &pin_cursor, &r, sizeof r);
  if (what == LOCUS_NP_SCHED_SETAFFINITY || what == LOCUS_NP_PTHREAD_SETAFFINITY)
    atomic_fetch_add(&locus_numa_aff_epoch, 1);
  if (what == LOCUS_NP_MBIND || what == LOCUS_NP_MOVE_PAGES)
    atomic_fetch_add(&locus_numa_page_epoch, 1);
  pin_busy = 0;
}

/* The calling thread's memory policy (mode, node mask), or mode 0xff when unknown. */
static uint8_t self_policy(uint64_t *mask) {
  int mode = 0;
  unsigned long m[LOCUS_NUMA_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
  *mask = 0;
  if (syscall(SYS_get_mempolicy, &mode, m, (unsigned long)LOCUS_NUMA_MAX_NODES, NULL, 0ul) != 0)
    return 0xff;
  *mask = (uint64_t)m[0];
  return (uint8_t)(mode & 0xff);
}

static void pin_self(uint8_t what) {
  uint32_t ncpus = 0;
  uint64_t nodes = locus_numa_self_nodes(&ncpus), pol = 0;
  uint8_t mode = self_policy(&pol);
  locus_numa_pin(what, locus_me.tid, nodes, ncpus, mode, pol, 0, 0, 0);
}

/* LOCUS_NUMA_CPUNODE: "n0,n1,..." node of each CPU. Without it, every CPU is on node 0. */
static void read_topology(void) {
  const char *s = getenv("LOCUS_NUMA_CPUNODE");
  int n = 0, maxnode = 0;
  while (s && *s && n < LOCUS_NUMA_MAX_CPUS) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s) break;
    locus_numa.cpu_node[n++] = (int16_t)(v >= 0 && v < LOCUS_NUMA_MAX_NODES ? v : 0);
    if (v > maxnode && v < LOCUS_NUMA_MAX_NODES) maxnode = (int)v;
    s = *end == ',' ? end + 1 : end;
  }
  if (n == 0) {
    n = (int)sysconf(_SC_NPROCESSORS_CONF);
    if (n <= 0 || n > LOCUS_NUMA_MAX_CPUS) n = LOCUS_NUMA_MAX_CPUS;
    memset(locus_numa.cpu_node, 0, sizeof locus_numa.cpu_node);
  }
  locus_numa.ncpus = n;
  locus_numa.nnodes = maxnode + 1;
  const char *f = getenv("LOCUS_NUMA_FAKE");
  locus_numa.emulated = f && *f == '1';
}

static int proc_init(void) {
  read_topology();
  nc_ttl_ticks = (uint64_t)(NC_TTL_US * (locus_ticks_per_us > 0 ? locus_ticks_per_us : 1000.0));
  if (locus_stream_open(&pin_stream, locus_proc_dirfd, "numa.pins.bin") != 0) {
    locus_warn("numa: cannot create numa.pins.bin; the numa lens is off");
    return -1;
  }
  locus_numa.on = 1;
  if (locus_comm_cfg.backend == LOCUS_BK_EXACT && locus_numa_exact_init() != 0) {
    locus_warn("numa: cannot set up the exact backend's page table; the numa lens is off");
    locus_numa.on = 0;
    return -1;
  }
  if (locus_ft_init() != 0) {
    locus_numa.on = 0;
    return -1;
  }
  __atomic_fetch_or(&locus_alloc_state, LOCUS_ALLOC_NUMA, __ATOMIC_RELEASE);
  return 0;
}

static void thread_init(void) {
  memset(&pin_cursor, 0, sizeof pin_cursor);
  pin_self(LOCUS_NP_START);
}

void locus_ft_after_fork(void);
void locus_ft_thread_fini(void);

static void thread_fini(void) {
  locus_numa_exact_thread_fini();
  pin_self(LOCUS_NP_END);
  locus_cursor_finish(&pin_stream, &pin_cursor);
  locus_ft_thread_fini();
  nc_free();
}

static void proc_fini(void) {
  locus_numa_exact_proc_fini();
  locus_ft_proc_fini();
  pin_self(LOCUS_NP_END);
  locus_cursor_finish(&pin_stream, &pin_cursor);
  locus_ft_thread_fini();
}

/* Before a seccomp filter: no new region is protected, and every protected page gets the
 * program's protection back (its first touch could not be taken after the filter). */
static void sandbox(void) {
  locus_numa.on = 0;
  locus_ft_release(NULL, SIZE_MAX);
}

static void after_fork(void) {
  memset(&pin_cursor, 0, sizeof pin_cursor);
  locus_stream_reset_after_fork(&pin_stream);
  if (locus_stream_open(&pin_stream, locus_proc_dirfd, "numa.pins.bin") != 0) {
    locus_numa.on = 0;
    return;
  }
  locus_ft_after_fork();
  if (atomic_load(&locus_numa_exact_on)) locus_numa_exact_after_fork();
  pin_self(LOCUS_NP_START);
}

struct locus_lens locus_lens_numa = {
    .name = "numa",
    .proc_init = proc_init,
    .thread_init = thread_init,
    .thread_fini = thread_fini,
    .proc_fini = proc_fini,
    .after_fork = after_fork,
    .sandbox = sandbox,
};
