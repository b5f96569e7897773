/* Core of the injected runtime: process and thread identity, the clock, chunked record
 * streams and the lens table. Lenses build on these; the core knows nothing about any lens
 * except through struct locus_lens. */
#ifndef LOCUS_RUNTIME_H
#define LOCUS_RUNTIME_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/locus_format.h"

#define LOCUS_TLS __thread __attribute__((tls_model("initial-exec")))
#define LOCUS_LIKELY(x) __builtin_expect(!!(x), 1)
#define LOCUS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LOCUS_HIDDEN __attribute__((visibility("hidden")))
#define LOCUS_EXPORT __attribute__((visibility("default")))

/* Open addressing in two tiers, for tables whose entries should share one page while they
 * are few (every page a table touches stays in the program's resident memory): the i-th
 * slot probed, `probes` slots of the first `near` (start near_h), then `probes` of the
 * other slots - near (start far_h). The join map and the soft backend's pc cache. */
static inline uint32_t locus_tiered_slot(uint32_t near_h, uint32_t far_h, uint32_t i, uint32_t near,
                                         uint32_t probes, uint32_t slots) {
  return i < probes ? (near_h + i) % near : near + (far_h + i - probes) % (slots - near);
}

/* ---- clock.c ---- */
extern int locus_clock_kind; /* enum locus_clock */
uint64_t locus_ticks(void);
/* splitmix64's finaliser: a well-mixed 64-bit hash (random choices from the time stamp
 * counter). */
static inline uint64_t locus_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t locus_mono_ns(void);
/* The clock; the TSC rate measured once per run and machine (RUN/tsc.BOOTID). */
void locus_clock_init(int run_dirfd);
/* Whether this thread may read the TSC (the program can forbid it: prctl PR_SET_TSC); called
 * at thread start and after the program's prctl. */
void locus_tsc_check(void);
extern LOCUS_TLS int locus_tsc_off; /* this thread must not read the TSC */
/* ticks per microsecond, calibrated at start (1000 for the monotonic clock). */
extern double locus_ticks_per_us;

/* ---- stream.c: one file of fixed-size records, claimed in page-aligned chunks ---- */
#define LOCUS_STREAM_SPARES 64
struct locus_stream {
  int fd;
  _Atomic uint64_t next; /* next free byte offset */
  _Atomic uint64_t size; /* bytes allocated in the file (the ftruncate fallback's) */
  atomic_flag grow_lock; /* the ftruncate fallback's (filesystems without fallocate) */
  const char *name;
  uint64_t dev, ino; /* the file's identity: checked when it is reopened */
  atomic_flag reopen_lock;
  /* The unused rest of the last page of ended threads' chunks, each (offset / 16) << 20 |
   * (bytes / 16), 0 = empty; never across a page boundary. A new thread's first records go
   * there: 20,000 short-lived threads took a page each of every record file they wrote
   * (80 MB a file) for a few records each. */
  _Atomic uint64_t spare[LOCUS_STREAM_SPARES];
  void *spare_map[LOCUS_STREAM_SPARES]; /* the range's page, mapped; NULL: map it */
};
/* The stream's descriptor, checked to be still open (a program may close every descriptor
 * with a raw close_range syscall): reopened by path if not. -1 when neither works.
 * Async-signal-safe. */
int locus_stream_fd(struct locus_stream *s);
/* 1 when fd is still the record file `name` of this process's directory, 0 when it names
 * another file (reused by the program), -1 unknown (closed, no /proc). Async-signal-safe. */
int locus_fd_is_record(int fd, const char *name);
int locus_stream_open(struct locus_stream *s, int dirfd, const char *name);
/* Map `bytes` (a multiple of the page size) of fresh file space; NULL when out of space. */
void *locus_stream_claim(struct locus_stream *s, size_t bytes);
/* The same, with the chunk's offset in the file in *at. */
void *locus_stream_claim_at(struct locus_stream *s, size_t bytes, uint64_t *at);
/* Blocks [from, to) of fd allocated (raw fallocate: not a cancellation point; ftruncate on
 * filesystems without it); -1 past RLIMIT_FSIZE or when the disk is full. */
