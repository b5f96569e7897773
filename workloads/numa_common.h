/* Helpers shared by the numa workloads (numa_*.c): the NUMA topology, pinning, memory
 * policies, page placement, and the truth JSON.
 *
 * No libnuma: the memory-policy calls are raw syscalls (mbind, set_mempolicy, get_mempolicy,
 * move_pages) with the constants of <linux/mempolicy.h> defined here. The workload's own
 * policy actions (mbind, set_mempolicy, a move_pages that moves) go through the functions of
 * those names when some library defines them (dlsym(RTLD_DEFAULT): libnuma, or a profiler's
 * interposer preloaded with LD_PRELOAD), so that an interposer sees them; glibc defines none,
 * so a plain run makes the raw syscall. The bookkeeping (placement queries, get_mempolicy)
 * always makes the raw syscall, invisible to interposers. The topology is read
 * from /sys/devices/system/node/node<N>/cpulist, restricted to the CPUs the process may run
 * on; a machine without that directory is one node 0 holding every allowed CPU. "nodes" in
 * every truth is the number of nodes with at least one such CPU.
 *
 * Every binding call a workload makes (sched_setaffinity, pthread_setaffinity_np,
 * set_mempolicy, mbind) goes through the nm_* wrappers below, which log it (thread, what,
 * CPU or node set, monotonic time, global order) for the truth. Page placement is measured,
 * not assumed: move_pages with nodes = NULL on every page gives the node each page is on.
 * Transparent huge pages are disabled for the process (PR_SET_THP_DISABLE) so that a first
 * touch places exactly one base page. */
#ifndef WORKLOADS_NUMA_COMMON_H
#define WORKLOADS_NUMA_COMMON_H

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "common.h"

/* <linux/mempolicy.h>, without depending on its header being installed. */
#ifndef MPOL_DEFAULT
#define MPOL_DEFAULT 0
#define MPOL_PREFERRED 1
#define MPOL_BIND 2
#define MPOL_INTERLEAVE 3
#define MPOL_LOCAL 4
#endif
#ifndef MPOL_F_NODE
#define MPOL_F_NODE (1 << 0) /* get_mempolicy: return the node of `addr` */
#define MPOL_F_ADDR (1 << 1) /* get_mempolicy: the policy of the VMA holding `addr` */
#endif
#ifndef MPOL_MF_STRICT
#define MPOL_MF_STRICT (1 << 0)
#define MPOL_MF_MOVE (1 << 1)
#define MPOL_MF_MOVE_ALL (1 << 2)
#endif
#ifndef PR_SET_THP_DISABLE
#define PR_SET_THP_DISABLE 41
#endif

#define NM_MAX_NODES 64 /* node masks are one unsigned long */
#define NM_MAX_CPUS CPU_SETSIZE
#define NM_MAX_THREADS 64 /* thread indices: 0 = main, then in creation order */
#define NM_MAX_LOG 256
#define NM_MASK_BITS (NM_MAX_NODES + 1) /* the kernel's maxnode counts one bit too many */

static inline const char *nm_mode_name(int mode) {
  switch (mode) {
    case MPOL_DEFAULT:
      return "MPOL_DEFAULT";
    case MPOL_PREFERRED:
      return "MPOL_PREFERRED";
    case MPOL_BIND:
      return "MPOL_BIND";
    case MPOL_INTERLEAVE:
      return "MPOL_INTERLEAVE";
    case MPOL_LOCAL:
      return "MPOL_LOCAL";
    default:
      return "unknown";
  }
}

/* ---- Topology ---- */

