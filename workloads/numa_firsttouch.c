/* numa_firsttouch [threads=2] [mb=64] [--init serial|parallel] [--iters N=5] [--thp] [--truth]
 *
 * First touch (NUMAPROF's motivating case). The main thread allocates one array of `mb` MiB
 * of doubles with malloc (large, so glibc mmaps it: only the page holding malloc's chunk
 * header is touched before the program writes the array) and starts `threads` workers, each
 * pinned with pthread_setaffinity_np to one CPU, round-robin over the nodes (worker i on
 * node i mod nodes when the nodes have as many CPUs; on the 2-node guest worker 0 is on
 * node 0, worker 1 on node 1). The array is split into one contiguous chunk per worker
 * (static schedule; the chunk boundaries are page boundaries, so no page is in two chunks).
 *
 * Init phase, in init_chunk(): `serial` (default): worker 0 writes the whole array;
 * `parallel`: each worker writes its own chunk. Compute phase, in compute_chunk(): every
 * worker reads and writes each element of its own chunk `iters` times.
 *
 * Under the default memory policy a page lands on the node of the thread that touches it
 * first: serial puts the whole array on worker 0's node, so on 2 nodes the worker on node 1
 * makes only remote accesses; parallel puts every chunk on its worker's node: all local.
 *
 * Truth (--truth): the threads (index 0 = main, then worker i = index i + 1: tid, CPU,
 * node, binding calls), the array [lo, hi), per chunk its range, pages, the first touches
 * (main in malloc for the pages already present right after malloc, measured; the
 * initialiser in init_chunk for the rest), the pages per node measured with move_pages
 * after the init phase and again after the compute phase (automatic NUMA balancing could
 * have moved some; `numa_balancing` says whether it is on); per worker its node, its
 * chunk's pages and bytes per node, the element reads and writes of the compute phase and
 * the expected local fraction of them; and the compute-phase access matrix (accesses by
 * thread node x memory node). Exit status 1 if a chunk does not hold the expected values.
 *
 * --thp: the array may use transparent huge pages (THP is disabled otherwise, so that page
 * counts do not depend on the kernel's mood): madvise(MADV_HUGEPAGE) right after malloc.
 * The truth then gives `huge_pages`, the 2 MiB-aligned blocks inside the array's whole pages
 * (each first-touched as one huge page), and `anon_huge_kb` after the init phase
 * (/proc/self/smaps: what the kernel really backed with huge pages).
 */
#include "numa_common.h"

#define USAGE \
  "numa_firsttouch [threads=2] [mb=64] [--init serial|parallel] [--iters N] [--thp] [--truth]"

static double *array;
static long nthreads, iters;
static int parallel_init, thp;
static long huge_pages, anon_huge_kb = -1;
static size_t bound[NM_MAX_THREADS + 1]; /* chunk c = elements [bound[c], bound[c + 1]) */
static pthread_barrier_t init_done, placed;
static double checksum[NM_MAX_THREADS];

/* Not inlined: the first touches have one code site, the accesses another. */
__attribute__((noinline)) static void init_chunk(double *a, size_t n) {
  for (size_t k = 0; k < n; k++) a[k] = 1.0;
}

__attribute__((noinline)) static double compute_chunk(double *a, size_t n) {
  double s = 0;
  for (size_t k = 0; k < n; k++) {
    a[k] = a[k] * 0.5 + 1.0;
    s += a[k];
  }
  return s;
}

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  nm_register_thread(i + 1);
  nm_pin_pthread(i + 1, nm_worker_cpu(i));
  if (parallel_init)
    init_chunk(array + bound[i], bound[i + 1] - bound[i]);
  else if (i == 0)
    init_chunk(array, bound[nthreads]);
  nm_barrier_wait(&init_done);
  nm_barrier_wait(&placed); /* main measured the placement in between */
  double s = 0;
  for (long it = 0; it < iters; it++) s = compute_chunk(array + bound[i], bound[i + 1] - bound[i]);
  checksum[i] = s;
  return NULL;
}

static struct nm_place at_malloc[NM_MAX_THREADS], after_init[NM_MAX_THREADS],
    after_compute[NM_MAX_THREADS];

static uintptr_t chunk_lo(int c) { return (uintptr_t)(array + bound[c]); }
static uintptr_t chunk_hi(int c) { return (uintptr_t)(array + bound[c + 1]); }

