/* Helpers shared by the comm workloads (comm_*.c): threads that take turns, hidden memory
 * accesses, fractions, and the truth JSON.
 *
 * The comm workloads are built so that the cache-line transfers between their threads are
 * known exactly: the threads take turns (thread k of a round runs only after thread k-1 has
 * finished its part), so the order of the accesses to the shared lines, and therefore every
 * transfer, follows from the construction and not from scheduling. The turn variable and
 * the bookkeeping (thread ids, configuration, result checks) are read and written with
 * inline asm, which no compiler instrumentation sees (`locus cc`): under the exact backend
 * the only communication is on the data lines. With other backends (soft, hw) the turn
 * variable's line does show up as true sharing between consecutive threads. */
#ifndef WORKLOADS_COMM_COMMON_H
#define WORKLOADS_COMM_COMMON_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>

#include "common.h"

#define CW_LINE 64
#define CW_MAX_THREADS 64

/* 8-byte load and store the instrumentation does not see. */
static inline long cw_load(const long *p) {
#if defined(__x86_64__)
  long v;
  __asm__ volatile("movq %1, %0" : "=r"(v) : "m"(*p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

static inline void cw_store(long *p, long v) {
#if defined(__x86_64__)
  __asm__ volatile("movq %1, %0" : "=m"(*p) : "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/* Keeps a loaded value alive without storing it anywhere. */
static inline void cw_use(long v) { __asm__ volatile("" : : "r"(v)); }

/* A turn counter on a line of its own. */
struct cw_turn {
  _Alignas(CW_LINE) long value;
  char pad[CW_LINE - sizeof(long)];
};

/* Waits until the turn counter equals `want`: spins a little, then yields (two busy cores
 * with more threads than cores must not burn whole time slices). */
static inline void cw_wait(struct cw_turn *t, long want) {
  unsigned spins = 0;
  while (cw_load(&t->value) != want) {
    if (++spins < 200) {
#if defined(__x86_64__)
      __asm__ volatile("pause");
#endif
    } else {
      sched_yield();
      spins = 0;
    }
  }
}

static inline void cw_pass(struct cw_turn *t, long next) { cw_store(&t->value, next); }

/* A fraction in [0, 1], as parts per million; exits with status 2 otherwise. */
static inline long cw_arg_fraction(const char *s, const char *usage) {
  char *end;
  errno = 0;
  double f = strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(f >= 0.0 && f <= 1.0)) {
    fprintf(stderr, "usage: %s\n", usage);
    exit(2);
  }
  return (long)(f * 1e6 + 0.5);
}

/* Round r is "selected" for a fraction ppm (parts per million) when floor((r+1) f) >
 * floor(r f): selected rounds are spread evenly and rounds [0, n) hold exactly
 * floor(n f) of them. */
static inline int cw_selected(long r, long ppm) {
  return (int)((uint64_t)(r + 1) * (uint64_t)ppm / 1000000u -
               (uint64_t)r * (uint64_t)ppm / 1000000u);
}

static inline long cw_selected_count(long n, long ppm) {
  return (long)((uint64_t)n * (uint64_t)ppm / 1000000u);
}

/* Rounds: a number given on the command line, or (default) as many as fit in about one
 * second: the leader of a group of threads that take turns (thread 0, or the first of a
 * pair) checks the clock in its turn and, once the deadline has passed, publishes the
 * round count before passing the turn, so that every thread of the group stops after the
 * same round and the truth stays exact. */
#define CW_DEFAULT_NS 1000000000ull
#define CW_MAX_ROUNDS 1000000000l
static long cw_deadline_ns; /* 0: fixed number of rounds (hidden accesses only) */

/* Parses the rounds argument (NULL or "-": timed) and returns the initial round limit. */
static inline long cw_arg_rounds(const char *s, const char *usage) {
  if (s && strcmp(s, "-") != 0) return wl_arg_long(s, usage);
  cw_store(&cw_deadline_ns, (long)(wl_now_ns() + CW_DEFAULT_NS));
  return CW_MAX_ROUNDS;
}

/* After round r's work, before passing the turn: 1 if r was the group's last round. */
static inline int cw_last_round(long *limit, long r, int leader) {
  if (leader) {
    long deadline = cw_load(&cw_deadline_ns);
    if (deadline && r + 1 < cw_load(limit) && (long)wl_now_ns() >= deadline) cw_store(limit, r + 1);
  }
  return r + 1 >= cw_load(limit);
}

/* Thread ids, stored by each thread with cw_store. */
static long cw_tids[CW_MAX_THREADS];

static inline void cw_record_tid(int i) { cw_store(&cw_tids[i], (long)wl_gettid()); }

static inline void cw_print_tids(int n) {
  fprintf(stderr, "\"tids\":[");
  for (int i = 0; i < n; i++) fprintf(stderr, "%s%ld", i ? "," : "", cw_load(&cw_tids[i]));
  fprintf(stderr, "]");
}

/* One expected (src -> dst) entry of the communication matrix. */
static inline void cw_print_pair(int first, int src, int dst, long true_n, long false_n) {
  fprintf(stderr,
          "%s{\"src\":%d,\"dst\":%d,\"src_tid\":%ld,\"dst_tid\":%ld,\"transfers\":%ld,"
          "\"true\":%ld,\"false\":%ld}",
          first ? "" : ",", src, dst, cw_load(&cw_tids[src]), cw_load(&cw_tids[dst]),
          true_n + false_n, true_n, false_n);
}

static inline void cw_start_threads(pthread_t *t, int n, void *(*fn)(void *)) {
  for (int i = 0; i < n; i++) WL_CHECK(pthread_create(&t[i], NULL, fn, (void *)(intptr_t)i));
}

static inline void cw_join_threads(pthread_t *t, int n) {
  for (int i = 0; i < n; i++) WL_CHECK(pthread_join(t[i], NULL));
}

/* Runs `n` threads of `fn` to their end; returns the wall seconds it took. */
static inline double cw_run_threads(int n, void *(*fn)(void *)) {
  pthread_t t[CW_MAX_THREADS];
  uint64_t t0 = wl_now_ns();
  cw_start_threads(t, n, fn);
  cw_join_threads(t, n);
  return (double)(wl_now_ns() - t0) / 1e9;
}

/* ---- Free-running mode (--free) ----
 * No turns: every thread hammers its data continuously for about one second (or a given
 * number of iterations), as ComDetective's listings do. The transfers then depend on the
 * scheduling, so the truth is the pattern (which threads communicate) and the configured
 * fractions; the exact backend measures the volumes. A fraction is applied per time slot of
 * CW_SLOT_NS (10 ms; CW_SLOT_US=N in the environment: N us) of the monotonic clock, the same slots
 * for all threads (slot s selected as round s would be), so the threads work on the same kind of
 * line at the same time and the fraction is one of the communication, not of the iterations'
 * coincidences. */
#define CW_SLOT_NS 10000000l
static long cw_free_t0;               /* start of the slots (ns) */
static long cw_slot_ns = CW_SLOT_NS;  /* CW_SLOT_US in the environment changes it */
static long cw_iters[CW_MAX_THREADS]; /* iterations done, by thread */

/* Removes "--free" from argv; returns 1 if it was present (then starts the slot clock). */
static inline int cw_take_free_flag(int *argc, char **argv) {
  int found = 0, out = 0;
  for (int i = 0; i < *argc; i++) {
    if (strcmp(argv[i], "--free") == 0) {
      found = 1;
      continue;
    }
    argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  const char *slot = getenv("CW_SLOT_US");
  if (slot && atol(slot) > 0) cw_store(&cw_slot_ns, atol(slot) * 1000);
  if (found) cw_store(&cw_free_t0, (long)wl_now_ns());
  return found;
}

/* Before iteration `it` of a free-running thread: 0 to stop (iteration limit or deadline),
 * else 1 with *sel = whether the current time slot is selected for the fraction ppm. The
 * clock is read every CW_CLOCK_EVERY iterations (and at the first), so that little of the
 * threads' time goes to it; *sel keeps its value in between. */
#define CW_CLOCK_EVERY 64
static inline int cw_free_next(long it, long limit, long ppm, int *sel) {
  if (it >= limit) return 0;
  if (it % CW_CLOCK_EVERY) return 1;
  uint64_t now = wl_now_ns();
  long deadline = cw_load(&cw_deadline_ns);
  if (deadline && (long)now >= deadline) return 0;
  long slot = (long)((now - (uint64_t)cw_load(&cw_free_t0)) / (uint64_t)cw_load(&cw_slot_ns));
  *sel = cw_selected(slot, ppm);
  return 1;
}

static inline void cw_print_iters(int n) {
  fprintf(stderr, "\"iterations\":[");
  for (int i = 0; i < n; i++) fprintf(stderr, "%s%ld", i ? "," : "", cw_load(&cw_iters[i]));
  fprintf(stderr, "]");
}

/* One communicating (src -> dst) entry of a free-running truth: no counts. */
static inline void cw_print_link(int first, int src, int dst) {
  fprintf(stderr, "%s{\"src\":%d,\"dst\":%d,\"src_tid\":%ld,\"dst_tid\":%ld}", first ? "" : ",",
          src, dst, cw_load(&cw_tids[src]), cw_load(&cw_tids[dst]));
}

/* Every ordered pair of distinct threads among [0, n). */
static inline void cw_print_all_links(int n) {
  int first = 1;
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++)
      if (s != d) {
        cw_print_link(first, s, d);
        first = 0;
      }
}

#endif
