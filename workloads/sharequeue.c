/* sharequeue [1|2] [threads] [items] [--truth]
 *
 * The shared queue of Venter's thesis: half the threads enqueue, half dequeue, on a linked
 * list. Variant 1 protects the whole queue with one mutex (queue_lock); variant 2 is the
 * Michael & Scott two-lock queue (head_lock for dequeuers, tail_lock for enqueuers), so
 * producers and consumers no longer wait for each other and the total lock wait drops.
 *
 * Each critical section does a little fixed work so that contention is visible. Consumers
 * that find the queue empty unlock, yield and retry; those retries are real acquisitions
 * and are counted, so the truth (the program's own count of lock calls per lock) is exact.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "common.h"

#define USAGE "sharequeue [1|2] [threads>=2] [items] [--truth]"
#define CS_WORK 200

struct node {
  _Atomic(struct node *) next;
  long value;
};

/* Statically allocated and global so that locus can name them from the symbol table. */
pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t head_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t tail_lock = PTHREAD_MUTEX_INITIALIZER;

static struct node *head; /* dummy node: the first real item is head->next */
static struct node *tail;
static int variant;
static long items_per_producer;
static long total_items;
static atomic_long consumed;
static atomic_long count_queue, count_head, count_tail;
static atomic_long checksum;

/* Fixed work inside a critical section; volatile so the compiler keeps it. */
static void cs_work(void) {
  volatile unsigned x = 0;
  for (int i = 0; i < CS_WORK; i++) {
    x += (unsigned)i;
  }
}

static void enqueue(struct node *n) {
  pthread_mutex_t *m = variant == 1 ? &queue_lock : &tail_lock;
  WL_CHECK(pthread_mutex_lock(m));
  atomic_fetch_add_explicit(variant == 1 ? &count_queue : &count_tail, 1, memory_order_relaxed);
  cs_work();
  atomic_store_explicit(&tail->next, n, memory_order_release);
  tail = n;
  WL_CHECK(pthread_mutex_unlock(m));
}

/* Returns 0 if the queue was empty. */
static int dequeue(long *value) {
  pthread_mutex_t *m = variant == 1 ? &queue_lock : &head_lock;
  WL_CHECK(pthread_mutex_lock(m));
  atomic_fetch_add_explicit(variant == 1 ? &count_queue : &count_head, 1, memory_order_relaxed);
  cs_work();
  struct node *old = head;
  struct node *first = atomic_load_explicit(&old->next, memory_order_acquire);
  if (first == NULL) {
    WL_CHECK(pthread_mutex_unlock(m));
    return 0;
  }
  *value = first->value;
  head = first;
  WL_CHECK(pthread_mutex_unlock(m));
  free(old);
  return 1;
}

static void *producer(void *arg) {
  long base = (long)arg * items_per_producer;
  for (long i = 0; i < items_per_producer; i++) {
    struct node *n = malloc(sizeof *n);
    if (n == NULL) {
      wl_die("malloc", ENOMEM);
    }
    atomic_init(&n->next, NULL);
    n->value = base + i;
    enqueue(n);
  }
  return NULL;
}

static void *consumer(void *arg) {
  (void)arg;
  long sum = 0, value;
  while (atomic_load(&consumed) < total_items) {
    if (dequeue(&value)) {
      sum += value;
      atomic_fetch_add(&consumed, 1);
    } else {
      sched_yield();
    }
  }
  atomic_fetch_add(&checksum, sum);
  return NULL;
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  variant = argc > 1 ? (int)wl_arg_long(argv[1], USAGE) : 1;
  long threads = argc > 2 ? wl_arg_long(argv[2], USAGE) : 4;
  long items = argc > 3 ? wl_arg_long(argv[3], USAGE) : 200000;
  if ((variant != 1 && variant != 2) || threads < 2) {
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
  }
  long producers = threads / 2, consumers = threads - producers;
  items_per_producer = items / producers;
  total_items = items_per_producer * producers;

  head = tail = calloc(1, sizeof *head);
  pthread_t tids[threads];
  for (long i = 0; i < threads; i++) {
    void *(*fn)(void *) = i < producers ? producer : consumer;
    WL_CHECK(pthread_create(&tids[i], NULL, fn, (void *)(i < producers ? i : i - producers)));
  }
  for (long i = 0; i < threads; i++) {
    WL_CHECK(pthread_join(tids[i], NULL));
  }
  free(head);

  long n = total_items;
  if (atomic_load(&checksum) != n * (n - 1) / 2) {
    fprintf(stderr, "sharequeue: checksum mismatch, the queue lost items\n");
    return 1;
  }
  printf("sharequeue: variant %d, %ld producers, %ld consumers, %ld items\n", variant, producers,
         consumers, total_items);
  if (truth) {
    if (variant == 1) {
      fprintf(stderr,
              "{\"workload\":\"sharequeue\",\"variant\":1,\"threads\":%ld,\"items\":%ld,"
              "\"locks\":{\"queue_lock\":%ld}}\n",
              threads, total_items, atomic_load(&count_queue));
    } else {
      fprintf(stderr,
              "{\"workload\":\"sharequeue\",\"variant\":2,\"threads\":%ld,\"items\":%ld,"
              "\"locks\":{\"head_lock\":%ld,\"tail_lock\":%ld}}\n",
              threads, total_items, atomic_load(&count_head), atomic_load(&count_tail));
    }
  }
  return 0;
}
