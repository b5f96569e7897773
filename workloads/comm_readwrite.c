/* comm_readwrite [readers=1] [rounds=~1s] [read_fraction=0.5] [lines=4] [--truth]
 *
 * Read fraction (after ComDetective's accuracy microbenchmark). One writer (thread 0) and
 * `readers` readers (threads 1..readers) on `lines` shared cache lines. They take turns in
 * rounds: the writer writes every word of the lines (the round number), then each reader
 * in turn, in a fraction `read_fraction` of the rounds (spread evenly), loads every word
 * (kept with asm volatile) and checks it holds the round number; in the other rounds the
 * readers do nothing.
 *
 * Truth (exact cache model): each reading turn's first load of each line moves it from the
 * writer: with R read rounds, writer -> reader k = lines x R transfers for every reader,
 * all true sharing; nothing moves between readers or back to the writer (readers never
 * write, and the writer is always the last writer). The volume grows linearly with
 * read_fraction. --truth prints the matrix, the words written and read, the data address.
 *
 * --free: no turns; for ~1 s (or `rounds` iterations) the writer writes the lines
 * continuously and every reader loads them in a fraction `read_fraction` of the time slots
 * (comm_common.h), its own private lines in the others. Writer -> readers only.
 */
#include "comm_common.h"

#define USAGE "comm_readwrite [readers=1] [rounds=~1s] [read_fraction=0.5] [lines=4] [--free]"
#define MAX_LINES 64
#define WORDS (CW_LINE / (int)sizeof(long))

struct line {
  _Alignas(CW_LINE) long w[WORDS];
};
static struct { struct line shared[MAX_LINES]; } data;

static struct cw_turn turn;
static long cfg_threads, cfg_rounds, cfg_ppm, cfg_lines, bad_reads;

__attribute__((noinline)) static void write_lines(long nlines, long v) {
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) data.shared[k].w[w] = v;
}

/* Returns the number of words that did not hold `v`. */
__attribute__((noinline)) static long read_lines(long nlines, long v) {
  long bad = 0;
  for (long k = 0; k < nlines; k++) {
    for (int w = 0; w < WORDS; w++) {
      long x = data.shared[k].w[w];
      cw_use(x);
      bad += x != v;
    }
  }
  return bad;
}

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  long n = cw_load(&cfg_threads);
  long ppm = cw_load(&cfg_ppm), nlines = cw_load(&cfg_lines), bad = 0;
  cw_record_tid(i);
  for (long r = 0;; r++) {
    cw_wait(&turn, r * n + i);
    if (i == 0)
      write_lines(nlines, r + 1);
    else if (cw_selected(r, ppm))
      bad += read_lines(nlines, r + 1);
    int last = cw_last_round(&cfg_rounds, r, i == 0);
    cw_pass(&turn, r * n + i + 1);
    if (last) break;
  }
  if (bad) __atomic_fetch_add(&bad_reads, bad, __ATOMIC_RELAXED);
  return NULL;
}

/* --free: the readers' private lines (outside `data`: they never communicate). */
static struct line priv[CW_MAX_THREADS][MAX_LINES];
static long free_reads;

__attribute__((noinline)) static void read_private(struct line *l, long nlines) {
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) cw_use(l[k].w[w]);
}

static void *worker_free(void *arg) {
  int i = (int)(intptr_t)arg;
  long ppm = cw_load(&cfg_ppm), nlines = cw_load(&cfg_lines), limit = cw_load(&cfg_rounds);
  long it = 0, reads = 0;
  int sel = 0;
  cw_record_tid(i);
  for (; cw_free_next(it, limit, ppm, &sel); it++) {
    if (i == 0) {
      write_lines(nlines, it + 1);
    } else if (sel) {
      read_lines(nlines, 0); /* values race with the writer: not checked */
      reads++;
    } else {
      read_private(priv[i], nlines);
    }
  }
  cw_store(&cw_iters[i], it);
  __atomic_fetch_add(&free_reads, reads, __ATOMIC_RELAXED);
  return NULL;
}

