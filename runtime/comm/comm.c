/* The comm lens: reads LOCUS_COMM_* and LOCUS_BIND, opens the comm record files, binds
 * threads to CPUs when asked, and forwards the life cycle to the selected backend. */
#define _GNU_SOURCE
#include "comm.h"
#include "shared.h"

#include "allocs.h"
#include "../numa/numa.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

_Static_assert(sizeof(struct locus_comm_sample) == 64, "rundir.py's COMM_SAMPLE_DTYPE");
_Static_assert(sizeof(struct locus_comm_event) == 128, "rundir.py's COMM_EVENT_DTYPE");

struct locus_comm_config locus_comm_cfg;
LOCUS_TLS struct locus_comm_tls locus_ct;

static struct locus_stream sample_stream, event_stream, thread_stream;
static struct locus_comm_backend_ops *ops;

/* A decimal number from the environment (the launcher validated it), parsed here: strtoull
 * would fault in libc's locale tables, resident memory the program may never use. */
static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || *v < '0' || *v > '9') return dflt;
  uint64_t n = 0;
  for (; *v >= '0' && *v <= '9'; v++) n = n * 10 + (uint64_t)(*v - '0');
  return n;
}

static void read_config(void) {
  struct locus_comm_config *c = &locus_comm_cfg;
  const char *b = getenv("LOCUS_COMM_BACKEND");
  c->backend = LOCUS_BK_SOFT;
  if (b && !strcmp(b, "hw")) c->backend = LOCUS_BK_HW;
  if (b && !strcmp(b, "exact")) c->backend = LOCUS_BK_EXACT;
  c->period_ns = env_u64("LOCUS_COMM_PERIOD_NS", 1000000);
  c->period_n = env_u64("LOCUS_COMM_PERIOD_N", 0);
  c->watchpoints = (int)env_u64("LOCUS_COMM_WATCHPOINTS", 4);
  if (c->watchpoints > 4) c->watchpoints = 4;
  c->bulletin = (uint32_t)env_u64("LOCUS_COMM_BULLETIN", 4096);
  c->line = (uint32_t)env_u64("LOCUS_LINE_SIZE", 64);
  c->detect = (int)env_u64("LOCUS_COMM_DETECT", 1) != 0;
  c->watch_loads = (int)env_u64("LOCUS_COMM_WATCH_LOADS", 0) != 0;
  c->keep = env_u64("LOCUS_COMM_KEEP", 65536);
  if (c->line == 0 || (c->line & (c->line - 1))) c->line = 64;
  const char *bind = getenv("LOCUS_BIND");
  strncpy(c->bind, bind ? bind : "none", sizeof c->bind - 1);
}

static int open_streams(void) {
  return locus_stream_open(&sample_stream, locus_proc_dirfd, "comm.samples.bin") ||
         locus_stream_open(&event_stream, locus_proc_dirfd, "comm.events.bin") ||
         locus_stream_open(&thread_stream, locus_proc_dirfd, "comm.threads.bin");
}

/* Long runs: the samples file grows by 64 bytes a sample (230 MB a busy thread-hour at the
 * default period), the events file by 128 bytes a detection. A thread's samples taken
 * (st.samples) are its clock: while under `keep` it writes every record; from then on, in the
 * k-th span of keep x 2^k samples (samples taken in [keep (2^k - 1), keep (2^(k+1) - 1))),
 * it writes one record in 2^k of each kind, chosen at random (a hash of the time stamp
 * counter), weighted by the 2^k it stands for (a sample's periods, an event's volume): about
 * `keep` samples a span, sums over them unbiased, and files that grow with the logarithm of
 * the run's length. No state of its own: the runtime's static TLS is in every thread of the
 * program. Returns 1 when this record is not written, else its 1-in-K in *thin. */
#define THIN_MAX 20
static int thinned_out(uint32_t *thin) {
  uint64_t keep = locus_comm_cfg.keep;
  *thin = 1;
  if (!keep) return 0;
  uint64_t q = locus_ct.st.samples / keep + 1;
  uint32_t shift = 63u - (uint32_t)__builtin_clzll(q);
  if (!shift) return 0;
  if (shift > THIN_MAX) shift = THIN_MAX;
  uint64_t z = locus_mix64(locus_ticks() ^ ((uint64_t)locus_me.tid << 40) ^ locus_ct.st.samples);
  *thin = 1u << shift;
  return (z & (*thin - 1)) != 0;
}

