/* churn [threads] [locks_per_thread] [--truth]
 *
 * Creates and joins many short-lived threads, in waves of at most 64 live threads; each
 * locks one shared mutex (churn_lock) a few times. Tests the runtime's thread registry
 * (slots claimed and released, threads that end before anyone looks) and that no count is
 * lost when threads are short: churn_lock must have exactly threads * locks_per_thread
 * acquisitions.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "churn [threads] [locks_per_thread] [--truth]"
#define WAVE 64

pthread_mutex_t churn_lock = PTHREAD_MUTEX_INITIALIZER;
static long locks_per_thread;
static long total_locks; /* protected by churn_lock */

static void *worker(void *arg) {
  (void)arg;
  for (long i = 0; i < locks_per_thread; i++) {
    WL_CHECK(pthread_mutex_lock(&churn_lock));
    total_locks++;
    WL_CHECK(pthread_mutex_unlock(&churn_lock));
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  long threads = argc > 1 ? wl_arg_long(argv[1], USAGE) : 5000;
  locks_per_thread = argc > 2 ? wl_arg_long(argv[2], USAGE) : 3;
  pthread_t tids[WAVE];
  for (long done = 0; done < threads;) {
    long wave = threads - done < WAVE ? threads - done : WAVE;
    for (long i = 0; i < wave; i++) {
      WL_CHECK(pthread_create(&tids[i], NULL, worker, NULL));
    }
    for (long i = 0; i < wave; i++) {
      WL_CHECK(pthread_join(tids[i], NULL));
    }
    done += wave;
  }
  printf("churn: %ld threads, %ld locks\n", threads, total_locks);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"churn\",\"threads\":%ld,\"locks_per_thread\":%ld,"
            "\"locks\":{\"churn_lock\":%ld}}\n",
            threads, locks_per_thread, total_locks);
  }
  return total_locks == threads * locks_per_thread ? 0 : 1;
}
