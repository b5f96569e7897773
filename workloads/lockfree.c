/* lockfree [threads] [increments] [--truth]
 *
 * Threads that only do atomic increments on a shared counter: no lock, no condition
 * variable, nothing that waits except pthread_join in main. locus must report zero lock
 * acquisitions and zero lock wait; the only events are thread creation and joins.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

#define USAGE "lockfree [threads] [increments] [--truth]"

static atomic_long counter;
static long increments;

static void *worker(void *arg) {
  (void)arg;
  for (long i = 0; i < increments; i++) {
    atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  long threads = argc > 1 ? wl_arg_long(argv[1], USAGE) : 4;
  increments = argc > 2 ? wl_arg_long(argv[2], USAGE) : 5000000;
  pthread_t tids[threads];
  for (long i = 0; i < threads; i++) {
    WL_CHECK(pthread_create(&tids[i], NULL, worker, NULL));
  }
  for (long i = 0; i < threads; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  long total = atomic_load(&counter);
  printf("lockfree: %ld increments\n", total);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"lockfree\",\"threads\":%ld,\"increments\":%ld,\"acquisitions\":0,"
            "\"wait_s\":0}\n",
            threads, total);
  }
  return total == threads * increments ? 0 : 1;
}
