/* numa_hydro [threads=2] [mb=32] [--iters N=5] [--truth]
 *
 * Initialisation order differs from access order (NUMAPROF's Hydro case). The main thread
 * allocates `threads` arrays of doubles with malloc, mb / threads MiB each (large: glibc
 * mmaps every one, and only the page holding the chunk header is touched by malloc), and
 * starts `threads` workers, each pinned with pthread_setaffinity_np to one CPU, round-robin
 * over the nodes (on the 2-node guest worker 0 on node 0, worker 1 on node 1). Worker i
 * initialises array i (init_array: its first touch puts the pages on worker i's node); after
 * a barrier it computes `iters` times on array (i + 1) mod threads (compute_array: reads and
 * writes every element). On 2 nodes with 2 workers every compute access is remote; with one
 * worker, or on 1 node, all are local.
 *
 * Truth: the threads (index 0 = main, worker i = index i + 1: tid, CPU, node, binding calls),
 * per array its range, pages, first touches (main in malloc for the pages present right
 * after malloc, measured; the initialiser in init_array for the rest), initialiser and user
 * (worker index, tid, node), the pages per node measured with move_pages after the init
 * phase and after the compute phase, the user's reads and writes and the expected local and
 * remote pages and local fraction of them; and the compute-phase access matrix (accesses by
 * thread node x memory node). Exit status 1 if an array does not hold the expected values.
 */
#include "numa_common.h"

#define USAGE "numa_hydro [threads=2] [mb=32] [--iters N] [--truth]"

static long nthreads, iters;
static size_t array_bytes, nelem;
static double *arrays[NM_MAX_THREADS];
static pthread_barrier_t init_done, placed;
static double checksum[NM_MAX_THREADS];
static struct nm_place at_malloc[NM_MAX_THREADS], after_init[NM_MAX_THREADS],
    after_compute[NM_MAX_THREADS];

/* Not inlined: the first touches have one code site, the accesses another. */
__attribute__((noinline)) static void init_array(double *a, size_t n) {
  for (size_t k = 0; k < n; k++) a[k] = 1.0;
}

__attribute__((noinline)) static double compute_array(double *a, size_t n) {
  double s = 0;
  for (size_t k = 0; k < n; k++) {
    a[k] = a[k] * 0.5 + 1.0;
    s += a[k];
  }
  return s;
}

static long user_of(long a) { return (a + nthreads - 1) % nthreads; } /* worker using array a */
static long used_by(long i) { return (i + 1) % nthreads; }            /* array worker i uses */

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  nm_register_thread(i + 1);
  nm_pin_pthread(i + 1, nm_worker_cpu(i));
  init_array(arrays[i], nelem);
  nm_barrier_wait(&init_done);
  nm_barrier_wait(&placed); /* main measured the placement in between */
  double s = 0;
  for (long it = 0; it < iters; it++) s = compute_array(arrays[used_by(i)], nelem);
  checksum[i] = s;
  return NULL;
}

