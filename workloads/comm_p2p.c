/* comm_p2p [threads=4] [rounds=~1s] [lines=4] [--truth]
 *
 * Point-to-point (after ComDetective's accuracy microbenchmark). Threads form pairs
 * (0-1, 2-3, ...; an odd last thread works alone) and each pair exchanges data on `lines`
 * cache lines that only its two threads touch. Within a pair the threads take turns: in
 * its turn a thread loads every word of the pair's lines, checks that it holds what the
 * partner wrote in its last turn, then writes every word with its own value. Pairs do not
 * wait for each other.
 *
 * Truth (exact cache model): each turn's first load of each line moves it from the
 * partner: per pair (a, b) that did R rounds, a -> b = lines x R and b -> a = lines x (R - 1)
 * (a's first turn finds the lines untouched), all true sharing; nothing between threads
 * of different pairs: the matrix is block-diagonal. Each pair stops on its own (rounds
 * given, or ~1 s): --truth prints every pair's rounds, the matrix and the data addresses.
 *
 * --free: no turns; for ~1 s (or `rounds` iterations) every thread loads every word of its
 * pair's lines and writes its own value, continuously (values race: not checked). The
 * truth is the pattern: a <-> b within each pair, nothing across pairs.
 */
#include "comm_common.h"

#define USAGE "comm_p2p [threads=4] [rounds=~1s] [lines=4] [--free]"
#define MAX_LINES 64
#define WORDS (CW_LINE / (int)sizeof(long))

struct line {
  _Alignas(CW_LINE) long w[WORDS];
};
struct pair {
  struct line lines[MAX_LINES];
};
static struct { struct pair pairs[CW_MAX_THREADS / 2]; } data;

static struct cw_turn turns[CW_MAX_THREADS / 2];
static long cfg_threads, cfg_lines, bad_reads;
static long pair_rounds[CW_MAX_THREADS / 2]; /* per pair (and a lone thread): the round limit */

/* Loads every word, checking it is `expect`, then stores `v` in every word. */
__attribute__((noinline)) static long exchange(struct line *l, long nlines, long expect, long v) {
  long bad = 0;
  for (long k = 0; k < nlines; k++) {
    for (int w = 0; w < WORDS; w++) {
      long x = l[k].w[w];
      cw_use(x);
      bad += x != expect;
    }
  }
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) l[k].w[w] = v;
  return bad;
}

__attribute__((noinline)) static void alone(struct line *l, long nlines, long v) {
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) l[k].w[w] = v;
}

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  long n = cw_load(&cfg_threads);
  long nlines = cw_load(&cfg_lines), bad = 0;
  int p = i / 2, side = i % 2;
  struct line *l = data.pairs[p].lines;
  cw_record_tid(i);
  if (i == n - 1 && side == 0) { /* no partner */
    for (long r = 0;; r++) {
      alone(l, nlines, r);
      if (cw_last_round(&pair_rounds[p], r, 1)) break;
    }
    return NULL;
  }
  for (long r = 0;; r++) {
    long my = 2 * r + side;
    cw_wait(&turns[p], my);
    /* Values: the thread of turn k writes k + 1; turn 0 finds zeros. */
    bad += exchange(l, nlines, my, my + 1);
    int last = cw_last_round(&pair_rounds[p], r, side == 0);
    cw_pass(&turns[p], my + 1);
    if (last) break;
  }
  if (bad) __atomic_fetch_add(&bad_reads, bad, __ATOMIC_RELAXED);
  return NULL;
}

/* --free: loads every word, then stores v in every word; no check (the partner races). */
__attribute__((noinline)) static void exchange_free(struct line *l, long nlines, long v) {
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) cw_use(l[k].w[w]);
  for (long k = 0; k < nlines; k++)
    for (int w = 0; w < WORDS; w++) l[k].w[w] = v;
}

static long free_limit;

static void *worker_free(void *arg) {
  int i = (int)(intptr_t)arg;
  long nlines = cw_load(&cfg_lines), limit = cw_load(&free_limit), it = 0;
  int sel = 0;
  cw_record_tid(i);
  struct line *l = data.pairs[i / 2].lines;
  for (; cw_free_next(it, limit, 0, &sel); it++) exchange_free(l, nlines, it);
  cw_store(&cw_iters[i], it);
  return NULL;
}

