/* rwlock [reads] [writes] [--truth]
 *
 * Two reader threads take table_rwlock for reading `reads` times each while one writer
 * takes it for writing `writes` times. Exact counts: 2 * reads read acquisitions and
 * `writes` write acquisitions of table_rwlock.
 */
#include <pthread.h>

#include "common.h"

#define USAGE "rwlock [reads] [writes] [--truth]"

pthread_rwlock_t table_rwlock = PTHREAD_RWLOCK_INITIALIZER;
static long table[64];
static long reads, writes;

static void *reader(void *arg) {
  long sum = 0;
  for (long i = 0; i < reads; i++) {
    WL_CHECK(pthread_rwlock_rdlock(&table_rwlock));
    sum += table[i % 64];
    WL_CHECK(pthread_rwlock_unlock(&table_rwlock));
  }
  *(long *)arg = sum;
  return NULL;
}

static void *writer(void *arg) {
  (void)arg;
  for (long i = 0; i < writes; i++) {
    WL_CHECK(pthread_rwlock_wrlock(&table_rwlock));
    table[i % 64]++;
    WL_CHECK(pthread_rwlock_unlock(&table_rwlock));
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  reads = argc > 1 ? wl_arg_long(argv[1], USAGE) : 100000;
  writes = argc > 2 ? wl_arg_long(argv[2], USAGE) : 10000;
  pthread_t tids[3];
  long sums[2];
  WL_CHECK(pthread_create(&tids[0], NULL, reader, &sums[0]));
  WL_CHECK(pthread_create(&tids[1], NULL, reader, &sums[1]));
  WL_CHECK(pthread_create(&tids[2], NULL, writer, NULL));
  for (int i = 0; i < 3; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  printf("rwlock: %ld reads, %ld writes\n", 2 * reads, writes);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"rwlock\",\"locks\":{\"table_rwlock\":{\"read\":%ld,\"write\":%ld,"
            "\"acquisitions\":%ld}}}\n",
            2 * reads, writes, 2 * reads + writes);
  }
  return 0;
}
