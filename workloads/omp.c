/* omp [iterations] [--truth]
 *
 * OpenMP with 2 threads: each thread takes omp_lock (omp_set_lock) `iterations` times,
 * enters a named critical section (`#pragma omp critical(counter)`) `iterations` times and
 * meets at an explicit `#pragma omp barrier` 10 times. Exact counts per family are in the
 * truth. The implicit barrier at the end of the parallel region is invisible to
 * interposition in libgomp and is not counted.
 */
#include <omp.h>

#include "common.h"

#define USAGE "omp [iterations] [--truth]"
#define THREADS 2
#define BARRIERS 10

static omp_lock_t omp_lock;

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  long iterations = argc > 1 ? wl_arg_long(argv[1], USAGE) : 10000;
  long by_lock = 0, by_critical = 0;
  omp_init_lock(&omp_lock);
#pragma omp parallel num_threads(THREADS)
  {
    for (long i = 0; i < iterations; i++) {
      omp_set_lock(&omp_lock);
      by_lock++;
      omp_unset_lock(&omp_lock);
#pragma omp critical(counter)
      by_critical++;
    }
    for (int b = 0; b < BARRIERS; b++) {
#pragma omp barrier
    }
  }
  omp_destroy_lock(&omp_lock);
  printf("omp: %ld by lock, %ld by critical\n", by_lock, by_critical);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"omp\",\"threads\":%d,\"omp_set_lock\":%ld,\"omp_critical\":%ld,"
            "\"omp_barrier\":%d}\n",
            THREADS, by_lock, by_critical, THREADS * BARRIERS);
  }
  return by_lock == THREADS * iterations ? 0 : 1;
}
