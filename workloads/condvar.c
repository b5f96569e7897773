/* condvar [rounds] [--truth]
 *
 * Two threads play ping-pong through one mutex (pingpong_lock) and one condition variable
 * (pingpong_cond): each waits for its turn, flips the turn and signals, `rounds` times.
 * Whether a thread has to call pthread_cond_wait depends on timing, so the program counts
 * its own calls; --truth prints them (explicit mutex locks, cond waits, signals).
 */
#include <pthread.h>

#include "common.h"

#define USAGE "condvar [rounds] [--truth]"

pthread_mutex_t pingpong_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t pingpong_cond = PTHREAD_COND_INITIALIZER;
static int turn; /* protected by pingpong_lock */
static long rounds;
static long lock_calls[2], wait_calls[2], signal_calls[2];

static void *player(void *arg) {
  int me = (int)(long)arg;
  for (long i = 0; i < rounds; i++) {
    WL_CHECK(pthread_mutex_lock(&pingpong_lock));
    lock_calls[me]++;
    while (turn != me) {
      WL_CHECK(pthread_cond_wait(&pingpong_cond, &pingpong_lock));
      wait_calls[me]++;
    }
    turn = 1 - me;
    WL_CHECK(pthread_cond_signal(&pingpong_cond));
    signal_calls[me]++;
    WL_CHECK(pthread_mutex_unlock(&pingpong_lock));
  }
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  rounds = argc > 1 ? wl_arg_long(argv[1], USAGE) : 20000;
  pthread_t tids[2];
  for (long i = 0; i < 2; i++) {
    WL_CHECK(pthread_create(&tids[i], NULL, player, (void *)i));
  }
  for (int i = 0; i < 2; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  printf("condvar: %ld rounds, %ld waits\n", rounds, wait_calls[0] + wait_calls[1]);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"condvar\",\"rounds\":%ld,\"mutex_lock_calls\":%ld,"
            "\"cond_waits\":%ld,\"cond_signals\":%ld}\n",
            rounds, lock_calls[0] + lock_calls[1], wait_calls[0] + wait_calls[1],
            signal_calls[0] + signal_calls[1]);
  }
  return 0;
}
