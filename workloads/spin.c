/* spin [locks] [--truth]
 *
 * Two threads take one pthread spinlock (counter_spin, initialised in main) `locks` times
 * each. Exact count: 2 * locks acquisitions of counter_spin.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "spin [locks] [--truth]"

pthread_spinlock_t counter_spin;
static long counter, locks;

static void *worker(void *arg) {
  (void)arg;
  for (long i = 0; i < locks; i++) {
    WL_CHECK(pthread_spin_lock(&counter_spin));
    counter++;
    WL_CHECK(pthread_spin_unlock(&counter_spin));
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  locks = argc > 1 ? wl_arg_long(argv[1], USAGE) : 100000;
  WL_CHECK(pthread_spin_init(&counter_spin, PTHREAD_PROCESS_PRIVATE));
  pthread_t tids[2];
  for (int i = 0; i < 2; i++) {
    WL_CHECK(pthread_create(&tids[i], NULL, worker, NULL));
  }
  for (int i = 0; i < 2; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  WL_CHECK(pthread_spin_destroy(&counter_spin));
  printf("spin: %ld\n", counter);
  if (truth) {
    fprintf(stderr, "{\"workload\":\"spin\",\"locks\":{\"counter_spin\":%ld}}\n", counter);
  }
  return counter == 2 * locks ? 0 : 1;
}
