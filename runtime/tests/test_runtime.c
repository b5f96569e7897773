/* Unit tests of the runtime: each case runs this program again under LD_PRELOAD with a
 * fresh LOCUS_DIR, then checks the records it left against what the case did.
 * Usage: test_runtime LIBLOCUS */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/locus_format.h"
#include "harness.h"

/* ---- the workloads, run in the preloaded child ---- */
static pthread_mutex_t m_a = PTHREAD_MUTEX_INITIALIZER, m_b = PTHREAD_MUTEX_INITIALIZER;

static pthread_mutex_t m_rec, m_err, m_rob;

static void *take_and_leave(void *arg) {
  pthread_mutex_t *m = arg;
  pthread_mutex_lock(m);
  pthread_mutex_unlock(m);
  return NULL;
}

/* Each mutex type: recursive relocks and an error are not contention; a lock held by
 * another thread is, whether glibc marks it with 2 (normal) or FUTEX_WAITERS (robust). */
static int case_types(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&m_rec, &a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_init(&m_err, &a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_NORMAL);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&m_rob, &a);
  for (int i = 0; i < 3; i++) pthread_mutex_lock(&m_rec);
  for (int i = 0; i < 3; i++) pthread_mutex_unlock(&m_rec);
  pthread_mutex_lock(&m_err);
  if (pthread_mutex_lock(&m_err) != EDEADLK) return 1;
  pthread_mutex_unlock(&m_err);
  pthread_mutex_t *held[2] = {&m_a, &m_rob};
  for (int i = 0; i < 2; i++) {
    struct timespec ms = {0, 30000000};
    pthread_t t;
    pthread_mutex_lock(held[i]);
    pthread_create(&t, NULL, take_and_leave, held[i]);
    nanosleep(&ms, NULL);
    pthread_mutex_unlock(held[i]);
    pthread_join(t, NULL);
  }
  return 0;
}

static void *hammer(void *arg) {
  long n = (long)arg;
  for (long i = 0; i < n; i++) {
    pthread_mutex_lock(&m_a);
    pthread_mutex_unlock(&m_a);
  }
  return NULL;
}

static int case_counts(void) {
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, hammer, (void *)300000L);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  return 0;
}

static int case_many(void) {
  enum { N = 3000 };
  pthread_mutex_t *ms = calloc(N, sizeof *ms);
  for (int i = 0; i < N; i++) pthread_mutex_init(&ms[i], NULL);
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < N; i++) {
      pthread_mutex_lock(&ms[i]);
      pthread_mutex_unlock(&ms[i]);
    }
  return 0;
}

static int case_nested(void) {
  struct timespec ms = {0, 2000000};
  pthread_mutex_lock(&m_a);
  nanosleep(&ms, NULL);
  pthread_mutex_lock(&m_b);
  nanosleep(&ms, NULL);
  pthread_mutex_unlock(&m_b);
  nanosleep(&ms, NULL);
  pthread_mutex_unlock(&m_a);
  return 0;
}

/* More joinable threads alive at once than the join map's first tier holds (JOIN_NEAR in
 * core/thread.c): the rest go to the whole table, and every join still names its thread. */
enum { JOINS = 300 };
static pthread_barrier_t joins_barrier;

static void *wait_all(void *arg) {
  (void)arg;
  pthread_barrier_wait(&joins_barrier);
  return NULL;
}

static int case_joins(void) {
  pthread_t t[JOINS];
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setstacksize(&a, 64 << 10);
  pthread_barrier_init(&joins_barrier, NULL, JOINS + 1);
  for (int i = 0; i < JOINS; i++)
    if (pthread_create(&t[i], &a, wait_all, NULL) != 0) return 1;
  pthread_barrier_wait(&joins_barrier);
  for (int i = 0; i < JOINS; i++) pthread_join(t[i], NULL);
  return 0;
}

static int case_killed(void) {
  for (int i = 0; i < 1000; i++) {
    pthread_mutex_lock(&m_a);
    pthread_mutex_unlock(&m_a);
  }
  raise(SIGKILL);
  return 0;
}