static void print_truth(long mb, double init_s, double compute_s) {
  struct nm_json j;
  nm_json_begin(&j, "numa_hydro");
  FILE *f = j.f;
  fprintf(f,
          ",\"threads\":%ld,\"mb\":%ld,\"iters\":%ld,\"array_bytes\":%zu,\"element_size\":%zu,"
          "\"elements\":%zu,\"init_site\":\"init_array\",\"compute_site\":\"compute_array\","
          "\"init_seconds\":%.6f,\"compute_seconds\":%.6f,\"thread_list\":[",
          nthreads, mb, iters, array_bytes, sizeof(double), nelem, init_s, compute_s);
  fprintf(f,
          "{\"index\":0,\"tid\":%u,\"role\":\"main\",\"pinned\":false,\"cpu\":null,"
          "\"node\":null,\"bindings\":",
          nm_tids[0]);
  nm_json_bindings(f, 0);
  fprintf(f, "}");
  for (int i = 0; i < nthreads; i++) {
    int cpu = nm_worker_cpu(i);
    fprintf(f,
            ",{\"index\":%d,\"tid\":%u,\"role\":\"worker\",\"worker\":%d,\"pinned\":true,"
            "\"cpu\":%d,\"node\":%d,\"init_array\":%d,\"uses_array\":%ld,\"bindings\":",
            i + 1, nm_tids[i + 1], i, cpu, nm_node_of_cpu(cpu), i, used_by(i));
    nm_json_bindings(f, i + 1);
    fprintf(f, "}");
  }
  fprintf(f, "],\"arrays\":[");
  static long matrix[NM_MAX_NODES][NM_MAX_NODES];
  for (int a = 0; a < nthreads; a++) {
    uintptr_t lo = (uintptr_t)arrays[a], hi = lo + array_bytes;
    long pages = nm_pages(lo, hi);
    long by_malloc = at_malloc[a].ok ? nm_present(&at_malloc[a]) : 0;
    long u = user_of(a);
    int init_node = nm_node_of_cpu(nm_worker_cpu(a)), user_node = nm_node_of_cpu(nm_worker_cpu(u));
    fprintf(f,
            "%s{\"index\":%d,\"lo\":%lu,\"hi\":%lu,\"pages\":%ld,\"init_worker\":%d,"
            "\"init_tid\":%u,\"init_node\":%d,\"user_worker\":%ld,\"user_tid\":%u,"
            "\"user_node\":%d,\"reads\":%ld,\"writes\":%ld,\"first_touch\":[",
            a ? "," : "", a, (unsigned long)lo, (unsigned long)hi, pages, a, nm_tids[a + 1],
            init_node, u, nm_tids[u + 1], user_node, iters * (long)nelem, iters * (long)nelem);
    if (by_malloc)
      fprintf(f, "{\"tid\":%u,\"thread\":0,\"site\":\"malloc\",\"pages\":%ld}%s", nm_tids[0],
              by_malloc, by_malloc < pages ? "," : "");
    if (by_malloc < pages)
      fprintf(f, "{\"tid\":%u,\"thread\":%d,\"site\":\"init_array\",\"pages\":%ld}", nm_tids[a + 1],
              a + 1, pages - by_malloc);
    fprintf(f, "]");
    const struct nm_place *p = &after_init[a];
    nm_json_place(f, "pages_per_node", p);
    fprintf(f, ",\"bytes_per_node\":");
    nm_json_counts(f, p, 1);
    nm_json_place(f, "pages_per_node_after_compute", &after_compute[a]);
    if (p->ok) {
      long local = p->pages[user_node];
      fprintf(f,
              ",\"user_local_pages\":%ld,\"user_remote_pages\":%ld,\"user_local_fraction\":%.6f}",
              local, pages - local - p->absent, (double)p->bytes[user_node] / (double)array_bytes);
      for (int n = 0; n < NM_MAX_NODES; n++)
        matrix[user_node][n] += 2 * iters * (p->bytes[n] / (long)sizeof(double));
    } else {
      fprintf(f,
              ",\"user_local_pages\":null,\"user_remote_pages\":null,"
              "\"user_local_fraction\":null}");
    }
  }
  int stable = 1;
  for (int a = 0; a < nthreads; a++) stable &= nm_same_place(&after_init[a], &after_compute[a]);
  fprintf(f, "],\"placement_stable\":%s,\"compute_matrix\":", stable ? "true" : "false");
  nm_json_matrix(f, matrix);
  nm_json_end(&j);
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  const char *it = nm_take_option(&argc, argv, "--iters", USAGE);
  if (argc > 3) {
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
  }
  nthreads = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long mb = argc > 2 ? wl_arg_long(argv[2], USAGE) : 32;
  iters = it ? wl_arg_long(it, USAGE) : 5;
  /* At least 256 KiB per array, so that glibc mmaps each (its threshold starts at 128 KiB). */
  if (nthreads > NM_MAX_THREADS - 1 || mb > 65536 ||
      ((size_t)mb << 20) / (size_t)nthreads < (256u << 10)) {
    fprintf(stderr, "numa_hydro: at most %d threads, 65536 MiB, and 256 KiB per thread\n",
            NM_MAX_THREADS - 1);
    return 2;
  }
  nm_init();
  array_bytes = (((size_t)mb << 20) / (size_t)nthreads) & ~(sizeof(double) - 1);
  nelem = array_bytes / sizeof(double);
  for (long a = 0; a < nthreads; a++) {
    arrays[a] = malloc(array_bytes);
    if (!arrays[a]) wl_die("malloc", ENOMEM);
  }
  for (long a = 0; a < nthreads; a++)
    nm_placement(arrays[a], (char *)arrays[a] + array_bytes, &at_malloc[a]);

  WL_CHECK(pthread_barrier_init(&init_done, NULL, (unsigned)nthreads + 1));
  WL_CHECK(pthread_barrier_init(&placed, NULL, (unsigned)nthreads + 1));
  pthread_t t[NM_MAX_THREADS];
  uint64_t t0 = wl_now_ns();
  for (long i = 0; i < nthreads; i++)
    WL_CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i));
  nm_barrier_wait(&init_done);
  uint64_t t1 = wl_now_ns();
  for (long a = 0; a < nthreads; a++)
    nm_placement(arrays[a], (char *)arrays[a] + array_bytes, &after_init[a]);
  uint64_t t2 = wl_now_ns();
  nm_barrier_wait(&placed);
  for (long i = 0; i < nthreads; i++) WL_CHECK(pthread_join(t[i], NULL));
  uint64_t t3 = wl_now_ns();
  for (long a = 0; a < nthreads; a++)
    nm_placement(arrays[a], (char *)arrays[a] + array_bytes, &after_compute[a]);

  int bad = 0;
  double x = 1.0;
  for (long k = 0; k < iters; k++) x = x * 0.5 + 1.0;
  for (long i = 0; i < nthreads; i++) {
    double want = x * (double)nelem;
    if (checksum[i] < want * (1 - 1e-9) || checksum[i] > want * (1 + 1e-9)) bad = 1;
  }
  double init_s = (double)(t1 - t0) / 1e9, compute_s = (double)(t3 - t2) / 1e9;
  printf("numa_hydro: %ld threads, %ld MiB, init in %.3f s, %ld iters in %.3f s, %d node(s)%s\n",
         nthreads, mb, init_s, iters, compute_s, nm_topo.nnodes, bad ? ", WRONG RESULT" : "");
  fflush(stdout);
  if (truth) print_truth(mb, init_s, compute_s);
  for (long a = 0; a < nthreads; a++) free(arrays[a]);
  return bad;
}