static struct {
  int nnodes;                   /* nodes with allowed CPUs */
  int node_ids[NM_MAX_NODES];   /* ascending */
  int ncpus;                    /* allowed CPUs */
  int cpus[NM_MAX_CPUS];        /* ascending */
  int rr_cpus[NM_MAX_CPUS];     /* the same CPUs, round-robin over the nodes */
  int node_of_cpu[NM_MAX_CPUS]; /* -1: not allowed */
  int from_sysfs;               /* 0: no /sys/devices/system/node, all on node 0 */
  long page_size;
  int thp_disabled;
  int numa_balancing; /* /proc/sys/kernel/numa_balancing, -1 if unreadable */
  int syscalls;       /* 1 if move_pages answers (CONFIG_NUMA) */
  uint64_t t0_ns;     /* nm_init time: binding times are also given relative to it */
} nm_topo;

/* Parses a cpulist ("0-3,8,10-11"); sets cpus[c] = 1 for each listed c < NM_MAX_CPUS. */
static inline void nm_parse_cpulist(const char *s, unsigned char *cpus) {
  while (*s) {
    char *end;
    long a = strtol(s, &end, 10);
    if (end == s) break;
    long b = a;
    s = end;
    if (*s == '-') {
      b = strtol(s + 1, &end, 10);
      s = end;
    }
    for (long c = a; c <= b && c < NM_MAX_CPUS; c++)
      if (c >= 0) cpus[c] = 1;
    if (*s == ',')
      s++;
    else
      break;
  }
}

static inline void nm_read_topology(void) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) wl_die("sched_getaffinity", errno);
  for (int c = 0; c < NM_MAX_CPUS; c++) nm_topo.node_of_cpu[c] = -1;
  DIR *d = opendir("/sys/devices/system/node");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      int node;
      char tail;
      if (sscanf(e->d_name, "node%d%c", &node, &tail) != 1 || node < 0 || node >= NM_MAX_NODES)
        continue;
      char path[300], list[4096] = "";
      snprintf(path, sizeof path, "/sys/devices/system/node/%s/cpulist", e->d_name);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      if (!fgets(list, sizeof list, f)) list[0] = '\0';
      fclose(f);
      static unsigned char in_node[NM_MAX_CPUS];
      memset(in_node, 0, sizeof in_node);
      nm_parse_cpulist(list, in_node);
      for (int c = 0; c < NM_MAX_CPUS; c++)
        if (in_node[c] && CPU_ISSET(c, &allowed)) nm_topo.node_of_cpu[c] = node;
      nm_topo.from_sysfs = 1;
    }
    closedir(d);
  }
  if (!nm_topo.from_sysfs)
    for (int c = 0; c < NM_MAX_CPUS; c++)
      if (CPU_ISSET(c, &allowed)) nm_topo.node_of_cpu[c] = 0;
  /* Allowed CPUs that sysfs puts on no node (should not happen): node 0. */
  for (int c = 0; c < NM_MAX_CPUS; c++)
    if (CPU_ISSET(c, &allowed) && nm_topo.node_of_cpu[c] < 0) nm_topo.node_of_cpu[c] = 0;
  unsigned char has[NM_MAX_NODES] = {0};
  for (int c = 0; c < NM_MAX_CPUS; c++) {
    if (nm_topo.node_of_cpu[c] < 0) continue;
    nm_topo.cpus[nm_topo.ncpus++] = c;
    has[nm_topo.node_of_cpu[c]] = 1;
  }
  for (int n = 0; n < NM_MAX_NODES; n++)
    if (has[n]) nm_topo.node_ids[nm_topo.nnodes++] = n;
  /* Round-robin: the first CPU of every node, then the second of every node, ... */
  int k = 0;
  for (int r = 0; k < nm_topo.ncpus; r++) {
    for (int i = 0; i < nm_topo.nnodes; i++) {
      int seen = 0;
      for (int j = 0; j < nm_topo.ncpus; j++) {
        int c = nm_topo.cpus[j];
        if (nm_topo.node_of_cpu[c] != nm_topo.node_ids[i]) continue;
        if (seen++ == r) {
          nm_topo.rr_cpus[k++] = c;
          break;
        }
      }
    }
  }
}

