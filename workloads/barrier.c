/* barrier [rounds] [--truth]
 *
 * Three threads meet at phase_barrier `rounds` times; thread i works i ms before each
 * arrival, so thread 0 waits about 2 ms and thread 1 about 1 ms per round. Exact count:
 * 3 * rounds barrier waits.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "barrier [rounds] [--truth]"
#define THREADS 3

pthread_barrier_t phase_barrier;
static long rounds;

static void *worker(void *arg) {
  long id = (long)arg;
  for (long i = 0; i < rounds; i++) {
    wl_sleep_until_ns(wl_now_ns() + (uint64_t)id * 1000000u);
    int rc = pthread_barrier_wait(&phase_barrier);
    if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) {
      wl_die("pthread_barrier_wait", rc);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  rounds = argc > 1 ? wl_arg_long(argv[1], USAGE) : 100;
  WL_CHECK(pthread_barrier_init(&phase_barrier, NULL, THREADS));
  pthread_t tids[THREADS];
  for (long i = 0; i < THREADS; i++) {
    WL_CHECK(pthread_create(&tids[i], NULL, worker, (void *)i));
  }
  for (int i = 0; i < THREADS; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  WL_CHECK(pthread_barrier_destroy(&phase_barrier));
  printf("barrier: %ld rounds\n", rounds);
  if (truth) {
    fprintf(stderr, "{\"workload\":\"barrier\",\"threads\":%d,\"rounds\":%ld,\"waits\":%ld}\n",
            THREADS, rounds, THREADS * rounds);
  }
  return 0;
}
