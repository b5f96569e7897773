/* numa_policy [mb=16] [--target NODE] [--passes N] [--truth]
 *
 * Explicit placement. Three regions of `mb` MiB, each its own anonymous mmap, handled by one
 * "toucher" thread pinned (pthread_setaffinity_np) to the first CPU of the first node:
 *   bind_last:  mbind(MPOL_BIND, {last node}), then written by the toucher (touch_region):
 *               every page lands on the last node, remote to the toucher on 2 nodes;
 *   interleave: mbind(MPOL_INTERLEAVE, {all nodes}), then written: pages alternate over
 *               the nodes (per node: pages / nodes, +-1);
 *   moved:      written by the toucher (first touch: the first node), then move_pages of
 *               every page to the last node (MPOL_MF_MOVE).
 * Then the toucher reads every region `passes` (--passes, default 2) times (read_region), so each
 * region's accesses are local or remote as its pages are. "Last node" and "all nodes" are among the
 * nodes with CPUs: with 1 node the policies still apply, to node 0, and everything is local.
 * --target NODE replaces the last node as the target of bind_last and moved: any node, also
 * one without CPUs (HBM, CXL memory: the numa lens's memory-only classes).
 *
 * Truth: per region the range [lo, hi), pages, the policy (what call, mode, node set, the
 * mode get_mempolicy(MPOL_F_ADDR) reports afterwards), the expected placement, the pages per
 * node measured with move_pages before the reads (for `moved` also before the move, and the
 * move's result: moved_pages = pages on the target node afterwards) and after them,
 * the toucher (tid, CPU, node), and the local and remote pages of its reads; the toucher's
 * binding calls (its pinning and the two mbinds) in time order.
 */
#include "numa_common.h"

#define USAGE "numa_policy [mb=16] [--target NODE] [--passes N] [--truth]"
#define NREGIONS 3

enum { BIND_LAST, INTERLEAVE, MOVED };
static const char *region_name[NREGIONS] = {"bind_last", "interleave", "moved"};

static struct {
  char *lo;
  size_t len;
  int mbind_rc;           /* BIND_LAST, INTERLEAVE: 0 or errno */
  int mode;               /* the policy asked for (MOVED: default) */
  unsigned long nodes;    /* its node set */
  int policy_seen;        /* get_mempolicy(MPOL_F_ADDR) afterwards, -1 unknown */
  struct nm_place before; /* MOVED: before the move */
  struct nm_place move;   /* MOVED: the move's per-page result */
  struct nm_place after;  /* measured after the placement */
  struct nm_place at_end; /* measured after the reads */
  long sum;
} region[NREGIONS];

static int toucher_cpu;
static int target = -1; /* --target, else the last node with CPUs */
static long PASSES = 2; /* --passes: reads of every region */

/* Not inlined: the first touches and the reads each have one code site. */
__attribute__((noinline)) static void touch_region(char *p, size_t len, char v) {
  for (size_t k = 0; k < len; k += 64) p[k] = v;
}

__attribute__((noinline)) static long read_region(const char *p, size_t len) {
  long s = 0;
  for (size_t k = 0; k < len; k += 64) s += *(const volatile char *)(p + k);
  return s;
}

