/* The comm lens core: configuration, the record streams and the per-thread counters that
 * every backend (hw, soft, exact) shares. A backend is a struct locus_comm_backend_ops in
 * its own file; comm.c picks the one LOCUS_COMM_BACKEND names and forwards the life cycle
 * to it. Backends write through locus_comm_put_sample/event only: those are the one owner
 * of comm.samples.bin and comm.events.bin. */
#ifndef LOCUS_COMM_H
#define LOCUS_COMM_H

#include <stdint.h>

#include "../core/runtime.h"

struct locus_comm_config {
  int backend;        /* enum locus_comm_backend */
  uint64_t period_ns; /* LOCUS_COMM_PERIOD_NS: sampling period (soft, hw time-based) */
  uint64_t period_n;  /* LOCUS_COMM_PERIOD_N: events per sample (hw count-based), 0 = time */
  int watchpoints;    /* LOCUS_COMM_WATCHPOINTS: debug registers per thread, 0-4 */
  uint32_t bulletin;  /* LOCUS_COMM_BULLETIN: bulletin-board entries (power of two) */
  uint32_t line;      /* LOCUS_LINE_SIZE: cache line size in bytes (64) */
  int detect;         /* LOCUS_COMM_DETECT=0: samples only (the numa lens without comm) */
  int watch_loads;    /* LOCUS_COMM_WATCH_LOADS=1: also arm write watchpoints on a line
                         another thread was sampled loading (detect.c; soft's default) */
  char bind[256];     /* LOCUS_BIND: compact | scatter | none | CPU list ("0-3,8") */
  uint64_t keep;      /* LOCUS_COMM_KEEP: samples a thread writes at each rate, in spans
                         that double (struct locus_comm_sample's thin); 0 = all written */
};
extern struct locus_comm_config locus_comm_cfg;

/* What a backend provides. Every hook may be NULL. thread_init/thread_fini run on the
 * thread concerned; proc_fini on the thread that ends the process, before the counters of
 * the threads still running are written. */
struct locus_comm_backend_ops {
  const char *name;
  int (*proc_init)(void); /* -1: this backend cannot run here (it said why) */
  void (*thread_init)(void);
  void (*thread_fini)(void);
  void (*proc_fini)(void);
  void (*after_fork)(void);
  void (*sandbox)(void); /* stop every thread's sampling (see locus_lens.sandbox); optional */
};
/* Defined by the backend files; weak so that a build without one still links. */
extern struct locus_comm_backend_ops locus_comm_soft __attribute__((weak));
extern struct locus_comm_backend_ops locus_comm_hw __attribute__((weak));
extern struct locus_comm_backend_ops locus_comm_exact __attribute__((weak));

/* Per-thread state of the lens: the counters written to comm.threads.bin and the cursors.
 * Samples and events are written by the thread that takes them, from its signal handler
 * (soft, hw, watchpoint traps) or from normal code (exact), never both at once: a backend
 * that writes from normal code blocks its sampling signal around the write. */
struct locus_comm_tls {
  struct locus_cursor samples, events;
  struct locus_comm_thread st;
  int started;      /* thread_init ran and the counters are live */
  uint32_t ticks;   /* sampler signals since the record was last written */
  uint64_t written; /* locus_ticks() at the last write */
};
extern LOCUS_TLS struct locus_comm_tls locus_ct;

/* One sampled access, as every sampling backend hands it to the detector. */
struct locus_comm_access {
  uint64_t t;      /* ticks */
  uint64_t addr;   /* effective address */
  uint64_t ip;     /* accessing instruction */
  uint32_t len;    /* bytes */
  uint32_t flags;  /* LOCUS_AC_* */
  int cpu;         /* -1 unknown */
  uint64_t caller; /* ip in a system library: the program's call into it (soft.c), 0 none */
  uint32_t
      weight; /* sampling periods the sample stands for (a POSIX timer's 1 + overruns); 0 = 1 */
};
/* ComDetective's Algorithm 1 (detect.c): the bulletin board and the watchpoints. Called
 * by a sampling backend from the signal handler of the thread that took the sample, after
 * it wrote the sample record. Async-signal-safe. */
void locus_comm_detect(const struct locus_comm_access *a);
/* Whether another thread's unexpired store is published on addr's line (detect.c): the soft
 * backend keeps a sample on the thread's own frame there, as the line moves. Async-signal-safe. */
int locus_comm_line_foreign(uint64_t addr);
/* Start/stop the calling thread's watchpoints (detect.c; thread_init/thread_fini of the
 * sampling backends call them). */
void locus_comm_detect_thread_init(void);
void locus_comm_detect_thread_fini(void);
/* park = 1: close the calling thread's watchpoints and open none until park = 0 (soft.c: a
 * thread that switches context often, for which each open breakpoint event costs at every
 * switch). Async-signal-safe. */
void locus_comm_detect_park(int park);
/* on = 1: the calling thread samples at the scheduler's tick (soft.c: it switches context
 * often), and its watches end after a few of its switches (detect.c, watch_expiry).
 * Async-signal-safe. */
void locus_comm_detect_on_tick(int on);

/* A sampling backend's usable access: write its sample record, count it, run the detector.
 * Async-signal-safe. */
void locus_comm_take(const struct locus_comm_access *a);

/* Append a record; 0, or -1 when dropped (counted in st.dropped). Async-signal-safe. */
int locus_comm_put_sample(const struct locus_comm_sample *s);
int locus_comm_put_event(const struct locus_comm_event *e);
/* Write the calling thread's counters now (thread end; exit for running threads). */
void locus_comm_write_thread(void);
/* Called by the backends at every sampler signal with its time (locus_ticks()): every
 * 256th signal, and at least every 20 ms, writes this thread's counters record as it is (a
 * pwrite), so that a process ending without exit handlers (a Go program's raw exit_group,
 * SIGKILL) still leaves them. */
void locus_comm_checkpoint(uint64_t now);
/* The handlers' own cost, in this thread's CPU time (ns): wall time would also count the
 * time a preempted handler waited for a CPU (300 threads on 2 CPUs made a 5 us handler
 * look like 30 ms). Measured on one handler in LOCUS_SELF_EVERY chosen at random, weighted
 * by it (drawn from `now`, the handler's locus_ticks()), or on this one when `must`
 * (weight 1): the thread's CPU clock is a system call that
 * brings the scheduler's accounting up to date, and read at every sample it ended the
 * thread's time slice at the sample instead of at the next tick (see comm.c).
 * locus_comm_self_end adds it to the counters and the runtime's cost. */
#define LOCUS_SELF_EVERY 16u
struct locus_handler_cost {
  uint64_t cpu;    /* the thread's CPU time at the handler's start (ns), 0 when not measured */
  uint32_t weight; /* the handlers it stands for */
};
struct locus_handler_cost locus_comm_self_begin(int must, uint64_t now);
void locus_comm_self_end(struct locus_handler_cost begin);
/* CPU to which the thread of 0-based creation index `k` is bound, or -1 (LOCUS_BIND). */
int locus_comm_bind_cpu(uint32_t k, int ncpus);

#endif