static void print_truth(long mb, double init_s, double compute_s) {
  struct nm_json j;
  nm_json_begin(&j, "numa_firsttouch");
  FILE *f = j.f;
  uintptr_t lo = chunk_lo(0), hi = chunk_hi((int)nthreads - 1);
  fprintf(f,
          ",\"threads\":%ld,\"mb\":%ld,\"init\":\"%s\",\"iters\":%ld,\"array\":[%lu,%lu],"
          "\"bytes\":%lu,\"element_size\":%zu,\"elements\":%zu,\"pages\":%ld,"
          "\"init_site\":\"init_chunk\",\"compute_site\":\"compute_chunk\","
          "\"init_seconds\":%.6f,\"compute_seconds\":%.6f,\"thp\":%s,\"huge_pages\":%ld,"
          "\"anon_huge_kb\":%ld,\"thread_list\":[",
          nthreads, mb, parallel_init ? "parallel" : "serial", iters, (unsigned long)lo,
          (unsigned long)hi, (unsigned long)(hi - lo), sizeof(double), bound[nthreads],
          nm_pages(lo, hi), init_s, compute_s, thp ? "true" : "false", huge_pages, anon_huge_kb);
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
            "\"cpu\":%d,\"node\":%d,\"bindings\":",
            i + 1, nm_tids[i + 1], i, cpu, nm_node_of_cpu(cpu));
    nm_json_bindings(f, i + 1);
    fprintf(f, "}");
  }
  fprintf(f, "],\"chunks\":[");
  for (int c = 0; c < nthreads; c++) {
    int init_thread = parallel_init ? c + 1 : 1;
    long pages = nm_pages(chunk_lo(c), chunk_hi(c));
    long by_malloc = at_malloc[c].ok ? nm_present(&at_malloc[c]) : 0;
    fprintf(f,
            "%s{\"index\":%d,\"lo\":%lu,\"hi\":%lu,\"elements\":%zu,\"pages\":%ld,"
            "\"init_tid\":%u,\"init_worker\":%d,\"first_touch\":[",
            c ? "," : "", c, (unsigned long)chunk_lo(c), (unsigned long)chunk_hi(c),
            bound[c + 1] - bound[c], pages, nm_tids[init_thread], init_thread - 1);
    if (by_malloc)
      fprintf(f, "{\"tid\":%u,\"thread\":0,\"site\":\"malloc\",\"pages\":%ld}%s", nm_tids[0],
              by_malloc, by_malloc < pages ? "," : "");
    if (by_malloc < pages)
      fprintf(f, "{\"tid\":%u,\"thread\":%d,\"site\":\"init_chunk\",\"pages\":%ld}",
              nm_tids[init_thread], init_thread, pages - by_malloc);
    fprintf(f, "]");
    nm_json_place(f, "pages_per_node", &after_init[c]);
    fprintf(f, ",\"bytes_per_node\":");
    nm_json_counts(f, &after_init[c], 1);
    nm_json_place(f, "pages_per_node_after_compute", &after_compute[c]);
    fprintf(f, "}");
  }
  fprintf(f, "],\"workers\":[");
  /* Accesses of the compute phase: a read and a write of every element, iters times. */
  static long matrix[NM_MAX_NODES][NM_MAX_NODES];
  for (int i = 0; i < nthreads; i++) {
    int node = nm_node_of_cpu(nm_worker_cpu(i));
    const struct nm_place *p = &after_init[i];
    long pages = nm_pages(chunk_lo(i), chunk_hi(i));
    long bytes = (long)(chunk_hi(i) - chunk_lo(i));
    long elems = (long)(bound[i + 1] - bound[i]);
    fprintf(f,
            "%s{\"index\":%d,\"tid\":%u,\"cpu\":%d,\"node\":%d,\"chunk\":%d,\"reads\":%ld,"
            "\"writes\":%ld",
            i ? "," : "", i, nm_tids[i + 1], nm_worker_cpu(i), node, i, iters * elems,
            iters * elems);
    nm_json_place(f, "pages_per_node", p);
    fprintf(f, ",\"bytes_per_node\":");
    nm_json_counts(f, p, 1);
    if (p->ok) {
      long local = p->pages[node], local_bytes = p->bytes[node];
      fprintf(f, ",\"local_pages\":%ld,\"remote_pages\":%ld,\"local_fraction\":%.6f}", local,
              pages - local - p->absent, (double)local_bytes / (double)bytes);
      for (int n = 0; n < NM_MAX_NODES; n++)
        matrix[node][n] += 2 * iters * (p->bytes[n] / (long)sizeof(double));
    } else {
      fprintf(f, ",\"local_pages\":null,\"remote_pages\":null,\"local_fraction\":null}");
    }
  }
  int stable = 1;
  for (int c = 0; c < nthreads; c++) stable &= nm_same_place(&after_init[c], &after_compute[c]);
  fprintf(f, "],\"placement_stable\":%s,\"compute_matrix\":", stable ? "true" : "false");
  nm_json_matrix(f, matrix);
  nm_json_end(&j);
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--thp") == 0) {
      thp = 1;
      for (int k = i; k < argc; k++) argv[k] = argv[k + 1];
      argc--;
      break;
    }
  const char *init = nm_take_option(&argc, argv, "--init", USAGE);
  const char *it = nm_take_option(&argc, argv, "--iters", USAGE);
  if (argc > 3 || (init && strcmp(init, "serial") != 0 && strcmp(init, "parallel") != 0)) {
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
  }
  nthreads = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long mb = argc > 2 ? wl_arg_long(argv[2], USAGE) : 64;
  iters = it ? wl_arg_long(it, USAGE) : 5;
  parallel_init = init && strcmp(init, "parallel") == 0;
  if (nthreads > NM_MAX_THREADS - 1 || mb > 65536) {
    fprintf(stderr, "numa_firsttouch: at most %d threads and 65536 MiB\n", NM_MAX_THREADS - 1);
    return 2;
  }
  nm_init();
  size_t bytes = (size_t)mb << 20, nelem = bytes / sizeof(double);
  if (bytes / (size_t)nthreads < 4 * (size_t)nm_topo.page_size) {
    fprintf(stderr, "numa_firsttouch: at least 4 pages per thread\n");
    return 2;
  }
  array = malloc(bytes);
  if (!array) wl_die("malloc", ENOMEM);
  if (thp) {
    const uintptr_t hp = 2ul << 20;
    uintptr_t a = nm_page_up((uintptr_t)array), b = nm_page_down((uintptr_t)array + bytes);
    prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0);
    nm_topo.thp_disabled = 0;
    if (madvise((void *)a, b - a, MADV_HUGEPAGE) != 0) wl_die("madvise", errno);
    uintptr_t ha = (a + hp - 1) & ~(hp - 1), hb = b & ~(hp - 1);
    huge_pages = hb > ha ? (long)((hb - ha) / hp) : 0;
  }
  /* Chunk boundaries: the static split rounded down to a page boundary. */
  uintptr_t lo = (uintptr_t)array;
  bound[0] = 0;
  bound[nthreads] = nelem;
  for (long c = 1; c < nthreads; c++)
    bound[c] = (nm_page_down(lo + (uintptr_t)c * (bytes / (size_t)nthreads)) - lo) / sizeof(double);
  for (int c = 0; c < nthreads; c++)
    nm_placement((void *)chunk_lo(c), (void *)chunk_hi(c), &at_malloc[c]);

  WL_CHECK(pthread_barrier_init(&init_done, NULL, (unsigned)nthreads + 1));
  WL_CHECK(pthread_barrier_init(&placed, NULL, (unsigned)nthreads + 1));
  pthread_t t[NM_MAX_THREADS];
  uint64_t t0 = wl_now_ns();
  for (long i = 0; i < nthreads; i++)
    WL_CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i));
  nm_barrier_wait(&init_done);
  uint64_t t1 = wl_now_ns();
  if (thp) anon_huge_kb = nm_anon_huge_kb((uintptr_t)array, (uintptr_t)array + bytes);
  for (int c = 0; c < nthreads; c++)
    nm_placement((void *)chunk_lo(c), (void *)chunk_hi(c), &after_init[c]);
  uint64_t t2 = wl_now_ns();
  nm_barrier_wait(&placed);
  for (long i = 0; i < nthreads; i++) WL_CHECK(pthread_join(t[i], NULL));
  uint64_t t3 = wl_now_ns();
  for (int c = 0; c < nthreads; c++)
    nm_placement((void *)chunk_lo(c), (void *)chunk_hi(c), &after_compute[c]);

  /* Every element goes 1 -> 1.5 -> 1.75 -> ...: x_k = 2 - 2^-k. */
  int bad = 0;
  double x = 1.0;
  for (long k = 0; k < iters; k++) x = x * 0.5 + 1.0;
  for (int i = 0; i < nthreads; i++) {
    double want = x * (double)(bound[i + 1] - bound[i]);
    if (checksum[i] < want * (1 - 1e-9) || checksum[i] > want * (1 + 1e-9)) bad = 1;
  }
  double init_s = (double)(t1 - t0) / 1e9, compute_s = (double)(t3 - t2) / 1e9;
  printf(
      "numa_firsttouch: %ld threads, %ld MiB, %s init in %.3f s, %ld iters in %.3f s, "
      "%d node(s)%s\n",
      nthreads, mb, parallel_init ? "parallel" : "serial", init_s, iters, compute_s, nm_topo.nnodes,
      bad ? ", WRONG RESULT" : "");
  fflush(stdout);
  if (truth) print_truth(mb, init_s, compute_s);
  free(array);
  return bad;
}
