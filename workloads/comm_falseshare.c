/* comm_falseshare [threads=2] [rounds=~1s] [false_fraction=0.5] [burst=16] [--truth]
 *
 * False-sharing fraction (after ComDetective's accuracy microbenchmark). Two cache lines
 * of 8-byte counters: on the TRUE line every thread adds to the same counter c[0]; on the
 * FALSE line thread i adds to its own counter c[i], adjacent to the others' in one line.
 * The threads take turns in rounds (thread 0, 1, ..., n-1); in its turn a thread does
 * `burst` __atomic_fetch_add on one line: the false line in a fraction `false_fraction` of
 * the rounds (spread evenly), the true line in the others.
 *
 * Truth (exact cache model): every turn's first add moves the line from the thread that
 * had the previous turn on that line (thread i-1, or n-1 for thread 0), the other adds of
 * the burst hit. So, with F false rounds and T true rounds out of `rounds`:
 *   false transfers = n F - (F > 0), true transfers = n T - (T > 0),
 * in a ring i-1 -> i, and the false fraction of the transfers is about false_fraction.
 * --truth prints them, per pair, with the line addresses and the adds done.
 *
 * --free: no turns; every thread does bursts continuously for ~1 s (or `rounds` bursts),
 * on the false line in a fraction `false_fraction` of the time slots (comm_common.h), on
 * the true line in the others. Every pair of threads communicates; the truth gives the
 * configured fraction, the exact backend measures the transfers.
 */
#include "comm_common.h"

#define USAGE "comm_falseshare [threads=2] [rounds=~1s] [false_fraction=0.5] [burst=16] [--free]"

struct counters {
  _Alignas(CW_LINE) long c[CW_LINE / sizeof(long)];
};
static struct { struct counters true_line, false_line; } data;

static struct cw_turn turn;
static long cfg_threads, cfg_rounds, cfg_ppm, cfg_burst;

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  long n = cw_load(&cfg_threads);
  long ppm = cw_load(&cfg_ppm), burst = cw_load(&cfg_burst);
  cw_record_tid(i);
  for (long r = 0;; r++) {
    cw_wait(&turn, r * n + i);
    long *p = cw_selected(r, ppm) ? &data.false_line.c[i] : &data.true_line.c[0];
    for (long b = 0; b < burst; b++) __atomic_fetch_add(p, 1, __ATOMIC_RELAXED);
    int last = cw_last_round(&cfg_rounds, r, i == 0);
    cw_pass(&turn, r * n + i + 1);
    if (last) break;
  }
  return NULL;
}

static long free_adds[2]; /* [0] true line, [1] false line, summed over the threads */

static void *worker_free(void *arg) {
  int i = (int)(intptr_t)arg;
  long ppm = cw_load(&cfg_ppm), burst = cw_load(&cfg_burst), limit = cw_load(&cfg_rounds);
  long adds[2] = {0, 0}, it = 0;
  int sel = 0;
  cw_record_tid(i);
  for (; cw_free_next(it, limit, ppm, &sel); it++) {
    long *p = sel ? &data.false_line.c[i] : &data.true_line.c[0];
    for (long b = 0; b < burst; b++) __atomic_fetch_add(p, 1, __ATOMIC_RELAXED);
    adds[sel] += burst;
  }
  cw_store(&cw_iters[i], it);
  __atomic_fetch_add(&free_adds[0], adds[0], __ATOMIC_RELAXED);
  __atomic_fetch_add(&free_adds[1], adds[1], __ATOMIC_RELAXED);
  return NULL;
}