static int case_unreleased(void) {
  pthread_mutex_lock(&m_b);
  exit(3);
}

/* ---- checks, in the driver ---- */
struct totals {
  uint64_t acq, contended, failed, timed, events, weight, unreleased, tables;
  uint64_t max_gen_entries;
};

static struct totals read_totals(const char *pd, uint64_t lock) {
  struct totals t = {0};
  size_t len = 0;
  char *c = slurp(pd, "locks.counts.bin", &len);
  /* Keep only the newest table of each thread: first find the highest generation. */
  uint32_t best_gen[4096] = {0};
  for (size_t off = 0; c && off + 64 <= len; off += 64) {
    struct locus_lock_count *r = (void *)(c + off);
    if (r->kind == LOCUS_LC_HEADER && r->serial < 4096 && r->site > best_gen[r->serial])
      best_gen[r->serial] = (uint32_t)r->site;
  }
  for (size_t off = 0; c && off + 64 <= len; off += 64) {
    struct locus_lock_count *r = (void *)(c + off);
    if (r->kind != LOCUS_LC_HEADER) continue;
    if (r->site != best_gen[r->serial]) continue;
    t.tables++;
    for (uint64_t i = 1; i < r->lock; i++) {
      struct locus_lock_count *e = r + i;
      if (!e->kind || (lock && e->lock != lock)) continue;
      t.acq += e->acquisitions;
      t.contended += e->contended;
      t.failed += e->failed;
      t.timed += e->timed;
      t.max_gen_entries++;
    }
  }
  free(c);
  char *ev = slurp(pd, "locks.events.bin", &len);
  for (size_t off = 0; ev && off + 64 <= len; off += 64) {
    struct locus_lock_event *e = (void *)(ev + off);
    if (!e->kind || (lock && e->lock != lock)) continue;
    t.events++;
    t.weight += e->weight;
    if (e->flags & LOCUS_EV_UNRELEASED) t.unreleased++;
  }
  free(ev);
  return t;
}

static struct locus_proc read_proc(const char *pd) {
  struct locus_proc p;
  memset(&p, 0, sizeof p);
  size_t len = 0;
  char *b = slurp(pd, "proc.bin", &len);
  if (b && len >= sizeof p) memcpy(&p, b, sizeof p);
  free(b);
  return p;
}

static int run_case(const char *self, const char *lib, const char *name, const char *run,
                    int time_all, int *status) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("LD_PRELOAD", lib, 1);
    setenv("LOCUS_DIR", run, 1);
    setenv("LOCUS_TIME_ALL", time_all ? "1" : "0", 1);
    execl(self, self, name, (char *)NULL);
    _exit(127);
  }
  return waitpid(pid, status, 0) == pid ? 0 : -1;
}

/* Addresses differ between the driver and the (randomised) child: the child says them. */
static void write_addrs(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/addrs", getenv("LOCUS_DIR"));
  FILE *f = fopen(path, "w");
  fprintf(f, "%lx %lx %lx %lx %lx\n", (unsigned long)&m_a, (unsigned long)&m_b,
          (unsigned long)&m_rec, (unsigned long)&m_err, (unsigned long)&m_rob);
  fclose(f);
}

static uint64_t addr_a, addr_b, addr_rec, addr_err, addr_rob;
static void read_addrs(const char *run) {
  char path[4300];
  snprintf(path, sizeof path, "%s/addrs", run);
  FILE *f = fopen(path, "r");
  unsigned long a[5] = {0};
  if (f && fscanf(f, "%lx %lx %lx %lx %lx", &a[0], &a[1], &a[2], &a[3], &a[4]) != 5)
    memset(a, 0, sizeof a);
  if (f) fclose(f);
  addr_a = a[0];
  addr_b = a[1];
  addr_rec = a[2];
  addr_err = a[3];
  addr_rob = a[4];
}