int locus_comm_put_sample(const struct locus_comm_sample *s) {
  if (locus_cursor_put(&sample_stream, &locus_ct.samples, s, sizeof *s) == 0) return 0;
  locus_ct.st.dropped++;
  return -1;
}

/* The exact backend's transfers are the ground truth: never thinned. A thinned event
 * carries its 1-in-K in reserved[5] (docs/format.md). */
int locus_comm_put_event(const struct locus_comm_event *e) {
  uint32_t thin = 1;
  if (!(e->flags & LOCUS_CE_EXACT) && thinned_out(&thin)) return 0;
  struct locus_comm_event w;
  if (thin > 1) {
    w = *e;
    w.volume *= thin;
    w.reserved[5] = thin;
    e = &w;
  }
  locus_named(e->t, e->line, locus_comm_cfg.line);
  if (locus_cursor_put(&event_stream, &locus_ct.events, e, sizeof *e) == 0) {
    locus_ct.st.detections++;
    return 0;
  }
  locus_ct.st.dropped++;
  return -1;
}

void locus_comm_take(const struct locus_comm_access *a) {
  uint32_t thin;
  int out = thinned_out(&thin); /* (by the samples taken before this one) */
  locus_ct.st.samples++;
  if (out) {
    if (locus_comm_cfg.detect) locus_comm_detect(a);
    return;
  }
  struct locus_comm_sample s;
  memset(&s, 0, sizeof s);
  s.t = a->t;
  s.addr = a->addr;
  s.ip = a->ip;
  s.caller = a->caller;
  s.tid = locus_me.tid;
  s.cpu = a->cpu;
  s.flags = a->flags;
  s.len = (uint16_t)a->len;
  uint64_t periods = (uint64_t)(a->weight > 1 ? a->weight : 1) * thin;
  s.periods = periods < UINT32_MAX ? (uint32_t)periods : UINT32_MAX;
  s.thin = thin;
  s.kind = 1;
  locus_named(a->t, a->addr, a->len);
  s.node = locus_numa.on ? locus_numa_sample_node(a->addr, a->flags) : -1;
  locus_comm_put_sample(&s);
  if (locus_comm_cfg.detect) locus_comm_detect(a);
}

/* Threads whose counters are live, by serial: proc_fini writes the records of the threads
 * still running at exit (an OpenMP pool, xz's workers), which never reach thread_fini.
 * Lazily mapped (MAP_NORESERVE: a page per 512 threads is touched). An entry is the thread's
 * locus_ct, NULL, or LIVE_BUSY while proc_fini copies it; the thread, ending, waits for that
 * copy before its TLS can go away. */
#define LIVE_MAX (1u << 20)
#define LIVE_BUSY ((struct locus_comm_tls *)1)
static struct locus_comm_tls *_Atomic *live;