static int main_free(long n, long ppm, long nlines, int truth) {
  double secs = cw_run_threads((int)n, worker_free);
  printf("comm_readwrite --free: %ld readers in %.3f s\n", n - 1, secs);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"comm_readwrite\",\"mode\":\"free\",\"threads\":%ld,"
            "\"readers\":%ld,\"lines\":%ld,\"read_fraction\":%g,\"line_size\":%d,"
            "\"seconds\":%.3f,",
            n, n - 1, nlines, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr, ",");
    cw_print_iters((int)n);
    fprintf(stderr,
            ",\"shared\":[%lu,%lu],\"data\":[%lu,%lu],\"shared_line_writes\":%ld,"
            "\"shared_line_reads\":%ld,\"expected\":{\"transfers\":null,\"true\":null,"
            "\"false\":0,\"false_fraction\":0,\"pattern\":\"writer->readers\",\"pairs\":[",
            (unsigned long)data.shared, (unsigned long)&data.shared[nlines], (unsigned long)&data,
            (unsigned long)&data + sizeof data, cw_load(&cw_iters[0]) * nlines * WORDS,
            cw_load(&free_reads) * nlines * WORDS);
    for (int k = 1; k < n; k++) cw_print_link(k == 1, 0, k);
    fprintf(stderr, "]}}\n");
  }
  return 0;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  int free_mode = cw_take_free_flag(&argc, argv);
  long readers = argc > 1 ? wl_arg_long(argv[1], USAGE) : 1;
  long rounds = cw_arg_rounds(argc > 2 ? argv[2] : NULL, USAGE);
  long ppm = argc > 3 ? cw_arg_fraction(argv[3], USAGE) : 500000;
  long nlines = argc > 4 ? wl_arg_long(argv[4], USAGE) : 4;
  long n = readers + 1;
  if (n > CW_MAX_THREADS || nlines > MAX_LINES) {
    fprintf(stderr, "comm_readwrite: at most %d readers and %d lines\n", CW_MAX_THREADS - 1,
            MAX_LINES);
    return 2;
  }
  cw_store(&cfg_threads, n);
  cw_store(&cfg_rounds, rounds);
  cw_store(&cfg_ppm, ppm);
  cw_store(&cfg_lines, nlines);
  if (free_mode) return main_free(n, ppm, nlines, truth);
  double secs = cw_run_threads((int)n, worker);
  rounds = cw_load(&cfg_rounds);
  long bad = cw_load(&bad_reads);
  printf("comm_readwrite: %ld readers, %ld rounds in %.3f s%s\n", readers, rounds, secs,
         bad ? " WRONG VALUES READ" : "");
  if (truth) {
    long rr = cw_selected_count(rounds, ppm);
    fprintf(stderr,
            "{\"workload\":\"comm_readwrite\",\"threads\":%ld,\"readers\":%ld,\"rounds\":%ld,"
            "\"lines\":%ld,\"read_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,",
            n, readers, rounds, nlines, (double)ppm / 1e6, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr,
            ",\"shared\":[%lu,%lu],\"data\":[%lu,%lu],\"read_rounds\":%ld,"
            "\"shared_line_writes\":%ld,\"shared_line_reads\":%ld,"
            "\"expected\":{\"transfers\":%ld,\"true\":%ld,\"false\":0,\"false_fraction\":0,"
            "\"pattern\":\"writer->readers\",\"pairs\":[",
            (unsigned long)data.shared, (unsigned long)&data.shared[nlines], (unsigned long)&data,
            (unsigned long)&data + sizeof data, rr, rounds * nlines * WORDS,
            readers * rr * nlines * WORDS, readers * rr * nlines, readers * rr * nlines);
    for (int k = 1; k < n; k++) cw_print_pair(k == 1, 0, k, rr * nlines, 0);
    fprintf(stderr, "]}}\n");
  }
  return bad ? 1 : 0;
}