static int main_free(long n, long ppm, long burst, int truth) {
  double secs = cw_run_threads((int)n, worker_free);
  long fa = cw_load(&free_adds[1]), ta = cw_load(&free_adds[0]), sum_false = 0;
  for (long i = 0; i < n; i++) sum_false += cw_load(&data.false_line.c[i]);
  int ok = sum_false == fa && cw_load(&data.true_line.c[0]) == ta;
  printf("comm_falseshare --free: %ld threads in %.3f s%s\n", n, secs, ok ? "" : " WRONG COUNTS");
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"comm_falseshare\",\"mode\":\"free\",\"threads\":%ld,"
            "\"burst\":%ld,\"false_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,",
            n, burst, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr, ",");
    cw_print_iters((int)n);
    fprintf(stderr,
            ",\"lines\":{\"true\":%lu,\"false\":%lu},\"data\":[%lu,%lu],\"false_adds\":%ld,"
            "\"true_adds\":%ld,\"expected\":{\"transfers\":null,\"false_fraction\":%g,"
            "\"pattern\":\"all\",\"pairs\":[",
            (unsigned long)&data.true_line, (unsigned long)&data.false_line, (unsigned long)&data,
            (unsigned long)&data + sizeof data, fa, ta, (double)ppm / 1e6);
    cw_print_all_links((int)n);
    fprintf(stderr, "]}}\n");
  }
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  int free_mode = cw_take_free_flag(&argc, argv);
  long n = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long rounds = cw_arg_rounds(argc > 2 ? argv[2] : NULL, USAGE);
  long ppm = argc > 3 ? cw_arg_fraction(argv[3], USAGE) : 500000;
  long burst = argc > 4 ? wl_arg_long(argv[4], USAGE) : 16;
  if (n > (long)(CW_LINE / sizeof(long))) {
    fprintf(stderr, "comm_falseshare: at most %d threads (one counter each in a line)\n",
            (int)(CW_LINE / sizeof(long)));
    return 2;
  }
  cw_store(&cfg_threads, n);
  cw_store(&cfg_rounds, rounds);
  cw_store(&cfg_ppm, ppm);
  cw_store(&cfg_burst, burst);
  if (free_mode) return main_free(n, ppm, burst, truth);
  double secs = cw_run_threads((int)n, worker);
  rounds = cw_load(&cfg_rounds);

  long f = cw_selected_count(rounds, ppm), tr = rounds - f;
  /* Check: every add landed. */
  long sum_false = 0;
  for (long i = 0; i < n; i++) sum_false += cw_load(&data.false_line.c[i]);
  int ok = sum_false == n * f * burst && cw_load(&data.true_line.c[0]) == n * tr * burst;
  printf("comm_falseshare: %ld threads, %ld rounds in %.3f s%s\n", n, rounds, secs,
         ok ? "" : " WRONG COUNTS");
  if (truth) {
    long ft = n > 1 ? n * f - (f > 0) : 0, tt = n > 1 ? n * tr - (tr > 0) : 0;
    fprintf(stderr,
            "{\"workload\":\"comm_falseshare\",\"threads\":%ld,\"rounds\":%ld,\"burst\":%ld,"
            "\"false_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,",
            n, rounds, burst, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr,
            ",\"lines\":{\"true\":%lu,\"false\":%lu},\"data\":[%lu,%lu],\"false_rounds\":%ld,"
            "\"true_rounds\":%ld,\"shared_line_writes\":%ld,\"false_adds\":%ld,\"true_adds\":%ld,"
            "\"expected\":{\"transfers\":%ld,\"true\":%ld,\"false\":%ld,\"false_fraction\":%.6f,"
            "\"pattern\":\"ring\",\"pairs\":[",
            (unsigned long)&data.true_line, (unsigned long)&data.false_line, (unsigned long)&data,
            (unsigned long)&data + sizeof data, f, tr, n * rounds * burst, n * f * burst,
            n * tr * burst, ft + tt, tt, ft, ft + tt ? (double)ft / (double)(ft + tt) : 0.0);
    if (n > 1) {
      for (int i = 0; i < n; i++) {
        int src = (int)((i + n - 1) % n);
        /* Thread 0's first turn on each line finds it untouched. */
        cw_print_pair(i == 0, src, i, tr - (i == 0 && tr > 0), f - (i == 0 && f > 0));
      }
    }
    fprintf(stderr, "]}}\n");
  }
  return ok ? 0 : 1;
}