int locus_file_reserve(int fd, uint64_t from, uint64_t to);
void locus_stream_release(void *chunk, size_t bytes);
/* A spare range of at least `min` bytes that starts on a record of `rec` bytes (see struct
 * locus_stream), its page mapped: *map is the page (release it with
 * locus_stream_release(*map, 4096)), *at its offset in the file, the range [*map + *pos,
 * *map + *pos + *len). 0 when one was taken, -1 when none fits. */
int locus_stream_take_spare(struct locus_stream *s, size_t min, size_t rec, char **map,
                            uint64_t *at, size_t *pos, size_t *len);
/* Offer [off, off + len) of the stream's file (inside one page, unused, reserved) to the
 * next thread, with `page` the mapping of its page (NULL: none; when the range is kept the
 * stream owns the mapping: the caller must not unmap it); 0 when it was kept, -1 when
 * every spare slot is taken. */
int locus_stream_put_spare(struct locus_stream *s, uint64_t off, size_t len, void *page);
/* [off, off + len) of the stream's file given back to the filesystem: it reads as zeros,
 * unused records (page-aligned; a filesystem without hole punching keeps it allocated). */
void locus_stream_punch(struct locus_stream *s, uint64_t off, size_t len);
void locus_stream_reset_after_fork(struct locus_stream *s);
/* Drops the streams' spare pages from the resident memory (they stay mapped). */
void locus_streams_shed(void);
void locus_stream_close(struct locus_stream *s);

/* A per-thread cursor appending records of `rec` bytes to a stream. Chunks grow from
 * `first` to `max` bytes so short-lived threads cost one page and busy ones few claims. */
struct locus_cursor {
  char *base, *pos, *end;
  size_t chunk;
  uint64_t t;   /* ticks at the last claim: a chunk filled fast makes the next one larger */
  uint64_t off; /* the chunk's offset in the stream's file */
};
/* Append one record; returns 0, or -1 when it was dropped. Async-signal-safe. */
int locus_cursor_put(struct locus_stream *s, struct locus_cursor *c, const void *rec,
                     size_t rec_size);
void locus_cursor_close(struct locus_cursor *c);
/* At a thread's end (never in a fork child, whose chunk is the parent's): close, and give
 * the chunk's unused whole pages back to the filesystem (a hole reads as unused records). */
void locus_cursor_finish(struct locus_stream *s, struct locus_cursor *c);

/* ---- proc.c ---- */
struct locus_config {
  int active;             /* LOCUS_DIR was given and the run directory opened */
  int call_stack;         /* LOCUS_CALL_STACK=1 */
  int time_all;           /* LOCUS_TIME_ALL=1: time every event, no sampling */
  double min_interval_us; /* LOCUS_MIN_INTERVAL_US: sampling target between timed events */
  char lenses[128];
};
extern struct locus_config locus_cfg;
extern volatile int locus_enabled; /* 0 before init and after finalisation */
/* The process installed a seccomp filter: the runtime makes no system call any more (the
 * filter may refuse it, or kill the process for it); see locus_before_sandbox. */
extern volatile int locus_sandboxed;
/* A filter is about to go on (set first): signal handlers, thread starts and ends do nothing. */
extern _Atomic int locus_quiet;
/* Runtime work that makes system calls outside the program's own calls (signal handlers,
 * thread starts and ends), in flight in any thread: locus_before_sandbox waits for none to
 * be left before the filter goes on (SECCOMP_FILTER_FLAG_TSYNC applies it to every thread at
 * once, to a sample preempted halfway in another thread too). Enter, then check: 0 (and not
 * counted) once quiet. */
extern _Atomic int locus_busy;
static inline int locus_busy_enter(void) {
  __atomic_fetch_add(&locus_busy, 1, __ATOMIC_SEQ_CST);
  if (LOCUS_LIKELY(!__atomic_load_n(&locus_quiet, __ATOMIC_SEQ_CST))) return 1;
  __atomic_fetch_sub(&locus_busy, 1, __ATOMIC_SEQ_CST);
  return 0;
}
static inline void locus_busy_leave(void) { __atomic_fetch_sub(&locus_busy, 1, __ATOMIC_SEQ_CST); }
/* Called by the seccomp interposers (prctl, syscall) before the filter goes on: every
 * thread's sampling stops and the process's records are finished, while system calls still
 * work. */
void locus_before_sandbox(void);
/* seccomp(op, flags, fprog) is about to be called (op SECCOMP_SET_MODE_*): the runtime
 * stops there (locus_before_sandbox) unless the filter allows what it needs (seccomp.c). */