static inline int nm_node_of_cpu(int cpu) {
  return cpu >= 0 && cpu < NM_MAX_CPUS ? nm_topo.node_of_cpu[cpu] : -1;
}
static inline int nm_first_node(void) { return nm_topo.node_ids[0]; }
static inline int nm_last_node(void) { return nm_topo.node_ids[nm_topo.nnodes - 1]; }
static inline int nm_first_cpu(void) { return nm_topo.cpus[0]; }
static inline int nm_last_cpu(void) { return nm_topo.cpus[nm_topo.ncpus - 1]; }
/* The CPU of worker i: round-robin over the nodes, so consecutive workers sit on different
 * nodes while there are several. */
static inline int nm_worker_cpu(long i) { return nm_topo.rr_cpus[i % nm_topo.ncpus]; }

static inline int nm_first_cpu_of_node(int node) {
  for (int j = 0; j < nm_topo.ncpus; j++)
    if (nm_topo.node_of_cpu[nm_topo.cpus[j]] == node) return nm_topo.cpus[j];
  return -1;
}

static inline unsigned long nm_all_nodes_mask(void) {
  unsigned long m = 0;
  for (int i = 0; i < nm_topo.nnodes; i++) m |= 1ul << nm_topo.node_ids[i];
  return m;
}

/* ---- The policy calls: a library's function of that name if any, else the syscall ---- */

static struct {
  long (*mbind)(void *, unsigned long, int, const unsigned long *, unsigned long, unsigned);
  long (*set_mempolicy)(int, const unsigned long *, unsigned long);
  long (*move_pages)(int, unsigned long, void **, const int *, int *, int);
} nm_fn;

static inline void nm_resolve(void) {
  *(void **)&nm_fn.mbind = dlsym(RTLD_DEFAULT, "mbind");
  *(void **)&nm_fn.set_mempolicy = dlsym(RTLD_DEFAULT, "set_mempolicy");
  *(void **)&nm_fn.move_pages = dlsym(RTLD_DEFAULT, "move_pages");
}

/* These return 0 (move_pages: pages not moved) or -1 with errno, as libnuma's do. */
static inline long nm_call_mbind(void *addr, size_t len, int mode, const unsigned long *nodes) {
  if (nm_fn.mbind) return nm_fn.mbind(addr, len, mode, nodes, NM_MASK_BITS, 0);
  return syscall(SYS_mbind, addr, len, mode, nodes, (unsigned long)NM_MASK_BITS, 0);
}

static inline long nm_call_set_mempolicy(int mode, const unsigned long *nodes) {
  if (nm_fn.set_mempolicy) return nm_fn.set_mempolicy(mode, nodes, NM_MASK_BITS);
  return syscall(SYS_set_mempolicy, mode, nodes, (unsigned long)NM_MASK_BITS);
}

static inline long nm_call_move_pages(unsigned long n, void **pages, const int *nodes, int *status,
                                      int flags) {
  if (nodes && nm_fn.move_pages) return nm_fn.move_pages(0, n, pages, nodes, status, flags);
  return syscall(SYS_move_pages, 0, n, pages, nodes, status, flags);
}

/* ---- Threads and the binding log ---- */

static unsigned nm_tids[NM_MAX_THREADS];
static int nm_nthreads; /* highest registered index + 1 */

