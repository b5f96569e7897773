/* The numa lens (NUMAPROF without Pin): where each thread may run, where each page lives,
 * who touched a page first.
 *
 * - Topology: LOCUS_NUMA_CPUNODE ("0,0,1,1": the node of each CPU, written by the launcher
 *   from sysfs, or its emulation under --fake-numa, then LOCUS_NUMA_FAKE=1).
 * - Binding (numa.c): a struct locus_numa_pin at thread start and end, and after every
 *   successful sched_setaffinity, pthread_setaffinity_np, set_mempolicy, mbind and
 *   move_pages (interposers in intercept/numa.c).
 * - First touch (firsttouch.c): fresh anonymous memory (mmap'd malloc chunks, anonymous
 *   private mmaps) is kept PROT_NONE; the first access faults in the touching thread, which
 *   records itself, opens the page, places it and asks where it landed.
 * - Accesses: the comm lens's samplers (soft, hw) take the samples; with this lens on,
 *   locus_comm_take asks locus_numa_sample_node for the page's node of every sample. */
#ifndef LOCUS_NUMA_H
#define LOCUS_NUMA_H

#include <stddef.h>
#include <stdint.h>

#include "../core/runtime.h"

#define LOCUS_NUMA_MAX_CPUS 4096
#define LOCUS_NUMA_MAX_NODES 64

struct locus_numa_state {
  int on;       /* the lens is enabled */
  int emulated; /* LOCUS_NUMA_FAKE=1: node of a page = emulated node of its first toucher */
  int ncpus;    /* CPUs in the map */
  int nnodes;
  int16_t cpu_node[LOCUS_NUMA_MAX_CPUS];
};
extern struct locus_numa_state locus_numa;

/* Node of the page holding `addr` now (move_pages query, cached per thread for placed
 * pages): >= 0, -1 unknown or emulated, -2 not present, -3 a stack access (LOCUS_AC_STACK in
 * flags, not asked). Async-signal-safe. */
int locus_numa_sample_node(uint64_t addr, uint32_t flags);
/* The program unmapped, remapped or dropped pages: cached page nodes are asked again. */
void locus_numa_pages_changed(void);
/* move_pages' answer for the page holding addr: its node (>= 0) or -errno (-ENOENT: not
 * present, -EFAULT: the zero page or no mapping). Async-signal-safe. */
int locus_numa_page_status(uint64_t addr);

/* Node bitmask of the CPUs the calling thread may run on (sched_getaffinity). */
uint64_t locus_numa_self_nodes(uint32_t *ncpus);
int locus_numa_cpu_node(int cpu);

/* Pinning log (numa.c). `tid` is the thread the binding applies to. */
void locus_numa_pin(uint8_t what, uint32_t tid, uint64_t nodes, uint32_t ncpus, uint8_t mode,
                    uint64_t policy_nodes, uint64_t addr, uint64_t len, uint64_t ip);
/* Node mask and CPU count of a cpu_set_t of `size` bytes. */
uint64_t locus_numa_mask_nodes(const void *set, size_t size, uint32_t *ncpus);

/* ---- first touch (firsttouch.c) ---- */
/* Nonzero while some region is protected: the interposers' fast-path test. */
extern _Atomic int locus_ft_live;
int locus_ft_init(void);
/* The process ends: write the final placement of the regions still tracked. */
void locus_ft_proc_fini(void);
/* A fresh anonymous block [p, p + n) with protection `prot`, allocated at `site`:
 * keep its whole pages from `from` on inaccessible until first touched. */
void locus_ft_track(void *p, size_t n, void *from, int prot, uint64_t site);
/* The program is about to free, unmap, remap or reprotect [p, p + n) (n = 0: the region
 * starting at p): open what is still protected there and forget the region. */
void locus_ft_release(const void *p, size_t n);
/* The program gave madvise(advice) for [p, p + n) and it succeeded: MADV_HUGEPAGE and
 * MADV_NOHUGEPAGE make tracked memory there eligible (or not) for huge-page first touches;
 * MADV_DONTNEED and MADV_REMOVE drop its pages, so their next access is a first touch again. */
void locus_ft_madvise(void *p, size_t n, int advice);
/* A system call is about to write into (write = 1) or read from (write = 0) [p, p + n): open
 * its pages now, as the access would (a first touch: placed, or read-only on the zero page),
 * or the kernel would return EFAULT. */
void locus_ft_prepare(uintptr_t p, size_t n, uint64_t ip, int write);
/* The SIGSEGV handler is installed: a blocked SIGSEGV would kill a thread at its first
 * touch, so the signal-mask interposers never let the program block it. */
int locus_ft_installed(void);
/* The program locks memory: mlockall(MCL_CURRENT) populates every tracked page now, in
 * this thread (first touches); MCL_FUTURE stops tracking new memory (it is populated at
 * mapping). mlock of a range: locus_ft_prepare(range, write) first. */
void locus_ft_mlockall(int flags, uint64_t ip);
/* Is p the start of an mmap'd malloc chunk (glibc: IS_MMAPPED in the size word)? */
int locus_ft_chunk_mmapped(const void *p);

/* Append a touch record of the calling thread, allowed on `nodes` (first touch, or the
 * exact backend with LOCUS_NT_EXACT in flags); under emulation a placed page's node is the
 * emulated node of this thread's CPU. Async-signal-safe. */
void locus_ft_touch(uintptr_t page, uint64_t ip, uintptr_t region, uint32_t pages, int node,
                    uint64_t nodes, uint16_t flags);

/* ---- exact backend (exact.c) ---- */
extern LOCUS_EXPORT _Atomic int
    locus_numa_exact_on;                       /* the comm exact hooks call the access below */
extern _Atomic uint32_t locus_numa_page_epoch; /* bumped by mbind, move_pages: nodes asked again */
extern _Atomic uint32_t locus_numa_aff_epoch;  /* bumped by affinity changes */
LOCUS_EXPORT void locus_numa_exact_access(uintptr_t a, uint32_t len, uint32_t fl, uint64_t ip);
int locus_numa_exact_init(void);
void locus_numa_exact_thread_fini(void);
void locus_numa_exact_proc_fini(void);
void locus_numa_exact_after_fork(void);

#endif
