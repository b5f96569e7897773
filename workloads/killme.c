/* killme [rate_hz] [threads]
 *
 * Locks killme_lock in a loop forever, each of `threads` threads about `rate_hz` times per
 * second (lock, unlock, sleep 1/rate_hz), until it is killed. Announces itself on stderr
 * with one line "killme: pid <pid> ready" once every thread has locked at least once, so a
 * test knows whom to kill and that there is something to report.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

#define USAGE "killme [rate_hz] [threads]"

pthread_mutex_t killme_lock = PTHREAD_MUTEX_INITIALIZER;
static long period_ns;
static atomic_long started;

static void *worker(void *arg) {
  (void)arg;
  uint64_t next = wl_now_ns();
  for (int first = 1;; first = 0) {
    WL_CHECK(pthread_mutex_lock(&killme_lock));
    WL_CHECK(pthread_mutex_unlock(&killme_lock));
    if (first) {
      atomic_fetch_add(&started, 1);
    }
    next += (uint64_t)period_ns;
    wl_sleep_until_ns(next);
  }
  return NULL;
}

int main(int argc, char **argv) {
  long rate = argc > 1 ? wl_arg_long(argv[1], USAGE) : 1000;
  long threads = argc > 2 ? wl_arg_long(argv[2], USAGE) : 2;
  period_ns = 1000000000L / rate;
  pthread_t tid;
  for (long i = 0; i < threads; i++) {
    WL_CHECK(pthread_create(&tid, NULL, worker, NULL));
  }
  while (atomic_load(&started) < threads) {
    wl_sleep_until_ns(wl_now_ns() + 1000000);
  }
  fprintf(stderr, "killme: pid %d ready\n", (int)getpid());
  for (;;) {
    pause();
  }
}