static inline void nm_register_thread(int index) {
  __atomic_store_n(&nm_tids[index], wl_gettid(), __ATOMIC_RELEASE);
  int n = __atomic_load_n(&nm_nthreads, __ATOMIC_ACQUIRE);
  while (n < index + 1 && !__atomic_compare_exchange_n(&nm_nthreads, &n, index + 1, 0,
                                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}

struct nm_binding {
  int thread; /* index */
  const char *call;
  int cpu;             /* affinity calls: the one CPU; -1 for memory policies */
  int mode;            /* memory policies */
  unsigned long nodes; /* memory policies: node mask */
  uintptr_t lo, hi;    /* mbind: the range */
  uint64_t t_ns;       /* CLOCK_MONOTONIC, just before the call */
  int rc;              /* 0 or errno */
};
static struct nm_binding nm_log[NM_MAX_LOG];
static int nm_nlog;

static inline struct nm_binding *nm_log_new(int thread, const char *call) {
  int k = __atomic_fetch_add(&nm_nlog, 1, __ATOMIC_ACQ_REL);
  if (k >= NM_MAX_LOG) wl_die("numa binding log full", ENOSPC);
  struct nm_binding *b = &nm_log[k];
  b->thread = thread;
  b->call = call;
  b->cpu = -1;
  b->t_ns = wl_now_ns();
  return b;
}

/* Pins the calling thread (index `thread`) to `cpu` with pthread_setaffinity_np. */
static inline void nm_pin_pthread(int thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  struct nm_binding *b = nm_log_new(thread, "pthread_setaffinity_np");
  b->cpu = cpu;
  b->rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (b->rc) wl_die("pthread_setaffinity_np", b->rc);
}

/* Pins the calling thread to `cpu` with sched_setaffinity(0, ...). */
static inline void nm_pin_sched(int thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  struct nm_binding *b = nm_log_new(thread, "sched_setaffinity");
  b->cpu = cpu;
  b->rc = sched_setaffinity(0, sizeof set, &set) ? errno : 0;
  if (b->rc) wl_die("sched_setaffinity", b->rc);
}

static inline void nm_set_mempolicy(int thread, int mode, unsigned long nodes) {
  struct nm_binding *b = nm_log_new(thread, "set_mempolicy");
  b->mode = mode;
  b->nodes = nodes;
  b->rc = nm_call_set_mempolicy(mode, &nodes) ? errno : 0;
  if (b->rc && b->rc != ENOSYS) wl_die("set_mempolicy", b->rc);
}

/* Returns 0 or errno (ENOSYS: a kernel without NUMA). */
static inline int nm_mbind(int thread, void *addr, size_t len, int mode, unsigned long nodes) {
  struct nm_binding *b = nm_log_new(thread, "mbind");
  b->mode = mode;
  b->nodes = nodes;
  b->lo = (uintptr_t)addr;
  b->hi = (uintptr_t)addr + len;
  b->rc = nm_call_mbind(addr, len, mode, &nodes) ? errno : 0;
  if (b->rc && b->rc != ENOSYS) wl_die("mbind", b->rc);
  return b->rc;
}

/* The policy mode of the mapping holding `addr` (get_mempolicy MPOL_F_ADDR), -1 if unknown. */
static inline int nm_policy_of(void *addr) {
  int mode = -1;
  if (syscall(SYS_get_mempolicy, &mode, NULL, 0ul, addr, (unsigned long)MPOL_F_ADDR) != 0)
    return -1;
  return mode;
}

/* ---- Pages ---- */

static inline uintptr_t nm_page_down(uintptr_t a) {
  return a & ~(uintptr_t)(nm_topo.page_size - 1);
}
static inline uintptr_t nm_page_up(uintptr_t a) { return nm_page_down(a + nm_topo.page_size - 1); }

/* AnonHugePages (kB) of the mappings overlapping [lo, hi), from /proc/self/smaps; -1 if
 * unreadable. */
static inline long nm_anon_huge_kb(uintptr_t lo, uintptr_t hi) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  unsigned long a, b;
  long kb = 0, v;
  int inside = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
      inside = a < hi && lo < b;
    else if (inside && sscanf(line, "AnonHugePages: %ld kB", &v) == 1)
      kb += v;
  }
  fclose(f);
  return kb;
}
static inline long nm_pages(uintptr_t lo, uintptr_t hi) {
  return hi > lo ? (long)((nm_page_up(hi) - nm_page_down(lo)) / nm_topo.page_size) : 0;
}

