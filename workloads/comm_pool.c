/* comm_pool [threads=2] [seconds=1] [--truth]
 *
 * A thread pool as servers and runtimes leave it: the workers block every signal (as xz's
 * and many servers' workers do, so that signals go to the main thread) and are still
 * running when the program ends (main calls exit() without stopping them, as with an
 * OpenMP pool). Each worker adds to its own 8-byte counter; the counters are adjacent in
 * one cache line, so every pair of workers falsely shares that line all the time.
 *
 * Truth: the workers' CPU time, read by main just before exit() (CLOCK of each thread), and
 * the counter line's address. A profiler must sample the workers (about cpu_s / period
 * samples each) although they block its signals, and must keep their counters although
 * they never end: all the communication is false sharing among the workers.
 */
#include <signal.h>
#include <time.h>

#include "comm_common.h"

#define USAGE "comm_pool [threads=2] [seconds=1] [--truth]"

static struct { _Alignas(CW_LINE) long c[CW_LINE / sizeof(long)]; } line;

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  cw_record_tid(i);
  for (;;) __atomic_fetch_add(&line.c[i], 1, __ATOMIC_RELAXED);
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  long n = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long secs = argc > 2 ? wl_arg_long(argv[2], USAGE) : 1;
  if (n < 1 || n > (long)(CW_LINE / sizeof(long)) || secs < 1) {
    fprintf(stderr, "usage: %s (1 <= threads <= %zu)\n", USAGE, CW_LINE / sizeof(long));
    return 2;
  }
  /* Workers inherit the creator's mask: every signal blocked, as xz does. */
  sigset_t all, old;
  sigfillset(&all);
  WL_CHECK(pthread_sigmask(SIG_SETMASK, &all, &old));
  pthread_t t[CW_LINE / sizeof(long)];
  cw_start_threads(t, (int)n, worker);
  WL_CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL));
  wl_sleep_until_ns(wl_now_ns() + (uint64_t)secs * 1000000000ull);
  double cpu = 0;
  for (long i = 0; i < n; i++) {
    clockid_t c;
    struct timespec ts;
    if (pthread_getcpuclockid(t[i], &c) == 0 && clock_gettime(c, &ts) == 0)
      cpu += (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
  }
  printf("comm_pool: %ld workers, %.3f s of CPU, still running at exit\n", n, cpu);
  if (truth) {
    fprintf(stderr, "{\"workload\":\"comm_pool\",\"threads\":%ld,\"worker_cpu_s\":%.6f,", n, cpu);
    cw_print_tids((int)n);
    fprintf(stderr, ",\"data\":[%lu,%lu]}\n", (unsigned long)(uintptr_t)&line,
            (unsigned long)(uintptr_t)&line + CW_LINE);
  }
  fflush(NULL);
  exit(0);
}
