/* numa_pinning [secs=0.5] [--truth]
 *
 * Binding over time. Three threads besides main (which never binds), each writing every
 * 8-byte word of its own 4 MiB malloc'd buffer (write_buffer) over and over, in two phases
 * of about secs/2 each (all threads start a phase together, at a barrier, and stop at its
 * deadline after their current pass; between the phases they wait at barriers while the
 * repinned thread re-pins and main measures the placement):
 *   unpinned (index 1): never calls an affinity or memory-policy function;
 *   pinned   (index 2): from its start, pthread_setaffinity_np(pthread_self()) to the last
 *                      CPU, then set_mempolicy(MPOL_BIND, {that CPU's node}); pinned in both
 *                      phases, its buffer on its node;
 *   repinned (index 3): sched_setaffinity(0, ...) to the first CPU at its start (its buffer
 *                      lands on that CPU's node), works; at the start of phase 2
 *                      sched_setaffinity(0, ...) to the last CPU, works again: on 2 nodes
 *                      its phase-1 accesses are local and its phase-2 accesses remote.
 * Each thread allocates its buffer after its first binding call, and touches it first in
 * phase 1.
 *
 * Truth: per thread its tid, role, buffer [lo, hi) and pages per node (measured after phase
 * 1 and at the end), the binding calls in time order (call, CPU or node set, monotonic time,
 * global order), and per phase: pinned or not, the CPU set, the node, the passes and word
 * writes, the CPU it was last seen on, and the expected local fraction of its accesses
 * (null when unpinned). The phase boundaries are in `phases` (CLOCK_MONOTONIC ns: start just
 * before main releases the threads, end when the last thread finished its last pass); the
 * re-pinning call lies between phase 1's end and phase 2's start.
 */
#include "numa_common.h"

#define USAGE "numa_pinning [secs=0.5] [--truth]"
#define NWORKERS 3
#define BUF_BYTES (4ul << 20)
#define WORDS (BUF_BYTES / sizeof(long))

enum { UNPINNED = 1, PINNED = 2, REPINNED = 3 };
static const char *role[NWORKERS + 1] = {"main", "unpinned", "pinned", "repinned"};

static pthread_barrier_t ready, go, mid, go2;
static uint64_t phase_end[2];  /* deadlines, set by main before `go` and `go2` */
static uint64_t phase_t[2][2]; /* [start, end) of each phase: main's clock before it starts,
                                  the last thread's clock after its last pass */

static struct {
  long *buf;
  long passes[2];
  int cpu_seen[2];
  uint64_t end_ns[2]; /* when its last pass of the phase ended */
  struct nm_place after_phase1, at_end;
} th[NWORKERS + 1];

/* Not inlined: one code site for every access. */
__attribute__((noinline)) static void write_buffer(long *b, size_t n, long v) {
  for (size_t k = 0; k < n; k++) b[k] = v;
}

static void work_until(int i, int phase, uint64_t deadline) {
  long p = 0;
  do write_buffer(th[i].buf, WORDS, p++);
  while (wl_now_ns() < deadline);
  th[i].passes[phase] = p;
  th[i].cpu_seen[phase] = sched_getcpu();
  th[i].end_ns[phase] = wl_now_ns();
}

static void *worker(void *arg) {
  int i = (int)(intptr_t)arg;
  nm_register_thread(i);
  if (i == PINNED) {
    nm_pin_pthread(i, nm_last_cpu());
    nm_set_mempolicy(i, MPOL_BIND, 1ul << nm_node_of_cpu(nm_last_cpu()));
  } else if (i == REPINNED) {
    nm_pin_sched(i, nm_first_cpu());
  }
  th[i].buf = malloc(BUF_BYTES);
  if (!th[i].buf) wl_die("malloc", ENOMEM);
  nm_barrier_wait(&ready);
  nm_barrier_wait(&go);
  work_until(i, 0, phase_end[0]);
  nm_barrier_wait(&mid);
  if (i == REPINNED) nm_pin_sched(i, nm_last_cpu());
  nm_barrier_wait(&go2);
  work_until(i, 1, phase_end[1]);
  return NULL;
}

/* The affinity of thread i in phase ph (0, 1) as designed: the CPU, or -1 if unpinned. */
static int designed_cpu(int i, int ph) {
  if (i == PINNED) return nm_last_cpu();
  if (i == REPINNED) return ph == 0 ? nm_first_cpu() : nm_last_cpu();
  return -1;
}