/* Where the pages of [lo, hi) are: pages and bytes (of [lo, hi)) per node. */
struct nm_place {
  int ok; /* 0: move_pages failed (err), counts are meaningless */
  int err;
  long pages[NM_MAX_NODES];
  long bytes[NM_MAX_NODES];
  long absent, absent_bytes; /* not present (never touched) or not queryable */
  long calls;                /* move_pages calls made */
};

#define NM_BATCH 1024

/* move_pages(0, n, pages, NULL, status, 0) on every page of [lo, hi), NM_BATCH pages per
 * call (a raw syscall). With `to_node` >= 0 it moves them there instead (MPOL_MF_MOVE,
 * through nm_call_move_pages) and counts where they are afterwards. */
static inline void nm_query_or_move(uintptr_t lo, uintptr_t hi, int to_node, struct nm_place *p) {
  memset(p, 0, sizeof *p);
  p->ok = 1;
  void *pages[NM_BATCH];
  int status[NM_BATCH], nodes[NM_BATCH];
  for (int k = 0; k < NM_BATCH; k++) nodes[k] = to_node;
  uintptr_t ps = (uintptr_t)nm_topo.page_size;
  for (uintptr_t a = nm_page_down(lo); a < hi;) {
    int n = 0;
    for (uintptr_t b = a; n < NM_BATCH && b < hi; b += ps) pages[n++] = (void *)b;
    long rc = nm_call_move_pages((unsigned long)n, pages, to_node >= 0 ? nodes : NULL, status,
                                 to_node >= 0 ? MPOL_MF_MOVE : 0);
    p->calls++;
    if (rc < 0) {
      p->ok = 0;
      p->err = errno;
      return;
    }
    for (int k = 0; k < n; k++) {
      uintptr_t pl = (uintptr_t)pages[k], ph = pl + ps;
      long bytes = (long)((ph < hi ? ph : hi) - (pl > lo ? pl : lo));
      if (status[k] >= 0 && status[k] < NM_MAX_NODES) {
        p->pages[status[k]]++;
        p->bytes[status[k]] += bytes;
      } else {
        p->absent++;
        p->absent_bytes += bytes;
      }
    }
    a += (uintptr_t)n * ps;
  }
}

static inline void nm_placement(const void *lo, const void *hi, struct nm_place *p) {
  nm_query_or_move((uintptr_t)lo, (uintptr_t)hi, -1, p);
}

static inline long nm_present(const struct nm_place *p) {
  long n = 0;
  for (int i = 0; i < NM_MAX_NODES; i++) n += p->pages[i];
  return n;
}

/* 1 if two measurements agree (pages per node and absent pages): nothing moved in between.
 * Automatic NUMA balancing (kernel.numa_balancing = 1) migrates pages towards the threads
 * that access them, which changes what "remote" means during a run. */
static inline int nm_same_place(const struct nm_place *a, const struct nm_place *b) {
  if (!a->ok || !b->ok) return a->ok == b->ok;
  return a->absent == b->absent && memcmp(a->pages, b->pages, sizeof a->pages) == 0;
}

/* ---- Setup ---- */

static inline long nm_arg_double_ns(const char *s, const char *usage) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(v > 0 && v < 3600)) {
    fprintf(stderr, "usage: %s\n", usage);
    exit(2);
  }
  return (long)(v * 1e9);
}

/* Removes `--name VALUE` or `--name=VALUE` from argv; returns VALUE or NULL if absent. A
 * missing value is a usage error (exit 2). */