static void *toucher(void *arg) {
  (void)arg;
  nm_register_thread(1);
  nm_pin_pthread(1, toucher_cpu);
  unsigned long last = 1ul << target;
  region[BIND_LAST].mode = MPOL_BIND;
  region[BIND_LAST].nodes = last;
  region[BIND_LAST].mbind_rc =
      nm_mbind(1, region[BIND_LAST].lo, region[BIND_LAST].len, MPOL_BIND, last);
  touch_region(region[BIND_LAST].lo, region[BIND_LAST].len, 1);

  region[INTERLEAVE].mode = MPOL_INTERLEAVE;
  region[INTERLEAVE].nodes = nm_all_nodes_mask();
  region[INTERLEAVE].mbind_rc = nm_mbind(1, region[INTERLEAVE].lo, region[INTERLEAVE].len,
                                         MPOL_INTERLEAVE, nm_all_nodes_mask());
  touch_region(region[INTERLEAVE].lo, region[INTERLEAVE].len, 2);

  region[MOVED].mode = MPOL_DEFAULT;
  region[MOVED].nodes = 0; /* no policy: the default */
  touch_region(region[MOVED].lo, region[MOVED].len, 3);
  nm_placement(region[MOVED].lo, region[MOVED].lo + region[MOVED].len, &region[MOVED].before);
  nm_query_or_move((uintptr_t)region[MOVED].lo, (uintptr_t)region[MOVED].lo + region[MOVED].len,
                   target, &region[MOVED].move);

  for (int r = 0; r < NREGIONS; r++) {
    region[r].policy_seen = nm_policy_of(region[r].lo);
    nm_placement(region[r].lo, region[r].lo + region[r].len, &region[r].after);
  }
  for (int pass = 0; pass < PASSES; pass++)
    for (int r = 0; r < NREGIONS; r++) region[r].sum += read_region(region[r].lo, region[r].len);
  for (int r = 0; r < NREGIONS; r++)
    nm_placement(region[r].lo, region[r].lo + region[r].len, &region[r].at_end);
  return NULL;
}

