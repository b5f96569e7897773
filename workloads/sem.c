/* sem [items] [--truth]
 *
 * A producer posts `items` times on items_sem, a consumer sem_waits `items` times. Exact
 * counts: `items` sem_post and `items` sem_wait calls on items_sem.
 */
#include <pthread.h>
#include <semaphore.h>

#include "common.h"

#define USAGE "sem [items] [--truth]"

sem_t items_sem;
static long items;

static void *producer(void *arg) {
  (void)arg;
  for (long i = 0; i < items; i++) {
    if (sem_post(&items_sem) != 0) {
      wl_die("sem_post", errno);
    }
  }
  return NULL;
}

static void *consumer(void *arg) {
  (void)arg;
  for (long i = 0; i < items; i++) {
    while (sem_wait(&items_sem) != 0) {
      if (errno != EINTR) {
        wl_die("sem_wait", errno);
      }
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  items = argc > 1 ? wl_arg_long(argv[1], USAGE) : 100000;
  if (sem_init(&items_sem, 0, 0) != 0) {
    wl_die("sem_init", errno);
  }
  pthread_t tids[2];
  WL_CHECK(pthread_create(&tids[0], NULL, consumer, NULL));
  WL_CHECK(pthread_create(&tids[1], NULL, producer, NULL));
  for (int i = 0; i < 2; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  sem_destroy(&items_sem);
  printf("sem: %ld items\n", items);
  if (truth) {
    fprintf(stderr, "{\"workload\":\"sem\",\"sem_wait\":%ld,\"sem_post\":%ld}\n", items, items);
  }
  return 0;
}