static inline const char *nm_take_option(int *argc, char **argv, const char *name,
                                         const char *usage) {
  const char *value = NULL;
  size_t len = strlen(name);
  int out = 0;
  for (int i = 0; i < *argc; i++) {
    if (i > 0 && strcmp(argv[i], name) == 0) {
      if (i + 1 >= *argc) {
        fprintf(stderr, "usage: %s\n", usage);
        exit(2);
      }
      value = argv[++i];
      continue;
    }
    if (i > 0 && strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
      value = argv[i] + len + 1;
      continue;
    }
    argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  return value;
}

/* Reads the topology, disables THP, registers the main thread as index 0. */
static inline void nm_init(void) {
  nm_topo.t0_ns = wl_now_ns();
  nm_topo.page_size = sysconf(_SC_PAGESIZE);
  nm_topo.thp_disabled = prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;
  nm_topo.numa_balancing = -1;
  FILE *f = fopen("/proc/sys/kernel/numa_balancing", "r");
  if (f) {
    if (fscanf(f, "%d", &nm_topo.numa_balancing) != 1) nm_topo.numa_balancing = -1;
    fclose(f);
  }
  nm_read_topology();
  nm_resolve();
  int st = -1;
  void *page = (void *)nm_page_down((uintptr_t)&st);
  nm_topo.syscalls = syscall(SYS_move_pages, 0, 1ul, &page, NULL, &st, 0) == 0;
  nm_register_thread(0);
}

static inline int nm_barrier_wait(pthread_barrier_t *b) {
  int rc = pthread_barrier_wait(b);
  if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) wl_die("pthread_barrier_wait", rc);
  return rc;
}

/* ---- Truth JSON: built in memory and written with one write(2), so that nothing else
 * written to stderr can split the line. ---- */

struct nm_json {
  FILE *f;
  char *buf;
  size_t len;
};

static inline void nm_json_nodes_list(FILE *f, unsigned long mask) {
  fputc('[', f);
  int first = 1;
  for (int n = 0; n < NM_MAX_NODES; n++)
    if (mask & (1ul << n)) {
      fprintf(f, "%s%d", first ? "" : ",", n);
      first = 0;
    }
  fputc(']', f);
}

/* Opens the line with the keys every numa workload has. */
static inline void nm_json_begin(struct nm_json *j, const char *workload) {
  j->f = open_memstream(&j->buf, &j->len);
  if (!j->f) wl_die("open_memstream", errno);
  FILE *f = j->f;
  fprintf(f, "{\"workload\":\"%s\",\"nodes\":%d,\"node_ids\":", workload, nm_topo.nnodes);
  nm_json_nodes_list(f, nm_all_nodes_mask());
  fprintf(f, ",\"cpus\":%d,\"topology\":[", nm_topo.ncpus);
  for (int i = 0; i < nm_topo.nnodes; i++) {
    fprintf(f, "%s{\"node\":%d,\"cpus\":[", i ? "," : "", nm_topo.node_ids[i]);
    int first = 1;
    for (int j2 = 0; j2 < nm_topo.ncpus; j2++)
      if (nm_topo.node_of_cpu[nm_topo.cpus[j2]] == nm_topo.node_ids[i]) {
        fprintf(f, "%s%d", first ? "" : ",", nm_topo.cpus[j2]);
        first = 0;
      }
    fprintf(f, "]}");
  }
  fprintf(f,
          "],\"topology_from_sysfs\":%s,\"page_size\":%ld,\"thp_disabled\":%s,"
          "\"numa_balancing\":%d,\"numa_syscalls\":%s,\"policy_calls\":\"%s\",\"t0_ns\":%llu,"
          "\"tids\":[",
          nm_topo.from_sysfs ? "true" : "false", nm_topo.page_size,
          nm_topo.thp_disabled ? "true" : "false", nm_topo.numa_balancing,
          nm_topo.syscalls ? "true" : "false", nm_fn.mbind ? "symbol" : "syscall",
          (unsigned long long)nm_topo.t0_ns);
  for (int i = 0; i < nm_nthreads; i++) fprintf(f, "%s%u", i ? "," : "", nm_tids[i]);
  fprintf(f, "]");
}