void locus_seccomp_before(long op, const void *fprog);
extern struct locus_proc *locus_proc_hdr;
extern int locus_proc_dirfd;
int locus_run_dirfd(void);         /* the run directory (LOCUS_DIR), -1 if none */
extern char locus_proc_path[4096]; /* absolute path of this process's directory, "" if unknown */
void locus_warn(const char *msg);
/* v in decimal at out (NUL-terminated; at most 10 digits): no stdio in the runtime. */
void locus_fmt_u(char *out, unsigned v);
/* The hex number at [p, end) (lower case, no prefix) into *v; returns past its digits. */
const char *locus_hex(const char *p, const char *end, uint64_t *v);
/* v in lower-case hex at p, at least min_digits (zero-padded; no NUL); returns past it. */
char *locus_put_hex(char *p, uint64_t v, int min_digits);
/* A small /proc or /sys file into b (NUL-terminated), with raw system calls (no stdio, no
 * malloc, usable in a signal handler); its length, or -1. */
long locus_read_small(const char *path, char *b, size_t n);

/* ---- fds.c: the runtime's descriptors, kept away from the program's close() ---- */
void locus_fds_init(void);
extern int locus_warn_fd; /* stderr as the program has it: -1 once it closed it */
/* The program closed its stderr or replaced it (dup2/dup3 onto 2): the copy follows. */
void locus_follow_stderr(void);
/* Move fd above the program's range and protect it; returns the descriptor to use. */
int locus_fd_keep(int fd);
/* The same for a descriptor the runtime can do without (a thread's perf events): when the
 * runtime's range (the top quarter of RLIMIT_NOFILE) is full, fd is closed and -1 returned
 * with errno EMFILE, rather than kept among the program's numbers (200 threads' sampler and
 * watchpoints took 441 of a 1024 limit, and the program's open() failed). */
int locus_fd_keep_high(int fd);
int locus_fd_owned(int fd);
void locus_fd_close(int fd);
/* Every perf event among the runtime's descriptors disabled (samplers, watchpoints, of all
 * threads): no signal of ours after it. */
void locus_fds_disable_perf(void);
/* Stop protecting fd without closing it (it is no longer ours). */
void locus_fd_forget(int fd);
int locus_fd_next_owned(unsigned from, unsigned to);

/* set, or in *copy set without the signals locus needs unblocked (runtime/comm/soft/trap.c). */
const sigset_t *locus_keep_unblocked(int how, const sigset_t *set, sigset_t *copy);
/* One more signal kept unblocked the same way (the hw backend's sample signal). */
void locus_keep_signal(int sig);
/* The runtime's finishing handler of a fatal signal, seen by the program as SIG_DFL
 * (core/proc.c): -2 when the call is not about it, else the result of `real`. */
int locus_fatal_sigaction(int sig, const struct sigaction *act, struct sigaction *old,
                          int (*real)(int, const struct sigaction *, struct sigaction *));
/* *old and whether `held` becomes *act, for an action held for the program (core/proc.c). */
int locus_fatal_held(const struct sigaction *held, const struct sigaction *act,
                     struct sigaction *old);
/* Lazily initialise if an interposer runs before the constructor. */
void locus_ensure_init(void);
void locus_proc_finish(int status, uint32_t flags);
/* exit() entered: 1 for the first call; a later one (another thread) waits, bounded, for the
 * records to be finished (core/proc.c). */
int locus_exit_entered(void);
void locus_wait_finished(void);
/* The runtime's own mappings, past the program's mmap/munmap interposers (raw system
 * calls): a record chunk released inside the first-touch SIGSEGV handler was recorded as a
 * program munmap, with --call-stack unwound there, and libunwind faulted (SIGSEGV). */
void *locus_sys_mmap(void *addr, size_t n, int prot, int flags, int fd, long off);
int locus_sys_munmap(void *addr, size_t n);
/* Appends /proc/self/maps to the process's maps.dl (before dlclose unmaps a library). */
void locus_maps_before_unload(void);

/* The program's call into the system library ip is in, found by the soft backend's stack
 * scan in the signal handler whose context is uc (comm/soft/soft.c; docs/lenses/comm.md,
 * "Callers of library code"); 0 when ip is the program's, none is found, or the soft
 * backend is not running. Async-signal-safe. */