static int main_free(long n, long nlines, int truth) {
  double secs = cw_run_threads((int)n, worker_free);
  printf("comm_p2p --free: %ld threads in %.3f s\n", n, secs);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"comm_p2p\",\"mode\":\"free\",\"threads\":%ld,\"lines\":%ld,"
            "\"line_size\":%d,\"seconds\":%.3f,",
            n, nlines, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr, ",");
    cw_print_iters((int)n);
    fprintf(stderr, ",\"data\":[%lu,%lu],\"pair_data\":[", (unsigned long)&data,
            (unsigned long)&data + sizeof data);
    for (long p = 0; p < (n + 1) / 2; p++)
      fprintf(stderr, "%s[%lu,%lu]", p ? "," : "", (unsigned long)data.pairs[p].lines,
              (unsigned long)&data.pairs[p].lines[nlines]);
    fprintf(stderr,
            "],\"expected\":{\"transfers\":null,\"true\":null,\"false\":0,"
            "\"false_fraction\":0,\"pattern\":\"pairs\",\"pairs\":[");
    for (int p = 0; p < n / 2; p++) {
      cw_print_link(p == 0, 2 * p, 2 * p + 1);
      cw_print_link(0, 2 * p + 1, 2 * p);
    }
    fprintf(stderr, "]}}\n");
  }
  return 0;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  int free_mode = cw_take_free_flag(&argc, argv);
  long n = argc > 1 ? wl_arg_long(argv[1], USAGE) : 4;
  long rounds = cw_arg_rounds(argc > 2 ? argv[2] : NULL, USAGE);
  long nlines = argc > 3 ? wl_arg_long(argv[3], USAGE) : 4;
  if (n > CW_MAX_THREADS || nlines > MAX_LINES) {
    fprintf(stderr, "comm_p2p: at most %d threads and %d lines\n", CW_MAX_THREADS, MAX_LINES);
    return 2;
  }
  cw_store(&cfg_threads, n);
  for (long p = 0; p < (n + 1) / 2; p++) cw_store(&pair_rounds[p], rounds);
  cw_store(&cfg_lines, nlines);
  cw_store(&free_limit, rounds);
  if (free_mode) return main_free(n, nlines, truth);
  double secs = cw_run_threads((int)n, worker);
  long bad = cw_load(&bad_reads);
  rounds = 0; /* the pairs' rounds, summed */
  for (long p = 0; p < n / 2; p++) rounds += cw_load(&pair_rounds[p]);
  printf("comm_p2p: %ld threads, %ld pair rounds in %.3f s%s\n", n, rounds, secs,
         bad ? " WRONG VALUES READ" : "");
  if (truth) {
    long pairs = n / 2, total = 0;
    for (long p = 0; p < pairs; p++) total += nlines * (2 * cw_load(&pair_rounds[p]) - 1);
    fprintf(stderr,
            "{\"workload\":\"comm_p2p\",\"threads\":%ld,\"rounds\":%ld,\"lines\":%ld,"
            "\"line_size\":%d,\"seconds\":%.3f,",
            n, rounds, nlines, CW_LINE, secs);
    cw_print_tids((int)n);
    fprintf(stderr, ",\"data\":[%lu,%lu],\"pair_rounds\":[", (unsigned long)&data,
            (unsigned long)&data + sizeof data);
    for (long p = 0; p < pairs; p++)
      fprintf(stderr, "%s%ld", p ? "," : "", cw_load(&pair_rounds[p]));
    fprintf(stderr, "],\"pair_data\":[");
    for (long p = 0; p < (n + 1) / 2; p++)
      fprintf(stderr, "%s[%lu,%lu]", p ? "," : "", (unsigned long)data.pairs[p].lines,
              (unsigned long)&data.pairs[p].lines[nlines]);
    fprintf(stderr,
            "],\"shared_line_writes\":%ld,\"expected\":{\"transfers\":%ld,\"true\":%ld,"
            "\"false\":0,\"false_fraction\":0,\"pattern\":\"pairs\",\"pairs\":[",
            2 * rounds * nlines * WORDS, total, total);
    for (int p = 0; p < pairs; p++) {
      long pr = cw_load(&pair_rounds[p]);
      cw_print_pair(p == 0, 2 * p, 2 * p + 1, nlines * pr, 0);
      cw_print_pair(0, 2 * p + 1, 2 * p, nlines * (pr - 1), 0);
    }
    fprintf(stderr, "]}}\n");
  }
  return bad ? 1 : 0;
}