static void live_open(void) {
  void *p = mmap(NULL, LIVE_MAX * sizeof *live, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  live = p == MAP_FAILED ? NULL : p;
}

static struct locus_comm_tls *_Atomic *live_entry(uint32_t serial) {
  return live && serial && serial <= LIVE_MAX ? &live[serial - 1] : NULL;
}

static void write_record(uint32_t serial, struct locus_comm_thread *st) {
  st->kind = 1;
  st->backend = (uint32_t)locus_comm_cfg.backend;
  /* The backend writes the period it really used (a floor may have raised it). */
  if (!st->period_ns) st->period_ns = locus_comm_cfg.period_ns;
  /* Slot `serial - 1` of the file: no lock (thousands of threads may end at once, and a
   * spinning writer preempted on 2 cores stalled them all), one pwrite per thread. */
  int fd = serial ? locus_stream_fd(&thread_stream) : -1;
  if (fd >= 0)
    (void)!syscall(SYS_pwrite64, fd, st, sizeof *st, (off_t)(serial - 1) * (off_t)sizeof *st);
}

/* The calling thread's own record, with its current name (async-signal-safe). */
static void write_own(void) {
  locus_ct.st.tid = locus_me.tid;
  (void)!syscall(SYS_prctl, PR_GET_NAME, locus_ct.st.name, 0, 0, 0);
  write_record(locus_me.serial, &locus_ct.st);
}

void locus_comm_write_thread(void) {
  if (!locus_ct.started) return;
  struct locus_comm_tls *_Atomic *e = live_entry(locus_me.serial);
  if (e) {
    struct locus_comm_tls *me = &locus_ct;
    while (!atomic_compare_exchange_strong(e, &me, NULL) && me == LIVE_BUSY) me = &locus_ct;
  }
  write_own();
  locus_ct.started = 0;
}

/* Reading the thread's CPU clock (clock_gettime(CLOCK_THREAD_CPUTIME_ID), a system call)
 * updates the scheduler's account of the running thread, and a thread whose time slice is
 * used up is then switched out on the way back from the call, not at the next tick. Read
 * twice in every handler, it ended the slices of CPU-bound threads sharing a CPU at the
 * samples: comm_p2p's 4 threads on 2 CPUs switched ~1,000 times a second instead of ~500
 * (plain, and under `perf record -e task-clock` at 1 ms alike), and 29-41 % of the handlers
 * were switched out in the middle (1-8 ms of wall time for 4-64 us of CPU time). Read on one
 * handler in 16 at random, weighted by 16, the cost stays an unbiased estimate, the threads
 * switched ~530-550 times a second, and 3 % of the handlers were switched out (by an
 * interrupt's preemption, as any code is). */
struct locus_handler_cost locus_comm_self_begin(int must, uint64_t now) {
  struct locus_handler_cost s = {0, 1};
  if (!must) {
    if (locus_mix64(now ^ ((uint64_t)locus_me.tid << 40)) % LOCUS_SELF_EVERY) return s;
    s.weight = LOCUS_SELF_EVERY;
  }
  s.cpu = locus_thread_cpu_ns();
  return s;
}

void locus_comm_self_end(struct locus_handler_cost begin) {
  if (!begin.cpu) return;
  uint64_t now = locus_thread_cpu_ns();
  if (now < begin.cpu) return;
  uint64_t d = (now - begin.cpu) * begin.weight;
  locus_ct.st.self_ns += d;
  locus_add_self_cpu_ns(d);
}

/* The record is rewritten every 256 signals and at least every CHECKPOINT_MS of wall time
 * while the thread takes samples: a process that ends by a raw exit_group (Go) runs no exit
 * code, and its threads' counters are the last ones written. Under load a Go thread took
 * fewer than 256 samples and the report said 0 samples beside 160 detections. */
#define CHECKPOINT_MS 20
void locus_comm_checkpoint(uint64_t now) {
  if (!locus_ct.started) return;
  if ((++locus_ct.ticks & 255u) != 0 &&
      now - locus_ct.written < (uint64_t)(CHECKPOINT_MS * 1000 * locus_ticks_per_us))
    return;
  locus_ct.written = now;
  write_own();
}

/* Another thread's name, at exit (normal context): /proc/self/task/TID/comm. */
static void name_of(uint32_t tid, char name[16]) {
  char path[48] = "/proc/self/task/";
  locus_fmt_u(path + strlen(path), tid);
  strcat(path, "/comm");
  char b[32];
  long n = locus_read_small(path, b, sizeof b);
  if (n <= 0) return;
  if (b[n - 1] == '\n') b[--n] = 0;
  memcpy(name, b, n < 16 ? (size_t)n + 1 : 16); /* the kernel's names are at most 15 */
}

/* At exit: the records of the other threads still running (their counters as they are). */
static void write_live_threads(void) {
  uint32_t n = locus_thread_count();
  for (uint32_t serial = 1; serial <= n; serial++) {
    struct locus_comm_tls *_Atomic *e = live_entry(serial);
    if (!e) break;
    struct locus_comm_tls *t = atomic_load(e);
    if (!t || t == LIVE_BUSY || t == &locus_ct || !atomic_compare_exchange_strong(e, &t, LIVE_BUSY))
      continue;
    struct locus_comm_thread st;
    memcpy(&st, &t->st, sizeof st);
    atomic_store(e, NULL);
    name_of(st.tid, st.name);
    write_record(serial, &st);
  }
}

/* "0-3,8,10-11" -> the k-th CPU of the list (wrapping), or -1. */
static int nth_of_list(const char *list, uint32_t k) {
  int cpus[1024], n = 0;
  const char *p = list;
  while (*p && n < 1024) {
    char *end;
    long a = strtol(p, &end, 10);
    if (end == p) return -1;
    long b = a;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    for (long i = a; i <= b && n < 1024; i++) cpus[n++] = (int)i;
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end) return -1;
  }
  return n ? cpus[k % (uint32_t)n] : -1;
}

