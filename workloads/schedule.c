/* schedule [unit_us] [--truth]
 *
 * A constructed lock schedule with exactly known waits, holds and critical path. Three
 * threads and two static mutexes (sched_lock_a, sched_lock_b); every request and every
 * release happens at an absolute deadline (clock_nanosleep TIMER_ABSTIME) t0 + k * unit, so
 * a late wake-up never shifts the rest of the schedule. Events are at least 20 units apart,
 * so with the default unit of 1 ms scheduling noise stays far below 5 %.
 *
 *   time (units)  0    50   100  150  200  250  350  400  450  470  500  600  650
 *   T1            A+--------------------A-                          end 220
 *   T2                      A?          A+--------A-   B+---B-      end 520
 *   T3                 B+-------B-           A?   A+---A-   B?   B+----B-   end 650
 *   (X+ acquire, X- release, X? request that has to wait)
 *
 * Chen & Stenstrom critical path: walk back from the last thread to finish (T3, which main
 * joins last); at a contended acquisition, jump to the thread that released the lock at
 * that moment. T3's second B (waited 30 on T2) -> T2's B -> T2's A (waited 100 on T1) ->
 * T1's A. T3's A section waited 100 too, but that wait is NOT on the critical path: while T3
 * waited for A, the path runs through T2.
 *
 * --truth prints the designed schedule, the thread ids, the waits and holds the program
 * measured itself around each lock call, and max_deviation_ms, the largest distance of any
 * request, acquisition or release from its designed time: a test can tell locus's error from
 * noise, and a run whose deviation is large (an overloaded machine) is not a valid sample.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "schedule [unit_us] [--truth]"

pthread_mutex_t sched_lock_a = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t sched_lock_b = PTHREAD_MUTEX_INITIALIZER;

struct section {
  int lock;     /* 0 = sched_lock_a, 1 = sched_lock_b */
  int req;      /* units after t0: lock requested */
  int acq;      /* designed acquisition time (the previous holder's release) */
  int rel;      /* units after t0: lock released */
  int critical; /* on the Chen & Stenstrom critical path */
  uint64_t measured_wait_ns, measured_hold_ns;
  uint64_t deviation_ns; /* largest |actual - designed| of this section's req, acq, rel */
};

#define MAX_SECTIONS 3
struct thread_plan {
  const char *name;
  int nsections;
  struct section sections[MAX_SECTIONS];
  int end; /* units after t0: thread returns */
  unsigned tid;
};

#define SEC(l, rq, aq, rl, crit) \
  { .lock = l, .req = rq, .acq = aq, .rel = rl, .critical = crit }
static struct thread_plan plan[3] = {
    {.name = "T1", .nsections = 1, .sections = {SEC(0, 0, 0, 200, 1)}, .end = 220},
    {.name = "T2",
     .nsections = 2,
     .sections = {SEC(0, 100, 200, 350, 1), SEC(1, 400, 400, 500, 1)},
     .end = 520},
    {.name = "T3",
     .nsections = 3,
     .sections = {SEC(1, 50, 50, 150, 0), SEC(0, 250, 350, 450, 0), SEC(1, 470, 500, 600, 1)},
     .end = 650},
};

static const char *lock_names[2] = {"sched_lock_a", "sched_lock_b"};
static pthread_mutex_t *locks[2] = {&sched_lock_a, &sched_lock_b};
static uint64_t t0_ns, unit_ns;

static uint64_t at(int units) { return t0_ns + (uint64_t)units * unit_ns; }

static uint64_t deviation(uint64_t actual, int designed_units) {
  uint64_t d = at(designed_units);
  return actual > d ? actual - d : d - actual;
}

/* Not inlined, so every lock call has one call site that locus can name. */
__attribute__((noinline)) static void run_section(struct section *s) {
  wl_sleep_until_ns(at(s->req));
  uint64_t req = wl_now_ns();
  WL_CHECK(pthread_mutex_lock(locks[s->lock]));
  uint64_t acq = wl_now_ns();
  wl_sleep_until_ns(at(s->rel));
  uint64_t rel = wl_now_ns();
  WL_CHECK(pthread_mutex_unlock(locks[s->lock]));
  s->measured_wait_ns = acq - req;
  s->measured_hold_ns = rel - acq;
  uint64_t dr = deviation(req, s->req), da = deviation(acq, s->acq), dl = deviation(rel, s->rel);
  s->deviation_ns = dr > da ? (dr > dl ? dr : dl) : (da > dl ? da : dl);
}

static void *thread_main(void *arg) {
  struct thread_plan *p = arg;
  p->tid = wl_gettid();
  for (int i = 0; i < p->nsections; i++) {
    run_section(&p->sections[i]);
  }
  wl_sleep_until_ns(at(p->end));
  return NULL;
}

