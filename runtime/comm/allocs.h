/* Allocation tracking for the comm lens: heap blocks, anonymous mappings and thread stacks
 * become struct locus_alloc records in allocs.bin, so the comm report can name the object
 * a shared cache line belongs to. The interposers (intercept/alloc.c) forward; the logic
 * that decides and writes is in comm/allocs.c. */
#ifndef LOCUS_COMM_ALLOCS_H
#define LOCUS_COMM_ALLOCS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One word the interposers test on every call. Their fast path is `state == RESOLVED`:
 * the real functions are known, nothing is tracked and no bootstrap block exists, so a
 * plain forward costs one load and one predictable branch. Any other value takes the
 * out-of-line slow path. */
#define LOCUS_ALLOC_RESOLVED 1 /* the real functions are resolved */
#define LOCUS_ALLOC_TRACKING 2 /* the comm lens records allocations */
#define LOCUS_ALLOC_BOOT 4     /* the bootstrap arena handed out blocks (frees check it) */
#define LOCUS_ALLOC_NUMA 8     /* the numa lens tracks first touches of fresh blocks */
/* 1: this thread's allocations come from the runtime's private arena (its own dlopen), not
 * the program's heap; 0: back. */
void locus_alloc_private(int on);
extern int locus_alloc_state;

/* Record one allocation event of the calling thread (kind: enum locus_alloc_kind).
 * Does nothing inside the runtime (guard), before the thread is registered, after it
 * finished, or when the runtime is off. Preserves errno. */
void locus_allocs_record(uint16_t kind, const void *addr, size_t size, uint64_t site);
/* In a MALLOC record's site: the block was made by C++ operator new (the site is its
 * caller's return address, whose bit 63 a user-space address never has): recorded as
 * LOCUS_ALF_NEW, LOCUS_HEAP_NEW. */
#define LOCUS_SITE_NEW (1ull << 63)
/* The same for an mmap: of file descriptor fd at file offset off (LOCUS_ALF_FILE), or with
 * fd -1 of anonymous memory; flags: LOCUS_ALF_SHARED (MAP_SHARED and writable), with
 * LOCUS_ALF_SYSV for a System V segment (shmat). */
void locus_allocs_record_mapping(const void *addr, size_t size, uint64_t site, int fd, uint64_t off,
                                 uint16_t flags);
/* An mremap of [old, old + old_n) to [p, p + n): the mapping keeps its object
 * (LOCUS_ALF_REMAP). */
void locus_allocs_record_remap(const void *old, size_t old_n, const void *p, size_t n,
                               uint64_t site);
/* A frame that may pass its locals' addresses to other threads (LOCUS_AL_FRAME): its stack
 * pointer at the call (cfa: the callee's canonical frame address), its frame pointer, the
 * call's return address; and the frames above it in the program's code (comm/unwind.c);
 * once per (thread, site, cfa). Call it through LOCUS_CALLER_FRAMES. */
void locus_allocs_frames(uint64_t cfa, uint64_t fp, uint64_t site);
/* The frame of a call that starts an OpenMP task: the caller's only, and at most a fixed
 * number a process (see allocs.c). */
void locus_allocs_task_frame(uint64_t cfa, uint64_t fp, uint64_t site);
/* In an interposer: its caller's frame (the interposer keeps a frame pointer for it, which
 * holds the caller's): its stack pointer at the call, frame pointer, return address. */
#define LOCUS_CALLER_ARGS                                          \
  (uint64_t)(uintptr_t) __builtin_dwarf_cfa(),                     \
      (uint64_t)(uintptr_t) * (void **)__builtin_frame_address(0), \
      (uint64_t)(uintptr_t)__builtin_return_address(0)
#define LOCUS_CALLER_FRAMES() locus_allocs_frames(LOCUS_CALLER_ARGS)
/* A heap block about to be freed, or moved by realloc (exact backend, comm/exact/exact.c: its
 * lines start a new generation; nothing while the exact model is off). */
void locus_comm_exact_freed(void *p, size_t n); /* n = 0: malloc_usable_size(p) */
int locus_comm_exact_gens(void); /* whether locus_comm_exact_freed does anything now */

/* Records that name an address another record may be matched with (a sample, a
 * communication event, a first touch) tell the allocation tracking, which drops the records
 * of heap blocks no record named (locus_allocs_record, comm/allocs.c). The writer calls one
 * of these in the thread that made the access and before it goes on (a signal handler), so
 * that thread's own later free sees it; another thread's free within the microseconds
 * between the access and the call may not (the access's object then reads as unattributed).
 * Async-signal-safe, lock-free.
 * locus_named: the record at ticks t names [addr, addr + len). */
void locus_named(uint64_t t, uint64_t addr, uint64_t len);
/* locus_named_all: the record at ticks t may name any address (a page's first touch, whose
 * block is looked up by the page's start, end or allocation). */
void locus_named_all(uint64_t t);

/* Called by the comm lens's thread_init on every registered thread: opens allocs.bin in
 * the process directory the first time (and again in a fork child), switches tracking on
 * and writes the thread's LOCUS_AL_STACK record. */
void locus_allocs_thread_init(void);
/* At process exit, in the exiting thread: its dropped blocks into the process's count. */
void locus_allocs_proc_fini(void);

#endif