static void print_truth(double secs) {
  struct nm_json j;
  nm_json_begin(&j, "numa_pinning");
  FILE *f = j.f;
  fprintf(f,
          ",\"secs\":%g,\"buffer_bytes\":%lu,\"write_site\":\"write_buffer\",\"phases\":["
          "{\"phase\":1,\"start_ns\":%llu,\"end_ns\":%llu},"
          "{\"phase\":2,\"start_ns\":%llu,\"end_ns\":%llu}],\"thread_list\":[",
          secs, BUF_BYTES, (unsigned long long)phase_t[0][0], (unsigned long long)phase_t[0][1],
          (unsigned long long)phase_t[1][0], (unsigned long long)phase_t[1][1]);
  for (int i = 0; i <= NWORKERS; i++) {
    fprintf(f, "%s{\"index\":%d,\"tid\":%u,\"role\":\"%s\",\"bindings\":", i ? "," : "", i,
            nm_tids[i], role[i]);
    nm_json_bindings(f, i);
    if (i == 0) {
      fprintf(f, ",\"phases\":null}");
      continue;
    }
    uintptr_t lo = (uintptr_t)th[i].buf, hi = lo + BUF_BYTES;
    long pages = nm_pages(lo, hi);
    fprintf(f, ",\"buffer\":[%lu,%lu],\"pages\":%ld", (unsigned long)lo, (unsigned long)hi, pages);
    nm_json_place(f, "pages_per_node", &th[i].after_phase1);
    nm_json_place(f, "pages_per_node_at_end", &th[i].at_end);
    fprintf(f, ",\"phases\":[");
    for (int ph = 0; ph < 2; ph++) {
      int cpu = designed_cpu(i, ph), node = nm_node_of_cpu(cpu);
      fprintf(f, "%s{\"phase\":%d,\"pinned\":%s,\"cpus\":", ph ? "," : "", ph + 1,
              cpu >= 0 ? "true" : "false");
      if (cpu >= 0) {
        fprintf(f, "[%d],\"node\":%d", cpu, node);
      } else {
        fprintf(f, "[");
        for (int k = 0; k < nm_topo.ncpus; k++) fprintf(f, "%s%d", k ? "," : "", nm_topo.cpus[k]);
        fprintf(f, "],\"node\":null");
      }
      fprintf(f, ",\"mempolicy\":\"%s\",\"passes\":%ld,\"writes\":%ld,\"cpu_seen\":%d",
              i == PINNED ? "MPOL_BIND" : "MPOL_DEFAULT", th[i].passes[ph],
              th[i].passes[ph] * (long)WORDS, th[i].cpu_seen[ph]);
      const struct nm_place *p = &th[i].after_phase1;
      if (cpu >= 0 && p->ok)
        fprintf(f, ",\"local_fraction\":%.6f}",
                (double)p->bytes[node] / (double)(hi - lo - (uintptr_t)p->absent_bytes));
      else
        fprintf(f, ",\"local_fraction\":null}");
    }
    fprintf(f, "]}");
  }
  int stable = 1;
  for (int i = 1; i <= NWORKERS; i++) stable &= nm_same_place(&th[i].after_phase1, &th[i].at_end);
  fprintf(f, "],\"placement_stable\":%s", stable ? "true" : "false");
  nm_json_end(&j);
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  if (argc > 2) {
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
  }
  long ns = argc > 1 ? nm_arg_double_ns(argv[1], USAGE) : 500000000l;
  nm_init();
  WL_CHECK(pthread_barrier_init(&ready, NULL, NWORKERS + 1));
  WL_CHECK(pthread_barrier_init(&go, NULL, NWORKERS + 1));
  WL_CHECK(pthread_barrier_init(&mid, NULL, NWORKERS + 1));
  WL_CHECK(pthread_barrier_init(&go2, NULL, NWORKERS + 1));
  pthread_t t[NWORKERS + 1];
  for (int i = 1; i <= NWORKERS; i++)
    WL_CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i));
  nm_barrier_wait(&ready);
  uint64_t t0 = wl_now_ns();
  phase_end[0] = t0 + (uint64_t)ns / 2;
  phase_t[0][0] = t0;
  nm_barrier_wait(&go);
  nm_barrier_wait(&mid);
  for (int i = 1; i <= NWORKERS; i++)
    if (th[i].end_ns[0] > phase_t[0][1]) phase_t[0][1] = th[i].end_ns[0];
  /* Every buffer was first touched in phase 1. */
  for (int i = 1; i <= NWORKERS; i++)
    nm_placement(th[i].buf, (char *)th[i].buf + BUF_BYTES, &th[i].after_phase1);
  phase_end[1] = wl_now_ns() + (uint64_t)ns / 2;
  nm_barrier_wait(&go2); /* the repinned thread has re-pinned: its call is before phase 2 */
  phase_t[1][0] = wl_now_ns();
  for (int i = 1; i <= NWORKERS; i++) WL_CHECK(pthread_join(t[i], NULL));
  for (int i = 1; i <= NWORKERS; i++)
    if (th[i].end_ns[1] > phase_t[1][1]) phase_t[1][1] = th[i].end_ns[1];
  int bad = 0;
  for (int i = 1; i <= NWORKERS; i++) {
    nm_placement(th[i].buf, (char *)th[i].buf + BUF_BYTES, &th[i].at_end);
    if (th[i].buf[WORDS - 1] != th[i].passes[1] - 1) bad = 1;
  }
  double secs = (double)(phase_t[1][1] - t0) / 1e9; /* both phases and the pause between */
  printf("numa_pinning: 3 threads, 2 phases in %.3f s, %d node(s)%s\n", secs, nm_topo.nnodes,
         bad ? ", WRONG RESULT" : "");
  fflush(stdout);
  if (truth) print_truth((double)ns / 1e9);
  for (int i = 1; i <= NWORKERS; i++) free(th[i].buf);
  return bad;
}