int locus_comm_bind_cpu(uint32_t k, int ncpus) {
  const char *b = locus_comm_cfg.bind;
  if (ncpus <= 0 || !*b || !strcmp(b, "none")) return -1;
  if (!strcmp(b, "compact")) return (int)(k % (uint32_t)ncpus);
  if (!strcmp(b, "scatter")) {
    /* Spread over the two halves of the CPU range (sockets/nodes are usually numbered in
     * contiguous halves): 0, n/2, 1, n/2+1, ... */
    uint32_t half = (uint32_t)(ncpus + 1) / 2, j = k % (uint32_t)ncpus;
    return (int)((j % 2) ? half + j / 2 : j / 2) % ncpus;
  }
  return nth_of_list(b, k);
}

static void bind_self(void) {
  /* Not bound (the default): nothing to ask. sysconf(_SC_NPROCESSORS_CONF) reads sysfs
   * through stdio, ~50 KiB of libc the program may never touch, in its RSS. */
  if (!locus_comm_cfg.bind[0] || !strcmp(locus_comm_cfg.bind, "none")) return;
  int ncpus = (int)sysconf(_SC_NPROCESSORS_CONF);
  uint32_t k = locus_me.serial ? locus_me.serial - 1 : 0;
  int cpu = locus_comm_bind_cpu(k, ncpus);
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

static int proc_init(void) {
  read_config();
  switch (locus_comm_cfg.backend) {
    case LOCUS_BK_HW:
      ops = &locus_comm_hw;
      break;
    case LOCUS_BK_EXACT:
      ops = &locus_comm_exact;
      break;
    default:
      ops = &locus_comm_soft;
  }
  if (!ops) {
    locus_warn("comm: this build has no such backend; the comm lens is off");
    return -1;
  }
  if (open_streams() != 0) {
    locus_warn("comm: cannot create the record files; the comm lens is off");
    return -1;
  }
  live_open();
  if (ops->proc_init && ops->proc_init() != 0) return -1;
  return 0;
}

static void thread_init(void) {
  memset(&locus_ct, 0, sizeof locus_ct);
  locus_ct.started = 1;
  locus_ct.st.tid = locus_me.tid;
  struct locus_comm_tls *_Atomic *e = live_entry(locus_me.serial);
  if (e) atomic_store(e, &locus_ct);
  bind_self();
  locus_allocs_thread_init();
  if (ops && ops->thread_init) ops->thread_init();
}

static void thread_fini(void) {
  if (ops && ops->thread_fini) ops->thread_fini();
  locus_comm_write_thread();
  locus_cursor_finish(&sample_stream, &locus_ct.samples);
  locus_cursor_finish(&event_stream, &locus_ct.events);
}

static void proc_fini(void) {
  if (ops && ops->proc_fini) ops->proc_fini();
  locus_allocs_proc_fini();
  locus_comm_write_thread();
  write_live_threads();
  locus_cursor_finish(&sample_stream, &locus_ct.samples);
  locus_cursor_finish(&event_stream, &locus_ct.events);
}

static void sandbox(void) {
  if (ops && ops->sandbox) ops->sandbox();
  locus_shared_tracking = 0; /* the mmap interposers block signals around their table */
}

static void after_fork(void) {
  memset(&locus_ct.samples, 0, sizeof locus_ct.samples);
  memset(&locus_ct.events, 0, sizeof locus_ct.events);
  memset(&locus_ct.st, 0, sizeof locus_ct.st); /* the thinning's clock too */
  /* The other threads' entries name TLS copies of threads the child does not have. */
  if (live) munmap(live, LIVE_MAX * sizeof *live);
  live_open();
  struct locus_comm_tls *_Atomic *e = live_entry(locus_me.serial);
  if (e && locus_ct.started) atomic_store(e, &locus_ct);
  locus_stream_reset_after_fork(&sample_stream);
  locus_stream_reset_after_fork(&event_stream);
  locus_stream_reset_after_fork(&thread_stream);
  if (open_streams() != 0) return;
  if (ops && ops->after_fork) ops->after_fork();
}

struct locus_lens locus_lens_comm = {
    .name = "comm",
    .proc_init = proc_init,
    .thread_init = thread_init,
    .thread_fini = thread_fini,
    .proc_fini = proc_fini,
    .after_fork = after_fork,
    .sandbox = sandbox,
};