static void print_truth(long mb) {
  struct nm_json j;
  nm_json_begin(&j, "numa_policy");
  FILE *f = j.f;
  int tnode = nm_node_of_cpu(toucher_cpu);
  fprintf(
      f,
      ",\"mb\":%ld,\"passes\":%ld,\"last_node\":%d,\"target\":%d,\"touch_site\":\"touch_region\","
      "\"read_site\":\"read_region\",\"toucher\":{\"tid\":%u,\"index\":1,\"cpu\":%d,"
      "\"node\":%d,\"pinned\":true,\"bindings\":",
      mb, PASSES, nm_last_node(), target, nm_tids[1], toucher_cpu, tnode);
  nm_json_bindings(f, 1);
  fprintf(f, "},\"main\":{\"tid\":%u,\"index\":0,\"bindings\":", nm_tids[0]);
  nm_json_bindings(f, 0);
  fprintf(f, "},\"regions\":[");
  for (int r = 0; r < NREGIONS; r++) {
    uintptr_t lo = (uintptr_t)region[r].lo, hi = lo + region[r].len;
    long pages = nm_pages(lo, hi);
    fprintf(f,
            "%s{\"name\":\"%s\",\"lo\":%lu,\"hi\":%lu,\"bytes\":%zu,\"pages\":%ld,"
            "\"call\":\"%s\",\"mode\":\"%s\",\"policy_nodes\":",
            r ? "," : "", region_name[r], (unsigned long)lo, (unsigned long)hi, region[r].len,
            pages, r == MOVED ? "move_pages" : "mbind",
            r == MOVED ? "none" : nm_mode_name(region[r].mode));
    nm_json_nodes_list(f, region[r].nodes);
    fprintf(f, ",\"applied\":%s,\"policy_seen\":",
            (r == MOVED ? region[r].move.ok : region[r].mbind_rc == 0) ? "true" : "false");
    if (region[r].policy_seen >= 0)
      fprintf(f, "\"%s\"", nm_mode_name(region[r].policy_seen));
    else
      fprintf(f, "null");
    fprintf(f, ",\"caller_tid\":%u,\"toucher_tid\":%u,\"toucher_cpu\":%d,\"toucher_node\":%d",
            nm_tids[1], nm_tids[1], toucher_cpu, tnode);
    /* The placement the policy asks for (pages per node). */
    struct nm_place want;
    memset(&want, 0, sizeof want);
    want.ok = 1;
    if (r == INTERLEAVE) {
      for (int i = 0; i < nm_topo.nnodes; i++)
        want.pages[nm_topo.node_ids[i]] = pages / nm_topo.nnodes;
      fprintf(f, ",\"expected_node\":null");
    } else {
      want.pages[target] = pages;
      fprintf(f, ",\"expected_node\":%d", target);
    }
    fprintf(f, ",\"expected_pages_per_node\":");
    nm_json_counts(f, &want, 0);
    if (r == INTERLEAVE) fprintf(f, ",\"expected_tolerance_pages\":1");
    if (r == MOVED) {
      nm_json_place(f, "pages_per_node_before", &region[r].before);
      fprintf(f, ",\"move_target\":%d,\"move_ok\":%s,\"moved_pages\":", target,
              region[r].move.ok ? "true" : "false");
      if (region[r].move.ok)
        fprintf(f, "%ld,\"move_failed_pages\":%ld,\"move_pages_calls\":%ld",
                region[r].move.pages[target], pages - region[r].move.pages[target],
                region[r].move.calls);
      else
        fprintf(f, "null,\"move_failed_pages\":null,\"move_errno\":%d", region[r].move.err);
    }
    nm_json_place(f, "pages_per_node", &region[r].after);
    nm_json_place(f, "pages_per_node_at_end", &region[r].at_end);
    if (region[r].after.ok) {
      long local = region[r].after.pages[tnode];
      fprintf(f, ",\"local_pages\":%ld,\"remote_pages\":%ld", local,
              pages - local - region[r].after.absent);
    } else {
      fprintf(f, ",\"local_pages\":null,\"remote_pages\":null");
    }
    fprintf(f, ",\"reads\":%zu}", (size_t)PASSES * region[r].len / 64);
  }
  int stable = 1;
  for (int r = 0; r < NREGIONS; r++) stable &= nm_same_place(&region[r].after, &region[r].at_end);
  fprintf(f, "],\"placement_stable\":%s", stable ? "true" : "false");
  nm_json_end(&j);
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  for (int i = 1; i < argc;) {
    int is_target = strcmp(argv[i], "--target") == 0, is_passes = strcmp(argv[i], "--passes") == 0;
    if (!is_target && !is_passes) {
      i++;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "usage: %s\n", USAGE);
      return 2;
    }
    long v = wl_arg_long(argv[i + 1], USAGE);
    if (is_target && v >= 64) {
      fprintf(stderr, "numa_policy: --target must be below 64\n");
      return 2;
    }
    if (is_passes && (v < 1 || v > 1000000)) {
      fprintf(stderr, "numa_policy: --passes must be 1..1000000\n");
      return 2;
    }
    if (is_target)
      target = (int)v;
    else
      PASSES = v;
    for (int k = i; k + 2 <= argc; k++) argv[k] = argv[k + 2];
    argc -= 2;
  }
  if (argc > 2) {
    fprintf(stderr, "usage: %s\n", USAGE);
    return 2;
  }
  long mb = argc > 1 ? wl_arg_long(argv[1], USAGE) : 16;
  if (mb > 65536) {
    fprintf(stderr, "numa_policy: at most 65536 MiB\n");
    return 2;
  }
  nm_init();
  if (target < 0) target = nm_last_node();
  toucher_cpu = nm_first_cpu_of_node(nm_first_node());
  for (int r = 0; r < NREGIONS; r++) {
    region[r].len = (size_t)mb << 20;
    region[r].lo =
        mmap(NULL, region[r].len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region[r].lo == MAP_FAILED) wl_die("mmap", errno);
  }
  uint64_t t0 = wl_now_ns();
  pthread_t t;
  WL_CHECK(pthread_create(&t, NULL, toucher, NULL));
  WL_CHECK(pthread_join(t, NULL));
  double secs = (double)(wl_now_ns() - t0) / 1e9;
  int bad = 0;
  for (int r = 0; r < NREGIONS; r++)
    if (region[r].sum != (long)(r + 1) * PASSES * (long)(region[r].len / 64)) bad = 1;
  printf("numa_policy: 3 regions of %ld MiB in %.3f s, %d node(s)%s\n", mb, secs, nm_topo.nnodes,
         bad ? ", WRONG RESULT" : "");
  fflush(stdout);
  if (truth) print_truth(mb);
  for (int r = 0; r < NREGIONS; r++) munmap(region[r].lo, region[r].len);
  return bad;
}