static inline void nm_json_end(struct nm_json *j) {
  fprintf(j->f, "}\n");
  if (fclose(j->f) != 0) wl_die("fclose", errno);
  fflush(stderr);
  for (size_t off = 0; off < j->len;) {
    ssize_t w = write(2, j->buf + off, j->len - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  free(j->buf);
}

/* Per-node counts as an object keyed by node id: every node of the topology, plus any other
 * node that holds some. `null` when the placement could not be measured. */
static inline void nm_json_counts(FILE *f, const struct nm_place *p, int bytes) {
  if (!p->ok) {
    fprintf(f, "null");
    return;
  }
  const long *v = bytes ? p->bytes : p->pages;
  unsigned long show = nm_all_nodes_mask();
  for (int n = 0; n < NM_MAX_NODES; n++)
    if (v[n]) show |= 1ul << n;
  fputc('{', f);
  int first = 1;
  for (int n = 0; n < NM_MAX_NODES; n++)
    if (show & (1ul << n)) {
      fprintf(f, "%s\"%d\":%ld", first ? "" : ",", n, v[n]);
      first = 0;
    }
  fputc('}', f);
}

/* `"key":{pages per node},"key_absent":n` */
static inline void nm_json_place(FILE *f, const char *key, const struct nm_place *p) {
  fprintf(f, ",\"%s\":", key);
  nm_json_counts(f, p, 0);
  if (p->ok)
    fprintf(f, ",\"%s_absent\":%ld", key, p->absent);
  else
    fprintf(f, ",\"%s_absent\":null", key);
}

/* The binding calls of thread `thread`, in time order. */
static inline void nm_json_bindings(FILE *f, int thread) {
  fprintf(f, "[");
  int first = 1, n = __atomic_load_n(&nm_nlog, __ATOMIC_ACQUIRE);
  for (int k = 0; k < n; k++) {
    const struct nm_binding *b = &nm_log[k];
    if (b->thread != thread) continue;
    fprintf(f, "%s{\"order\":%d,\"call\":\"%s\",", first ? "" : ",", k, b->call);
    first = 0;
    if (b->cpu >= 0) {
      fprintf(f, "\"cpus\":[%d],\"node\":%d,", b->cpu, nm_node_of_cpu(b->cpu));
    } else {
      fprintf(f, "\"mode\":\"%s\",\"nodes\":", nm_mode_name(b->mode));
      nm_json_nodes_list(f, b->nodes);
      fprintf(f, ",");
      if (b->hi) fprintf(f, "\"range\":[%lu,%lu],", (unsigned long)b->lo, (unsigned long)b->hi);
    }
    fprintf(f, "\"t_ns\":%llu,\"t_s\":%.6f,\"rc\":%d}", (unsigned long long)b->t_ns,
            (double)(b->t_ns - nm_topo.t0_ns) / 1e9, b->rc);
  }
  fprintf(f, "]");
}

/* {"a":{"b":n,...},...}: element accesses from thread node a to memory node b, for every
 * node with CPUs and every node that appears in the matrix. */
static inline void nm_json_matrix(FILE *f, long m[NM_MAX_NODES][NM_MAX_NODES]) {
  unsigned long show = nm_all_nodes_mask();
  for (int a = 0; a < NM_MAX_NODES; a++)
    for (int b = 0; b < NM_MAX_NODES; b++)
      if (m[a][b]) show |= 1ul << a | 1ul << b;
  fputc('{', f);
  int first_a = 1;
  for (int a = 0; a < NM_MAX_NODES; a++) {
    if (!(show & (1ul << a))) continue;
    fprintf(f, "%s\"%d\":{", first_a ? "" : ",", a);
    first_a = 0;
    int first_b = 1;
    for (int b = 0; b < NM_MAX_NODES; b++) {
      if (!(show & (1ul << b))) continue;
      fprintf(f, "%s\"%d\":%ld", first_b ? "" : ",", b, m[a][b]);
      first_b = 0;
    }
    fputc('}', f);
  }
  fputc('}', f);
}

#endif