uint64_t locus_soft_caller(uint64_t ip, const void *uc);
/* The program unloaded a library (dlclose returned): the soft backend's list of loaded
 * objects is taken again, so that the gone one is dead at once (its code's pages may be
 * another library's next). Normal context; nothing when the soft backend is not running. */
void locus_soft_objects_changed(void);

void locus_before_exec(void);
void locus_after_failed_exec(void);
void locus_add_self_ticks(uint64_t ticks);
/* The calling thread's CPU time (ns): the runtime's own cost is CPU time, not wall time (a
 * preempted handler or a claim waiting for a CPU would count the wait). 0 if unknown. */
uint64_t locus_thread_cpu_ns(void);
void locus_add_self_cpu_ns(uint64_t ns);

/* ---- thread.c ---- */
struct locus_self {
  uint32_t tid;
  uint32_t serial;
  int guard; /* re-entrancy: inside the runtime */
  int state; /* 0 = unknown, 1 = registered, 2 = finished */
  struct locus_thread *slot;
  uint64_t records, dropped, self_ticks;
  /* The thread's stack as its creator knew it (intercept/process.c), 0 when unknown:
   * locus_thread_stack takes it instead of pthread_getattr_np, whose malloc gave every
   * new thread a malloc arena (64 MiB of address space). */
  uintptr_t stack_lo, stack_hi;
};
extern LOCUS_TLS struct locus_self locus_me;

/* The alternate signal stack the runtime gave this thread (sp NULL: none), and the one the
 * program believes it has while ours stays installed: a program's own smaller stack is kept
 * virtual (intercept/numa.c, sigaltstack), since the runtime's handlers need more than the
 * 2-4 KiB some programs give theirs. prog_flags SS_DISABLE: the program set none. */
struct locus_altstack {
  void *sp;
  size_t size;
  void *prog_sp;
  size_t prog_size;
  int prog_flags;
};
extern LOCUS_TLS struct locus_altstack locus_alt;
/* Registered identity of the calling thread, registering it on first use. NULL while the
 * runtime is off or the thread is finished. */
struct locus_self *locus_self_get(void);
void locus_threads_open(void);
struct locus_thread *locus_thread_reserve(void);
void locus_thread_start(uint32_t parent_tid, uint64_t start_routine, struct locus_thread *reserved);
void locus_thread_finish(void);
void locus_threads_after_fork(void);
uint32_t locus_thread_count(void);
/* The calling thread's stack [lo, hi); 0 on success. */
int locus_thread_stack(uintptr_t *lo, uintptr_t *hi);
/* Whether a loaded object is the system's (under /lib, /usr/lib; the vdso; liblocus.so
 * itself) rather than the program's or a library of its own (core/objects.c). */
struct dl_phdr_info;
int locus_system_object(const struct dl_phdr_info *info);
void locus_join_map_put(unsigned long pthread, uint32_t tid);
uint32_t locus_join_map_take(unsigned long pthread);
/* The tid of a live pthread_t (0 if unknown), without removing it. */
uint32_t locus_join_map_peek(unsigned long pthread);

/* ---- stack.c ---- */
/* Capture the caller's stack into stacks.bin; returns its id or 0. */
uint32_t locus_stack_capture(uint64_t site);
void locus_stack_open(void);
void locus_stack_after_fork(void);
void locus_stack_thread_fini(void);

/* ---- lens table (lenses.c) ---- */
struct locus_lens {
  const char *name;
  int (*proc_init)(void);    /* open files; return -1 to disable the lens */
  void (*thread_init)(void); /* the calling thread was just registered (created or adopted) */
  void (*thread_fini)(void); /* the calling thread ends */
  void (*proc_fini)(void);   /* the calling thread ends the process */
  void (*after_fork)(void);  /* in the child, with the forking thread only */
  /* Before a seccomp filter: stop what would make a system call later, in every thread
   * (timers, page protections); then proc_fini runs. Optional. */
  void (*sandbox)(void);
  int enabled;
};
extern struct locus_lens *locus_lenses[];
void locus_lenses_init(void);
void locus_lenses_thread_init(void);
void locus_lenses_thread_fini(void);
void locus_lenses_proc_fini(void);
void locus_lenses_after_fork(void);
void locus_lenses_sandbox(void);

#endif
