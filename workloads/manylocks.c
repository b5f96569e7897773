/* manylocks [locks] [reps] [--truth]
 *
 * `locks` heap-allocated mutexes, each initialised with pthread_mutex_init in make_locks()
 * (so locus names them by their init site) and locked `reps` times by each of 2 threads.
 * Every lock has exactly 2 * reps acquisitions. Tests the runtime's per-thread count tables
 * when they must grow, and the analysis with many distinct locks.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "manylocks [locks] [reps] [--truth]"
#define THREADS 2

static pthread_mutex_t *locks;
static long nlocks, reps;

__attribute__((noinline)) static pthread_mutex_t *make_locks(long n) {
  pthread_mutex_t *m = calloc((size_t)n, sizeof *m);
  if (m == NULL) {
    wl_die("calloc", ENOMEM);
  }
  for (long i = 0; i < n; i++) {
    WL_CHECK(pthread_mutex_init(&m[i], NULL));
  }
  return m;
}

static void *worker(void *arg) {
  long id = (long)arg;
  for (long r = 0; r < reps; r++) {
    /* The two threads walk the array in opposite directions to meet in the middle. */
    for (long k = 0; k < nlocks; k++) {
      long i = id == 0 ? k : nlocks - 1 - k;
      WL_CHECK(pthread_mutex_lock(&locks[i]));
      WL_CHECK(pthread_mutex_unlock(&locks[i]));
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  nlocks = argc > 1 ? wl_arg_long(argv[1], USAGE) : 10000;
  reps = argc > 2 ? wl_arg_long(argv[2], USAGE) : 3;
  locks = make_locks(nlocks);
  pthread_t tids[THREADS];
  for (long i = 0; i < THREADS; i++) {
    WL_CHECK(pthread_create(&tids[i], NULL, worker, (void *)i));
  }
  for (long i = 0; i < THREADS; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  for (long i = 0; i < nlocks; i++) {
    WL_CHECK(pthread_mutex_destroy(&locks[i]));
  }
  free(locks);
  printf("manylocks: %ld locks, %ld acquisitions each\n", nlocks, THREADS * reps);
  if (truth) {
    fprintf(
        stderr,
        "{\"workload\":\"manylocks\",\"locks\":%ld,\"threads\":%d,\"reps\":%ld,"
        "\"acquisitions_per_lock\":%ld,\"acquisitions\":%ld,\"init_function\":\"make_locks\"}\n",
        nlocks, THREADS, reps, THREADS * reps, nlocks * THREADS * reps);
  }
  return 0;
}