static double ms(double units) { return units * (double)unit_ns / 1e6; }

static void print_truth(void) {
  double crit_wait = 0, crit_hold = 0, max_dev = 0;
  int crit_events = 0;
  fprintf(stderr, "{\"workload\":\"schedule\",\"unit_ms\":%g,\"threads\":[", ms(1));
  for (int t = 0; t < 3; t++) {
    struct thread_plan *p = &plan[t];
    double wait = 0, hold = 0, mwait = 0, mhold = 0;
    fprintf(stderr, "%s{\"name\":\"%s\",\"tid\":%u,\"sections\":[", t ? "," : "", p->name, p->tid);
    for (int i = 0; i < p->nsections; i++) {
      struct section *s = &p->sections[i];
      double w = ms(s->acq - s->req), h = ms(s->rel - s->acq);
      wait += w;
      hold += h;
      mwait += (double)s->measured_wait_ns / 1e6;
      mhold += (double)s->measured_hold_ns / 1e6;
      if ((double)s->deviation_ns / 1e6 > max_dev) max_dev = (double)s->deviation_ns / 1e6;
      if (s->critical) {
        crit_events++;
        crit_wait += w;
        crit_hold += h;
      }
      fprintf(stderr,
              "%s{\"lock\":\"%s\",\"req_ms\":%g,\"acq_ms\":%g,\"rel_ms\":%g,\"wait_ms\":%g,"
              "\"hold_ms\":%g,\"contended\":%s,\"critical\":%s,\"measured_wait_ms\":%.3f,"
              "\"measured_hold_ms\":%.3f}",
              i ? "," : "", lock_names[s->lock], ms(s->req), ms(s->acq), ms(s->rel), w, h,
              s->acq > s->req ? "true" : "false", s->critical ? "true" : "false",
              (double)s->measured_wait_ns / 1e6, (double)s->measured_hold_ns / 1e6);
    }
    fprintf(stderr,
            "],\"acquisitions\":%d,\"wait_ms\":%g,\"hold_ms\":%g,\"measured_wait_ms\":%.3f,"
            "\"measured_hold_ms\":%.3f,\"end_ms\":%g}",
            p->nsections, wait, hold, mwait, mhold, ms(p->end));
  }
  fprintf(stderr, "],\"locks\":[");
  for (int l = 0; l < 2; l++) {
    int acqs = 0, contended = 0, cevents = 0;
    double wait = 0, hold = 0, cwait = 0;
    for (int t = 0; t < 3; t++) {
      for (int i = 0; i < plan[t].nsections; i++) {
        struct section *s = &plan[t].sections[i];
        if (s->lock != l) {
          continue;
        }
        acqs++;
        contended += s->acq > s->req;
        wait += ms(s->acq - s->req);
        hold += ms(s->rel - s->acq);
        if (s->critical) {
          cevents++;
          cwait += ms(s->acq - s->req);
        }
      }
    }
    fprintf(stderr,
            "%s{\"name\":\"%s\",\"acquisitions\":%d,\"contended\":%d,\"wait_ms\":%g,"
            "\"hold_ms\":%g,\"critical_events\":%d,\"critical_wait_ms\":%g}",
            l ? "," : "", lock_names[l], acqs, contended, wait, hold, cevents, cwait);
  }
  fprintf(
      stderr,
      "],\"max_deviation_ms\":%.3f,\"critical_path\":{\"events\":%d,\"wait_ms\":%g,\"hold_ms\":%g,"
      "\"order\":[\"T3:sched_lock_b@%g\",\"T2:sched_lock_b@%g\",\"T2:sched_lock_a@%g\","
      "\"T1:sched_lock_a@%g\"]}}\n",
      max_dev, crit_events, crit_wait, crit_hold, ms(470), ms(400), ms(100), ms(0));
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  long unit_us = argc > 1 ? wl_arg_long(argv[1], USAGE) : 1000;
  unit_ns = (uint64_t)unit_us * 1000u;
  /* Threads are created before t0, so thread start-up is not part of the schedule. */
  t0_ns = wl_now_ns() + 30 * unit_ns;
  pthread_t tids[3];
  for (int t = 0; t < 3; t++) {
    WL_CHECK(pthread_create(&tids[t], NULL, thread_main, &plan[t]));
  }
  for (int t = 0; t < 3; t++) {
    WL_CHECK(pthread_join(tids[t], NULL));
  }
  printf("schedule: done in %.1f ms\n", (double)(wl_now_ns() - t0_ns) / 1e6);
  if (truth) {
    print_truth();
  }
  return 0;
}
