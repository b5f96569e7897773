/* comm_writevol [threads=2] [rounds=~1s] [share_fraction=0.5] [lines=4] [--truth]
 *
 * Write volume (after ComDetective's accuracy microbenchmark). Threads write 8-byte words
 * of arrays; they take turns in rounds (thread 0, 1, ..., n-1) and in its turn a thread
 * writes every word of `lines` cache lines: of the SHARED array, which all threads write
 * (the same words), in a fraction `share_fraction` of the rounds (spread evenly); of its own
 * PRIVATE array, which no other thread touches, in the others.
 *
 * Truth (exact cache model): in a shared round each thread's first write to each shared
 * line moves it from the thread before it (thread i-1, or n-1 for thread 0): with S shared
 * rounds, transfers = lines x (n S - (S > 0)), all true sharing, in a ring i-1 -> i; private
 * rounds move nothing. The volume grows linearly with share_fraction. --truth prints the
 * expected matrix, the words written to shared and private lines and the data addresses.
 *
 * --free: no turns; every thread writes its `lines` lines continuously for ~1 s (or `rounds`
 * times): the shared ones in a fraction `share_fraction` of the time slots (comm_common.h),
 * its private ones in the others. Every pair of threads communicates; the volume grows with
 * share_fraction and the thread count, and the exact backend measures it.
 */
#include "comm_common.h"

#define USAGE "comm_writevol [threads=2] [rounds=~1s] [share_fraction=0.5] [lines=4] [--free]"
#define MAX_LINES 64
#define WORDS (CW_LINE / (int)sizeof(long))

struct line {
  _Alignas(CW_LINE) long w[WORDS];
};
static struct {
  struct line shared[MAX_LINES];
  struct line priv[CW_MAX_THREADS][MAX_LINES];
} data;

static struct cw_turn turn;
static long cfg_threads, cfg_rounds, cfg_ppm, cfg_lines, free_shared;

/* Not inlined: one store instruction per kind that a report can name. */
__attribute__((noinline)) static void write_lines(struct line *l, long nlines, long v) {
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) l[k].w[w] = v;
}

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  long n = cw_load(&cfg_threads);
  long ppm = cw_load(&cfg_ppm), nlines = cw_load(&cfg_lines);
  cw_record_tid(i);
  for (long r = 0;; r++) {
    cw_wait(&turn, r * n + i);
    write_lines(cw_selected(r, ppm) ? data.shared : data.priv[i], nlines, r);
    int last = cw_last_round(&cfg_rounds, r, i == 0);
    cw_pass(&turn, r * n + i + 1);
    if (last) break;
  }
  return NULL;
}

static void *worker_free(void *arg) {
  int i = (int)(intptr_t)arg;
  long ppm = cw_load(&cfg_ppm), nlines = cw_load(&cfg_lines), limit = cw_load(&cfg_rounds);
  long it = 0, shared = 0;
  int sel = 0;
  cw_record_tid(i);
  for (; cw_free_next(it, limit, ppm, &sel); it++) {
    write_lines(sel ? data.shared : data.priv[i], nlines, it);
    shared += sel;
  }
  cw_store(&cw_iters[i], it);
  __atomic_fetch_add(&free_shared, shared, __ATOMIC_RELAXED);
  return NULL;
}

static int main_free(long n, long ppm, long nlines, int truth) {
  double secs = cw_run_threads((int)n, worker_free);
  long its = 0, sh = cw_load(&free_shared);
  for (int i = 0; i < n; i++) its += cw_load(&cw_iters[i]);
  printf("comm_writevol --free: %ld threads in %.3f s\n", n, secs);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"comm_writevol\",\"mode\":\"free\",\"threads\":%ld,"
            "\"lines\":%ld,\"share_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,",
            n, nlines, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr, ",");
    cw_print_iters((int)n);
    fprintf(stderr,
            ",\"shared\":[%lu,%lu],\"data\":[%lu,%lu],\"shared_line_writes\":%ld,"
            "\"private_line_writes\":%ld,\"expected\":{\"transfers\":null,\"true\":null,"
            "\"false\":0,\"false_fraction\":0,\"pattern\":\"all\",\"pairs\":[",
            (unsigned long)data.shared, (unsigned long)&data.shared[nlines], (unsigned long)&data,
            (unsigned long)&data + sizeof data, sh * nlines * WORDS, (its - sh) * nlines * WORDS);
    cw_print_all_links((int)n);
    fprintf(stderr, "]}}\n");
  }
  return 0;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  int free_mode = cw_take_free_flag(&argc, argv);
  long n = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long rounds = cw_arg_rounds(argc > 2 ? argv[2] : NULL, USAGE);
  long ppm = argc > 3 ? cw_arg_fraction(argv[3], USAGE) : 500000;
  long nlines = argc > 4 ? wl_arg_long(argv[4], USAGE) : 4;
  if (n > CW_MAX_THREADS || nlines > MAX_LINES) {
    fprintf(stderr, "comm_writevol: at most %d threads and %d lines\n", CW_MAX_THREADS, MAX_LINES);
    return 2;
  }
  cw_store(&cfg_threads, n);
  cw_store(&cfg_rounds, rounds);
  cw_store(&cfg_ppm, ppm);
  cw_store(&cfg_lines, nlines);
  if (free_mode) return main_free(n, ppm, nlines, truth);
  double secs = cw_run_threads((int)n, worker);
  rounds = cw_load(&cfg_rounds);
  printf("comm_writevol: %ld threads, %ld rounds in %.3f s\n", n, rounds, secs);
  if (truth) {
    long s = cw_selected_count(rounds, ppm), p = rounds - s;
    long total = nlines * (n * s - (s > 0));
    fprintf(stderr,
            "{\"workload\":\"comm_writevol\",\"threads\":%ld,\"rounds\":%ld,\"lines\":%ld,"
            "\"share_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,",
            n, rounds, nlines, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr,
            ",\"shared\":[%lu,%lu],\"data\":[%lu,%lu],\"shared_rounds\":%ld,"
            "\"private_rounds\":%ld,\"shared_line_writes\":%ld,\"private_line_writes\":%ld,"
            "\"expected\":{\"transfers\":%ld,\"true\":%ld,\"false\":0,\"false_fraction\":0,"
            "\"pattern\":\"ring\",\"pairs\":[",
            (unsigned long)data.shared, (unsigned long)&data.shared[nlines], (unsigned long)&data,
            (unsigned long)&data + sizeof data, s, p, n * s * nlines * WORDS,
            n * p * nlines * WORDS, n > 1 ? total : 0, n > 1 ? total : 0);
    if (n > 1) {
      for (int i = 0; i < n; i++)
        cw_print_pair(i == 0, (int)((i + n - 1) % n), i, nlines * (s - (i == 0 && s > 0)), 0);
    }
    fprintf(stderr, "]}}\n");
  }
  return 0;
}