int main(int argc, char **argv) {
  if (argc == 2 && getenv("LOCUS_DIR")) write_addrs();
  if (argc == 2 && !strcmp(argv[1], "counts")) return case_counts();
  if (argc == 2 && !strcmp(argv[1], "many")) return case_many();
  if (argc == 2 && !strcmp(argv[1], "types")) return case_types();
  if (argc == 2 && !strcmp(argv[1], "nested")) return case_nested();
  if (argc == 2 && !strcmp(argv[1], "killed")) return case_killed();
  if (argc == 2 && !strcmp(argv[1], "joins")) return case_joins();
  if (argc == 2 && !strcmp(argv[1], "unreleased")) return case_unreleased();
  if (argc != 2) {
    fprintf(stderr, "usage: %s LIBLOCUS\n", argv[0]);
    return 2;
  }
  const char *lib = argv[1];
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n > 0 ? n : 0] = 0;
  char tmpl[] = "/tmp/locus-rt-XXXXXX";
  char *base = mkdtemp(tmpl);
  char run[4200], pd[4400];
  int st, ok;

  /* Exact counts with sampling on; weights of the timed events stand for the rest. */
  snprintf(run, sizeof run, "%s/counts", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "counts", run, 0, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals t = read_totals(pd, addr_a);
    CHECK(t.acq == 600000, "acquisitions %lu != 600000", (unsigned long)t.acq);
    CHECK(t.events > 0 && t.events < t.acq / 4, "sampling should time few events: %lu",
          (unsigned long)t.events);
    CHECK(t.weight > 400000 && t.weight <= 600000, "weights %lu do not stand for the calls",
          (unsigned long)t.weight);
    struct locus_proc p = read_proc(pd);
    CHECK(p.magic == LOCUS_PROC_MAGIC && (p.flags & LOCUS_PROC_EXITED), "proc header");
  } else
    ok = 0;
  finish("exact counts and sampling weights, 2 threads x 300000", ok);

  /* Every event timed with LOCUS_TIME_ALL=1. */
  snprintf(run, sizeof run, "%s/all", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "counts", run, 1, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals t = read_totals(pd, addr_a);
    CHECK(t.acq == 600000 && t.events == 600000 && t.weight == 600000,
          "time-all: acq %lu events %lu weight %lu", (unsigned long)t.acq, (unsigned long)t.events,
          (unsigned long)t.weight);
  } else
    ok = 0;
  finish("LOCUS_TIME_ALL times every critical section", ok);

  /* Contention read from the lock word, per mutex type. */
  snprintf(run, sizeof run, "%s/types", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "types", run, 0, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals rec = read_totals(pd, addr_rec), err = read_totals(pd, addr_err);
    struct totals nor = read_totals(pd, addr_a), rob = read_totals(pd, addr_rob);
    CHECK(rec.acq == 3 && rec.contended == 0, "recursive: acq %lu contended %lu",
          (unsigned long)rec.acq, (unsigned long)rec.contended);
    CHECK(err.acq == 1 && err.failed == 1 && err.contended == 0,
          "errorcheck: acq %lu failed %lu contended %lu", (unsigned long)err.acq,
          (unsigned long)err.failed, (unsigned long)err.contended);
    CHECK(nor.acq == 2 && nor.contended == 1, "normal: acq %lu contended %lu",
          (unsigned long)nor.acq, (unsigned long)nor.contended);
    CHECK(rob.acq == 2 && rob.contended == 1, "robust: acq %lu contended %lu",
          (unsigned long)rob.acq, (unsigned long)rob.contended);
  } else
    ok = 0;
  finish("contention per mutex type: recursive, errorcheck, normal, robust", ok);

  /* Count tables grow: 3000 locks (several generations), none lost. */
  snprintf(run, sizeof run, "%s/many", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "many", run, 0, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals t = read_totals(pd, 0);
    CHECK(t.acq == 9000 && t.max_gen_entries == 3000, "many: acq %lu entries %lu",
          (unsigned long)t.acq, (unsigned long)t.max_gen_entries);
    size_t len = 0;
    char *o = slurp(pd, "locks.objects.bin", &len);
    size_t inits = 0;
    for (size_t off = 0; o && off + 64 <= len; off += 64)
      inits += ((struct locus_lock_object *)(o + off))->kind != 0;
    free(o);
    CHECK(inits == 3000, "init records %zu != 3000", inits);
  } else
    ok = 0;
  finish("count tables grow to 3000 locks, init sites recorded", ok);

  /* Nested sections: inner within outer, in time. */
  snprintf(run, sizeof run, "%s/nested", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "nested", run, 1, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    size_t len = 0;
    char *ev = slurp(pd, "locks.events.bin", &len);
    struct locus_lock_event *a = NULL, *b = NULL;
    for (size_t off = 0; ev && off + 64 <= len; off += 64) {
      struct locus_lock_event *e = (void *)(ev + off);
      if (e->lock == addr_a) a = e;
      if (e->lock == addr_b) b = e;
    }
    CHECK(a && b, "both sections recorded");
    if (a && b) {
      CHECK(a->t_acq < b->t_acq && b->t_rel < a->t_rel, "inner section not inside outer");
      struct locus_proc p = read_proc(pd);
      double tpn = (double)(p.tsc1 - p.tsc0) / (double)(p.ns1 - p.ns0);
      double hold_a_ms = (double)(a->t_rel - a->t_acq) / tpn / 1e6;
      CHECK(hold_a_ms > 5.5 && hold_a_ms < 9, "outer hold %.2f ms, expected ~6", hold_a_ms);
    }
    free(ev);
  } else
    ok = 0;
  finish("nested sections keep their order and durations", ok);

  /* Joins name the joined thread, also past the join map's first tier. */
  snprintf(run, sizeof run, "%s/joins", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "joins", run, 1, &st) == 0 && WIFEXITED(st) && !WEXITSTATUS(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    size_t len = 0;
    char *ev = slurp(pd, "locks.events.bin", &len);
    static uint8_t seen[1 << 16];
    int joins = 0, named = 0, twice = 0;
    for (size_t off = 0; ev && off + 64 <= len; off += 64) {
      struct locus_lock_event *e = (void *)(ev + off);
      if (e->kind != LOCUS_LK_JOIN) continue;
      joins++;
      if (e->obj && e->obj != e->tid && e->obj < sizeof seen) {
        named++;
        twice += seen[e->obj]++ != 0;
      }
    }
    free(ev);
    CHECK(joins == JOINS && named == JOINS && twice == 0,
          "joins %d, naming another thread %d (of %d), a thread named twice %d", joins, named,
          JOINS, twice);
  } else
    ok = 0;
  finish("300 joinable threads alive at once: each join names the thread it waited for", ok);

  /* SIGKILL: records stay; the process is not marked finished. */
  snprintf(run, sizeof run, "%s/killed", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "killed", run, 1, &st) == 0 && WIFSIGNALED(st);
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals t = read_totals(pd, addr_a);
    CHECK(t.acq == 1000 && t.events == 1000, "killed: acq %lu events %lu", (unsigned long)t.acq,
          (unsigned long)t.events);
    struct locus_proc p = read_proc(pd);
    CHECK(!(p.flags & (LOCUS_PROC_EXITED | LOCUS_PROC_SIGNALED)), "killed run marked finished");
  } else
    ok = 0;
  finish("records survive SIGKILL, run marked unfinished", ok);

  /* exit() with a lock held: the section is written as unreleased, status kept. */
  snprintf(run, sizeof run, "%s/unreleased", base);
  mkdir(run, 0755);
  ok = run_case(self, lib, "unreleased", run, 1, &st) == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 3;
  if (ok && proc_dir(run, pd, sizeof pd) == 0) {
    read_addrs(run);
    struct totals t = read_totals(pd, addr_b);
    CHECK(t.unreleased == 1, "unreleased %lu != 1", (unsigned long)t.unreleased);
    struct locus_proc p = read_proc(pd);
    CHECK(p.exit_status == 3 && (p.flags & LOCUS_PROC_EXITED), "exit status %d flags %u",
          p.exit_status, p.flags);
  } else
    ok = 0;
  finish("exit with a lock held: unreleased section and exit status", ok);

  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", base);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", base);
  printf("%d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
