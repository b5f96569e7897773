/* comm_procs [procs=2] [iterations=~1s] [false_fraction=0.5] [burst=16] [--file] [--truth]
 *
 * False sharing between processes: comm_falseshare's free-running mode (--free), with
 * processes in place of threads. The two lines of 8-byte counters are in memory the
 * processes share: an anonymous MAP_SHARED mapping made before the fork (the same address
 * in every process), or with --file a memory file each process maps on its own after the
 * fork, at an address of its own, and unmaps before it ends (as MPI ranks map and unmap a
 * shared-memory segment). Process i adds
 * to c[0] of the TRUE line, or to its own c[i] of the FALSE line (adjacent to the others'),
 * in bursts of `burst` __atomic_fetch_add, for ~1 s; the false line in a fraction
 * `false_fraction` of the 10 ms time slots (comm_common.h), the same slots for all.
 *
 * Truth: every pair of processes communicates (the scheduling decides how much); the
 * false fraction of the volume is about false_fraction. --truth prints the workers' pids
 * (each is its process's only thread), the data's file offsets and the adds done.
 */
#include <sys/mman.h>
#include <sys/wait.h>

#include "comm_common.h"

#define USAGE \
  "comm_procs [procs=2] [iterations=~1s] [false_fraction=0.5] [burst=16] [--file] [--free]"
#define MAX_PROCS ((int)(CW_LINE / sizeof(long)))
#define DATA_OFF 4096 /* where the lines are in the file (--file): a page in */

struct shared {
  _Alignas(CW_LINE) long true_line[CW_LINE / sizeof(long)];
  _Alignas(CW_LINE) long false_line[CW_LINE / sizeof(long)];
  /* Bookkeeping, on lines of their own, written once per worker. */
  _Alignas(CW_LINE) long pids[MAX_PROCS];
  long adds[MAX_PROCS][2]; /* [0] true line, [1] false line */
};

static int take_flag(int *argc, char **argv, const char *flag) {
  int found = 0, out = 0;
  for (int i = 0; i < *argc; i++) {
    if (strcmp(argv[i], flag) == 0) {
      found = 1;
      continue;
    }
    argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  return found;
}

/* The shared lines of worker i: the inherited mapping, or (fd >= 0) the file mapped anew,
 * after i + 1 pages of padding so that each process has it at another address (unmap_data
 * undoes it). */
static struct shared *map_data(struct shared *inherited, int fd, int i) {
  if (fd < 0) return inherited;
  void *pad = mmap(NULL, (size_t)(i + 1) * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pad == MAP_FAILED) wl_die("mmap", errno);
  void *p = mmap(NULL, DATA_OFF + sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) wl_die("mmap", errno);
  return (struct shared *)((char *)p + DATA_OFF);
}

static void unmap_data(struct shared *d, int fd) {
  if (fd >= 0 && munmap((char *)d - DATA_OFF, DATA_OFF + sizeof *d) != 0) wl_die("munmap", errno);
}

static void worker(struct shared *d, int i, long limit, long ppm, long burst) {
  long adds[2] = {0, 0};
  int sel = 0;
  cw_store(&d->pids[i], (long)getpid());
  for (long it = 0; cw_free_next(it, limit, ppm, &sel); it++) {
    long *p = sel ? &d->false_line[i] : &d->true_line[0];
    for (long b = 0; b < burst; b++) __atomic_fetch_add(p, 1, __ATOMIC_RELAXED);
    adds[sel] += burst;
  }
  cw_store(&d->adds[i][0], adds[0]);
  cw_store(&d->adds[i][1], adds[1]);
}

int main(int argc, char **argv) {
  int truth = wl_take_truth_flag(&argc, argv);
  int file = take_flag(&argc, argv, "--file");
  (void)cw_take_free_flag(&argc, argv); /* always free-running: --free is accepted */
  cw_store(&cw_free_t0, (long)wl_now_ns());
  long n = argc > 1 ? wl_arg_long(argv[1], USAGE) : 2;
  long limit = cw_arg_rounds(argc > 2 ? argv[2] : NULL, USAGE);
  long ppm = argc > 3 ? cw_arg_fraction(argv[3], USAGE) : 500000;
  long burst = argc > 4 ? wl_arg_long(argv[4], USAGE) : 16;
  if (n < 1 || n > MAX_PROCS || burst < 1) {
    fprintf(stderr, "comm_procs: 1 to %d processes (one counter each in a line)\n", MAX_PROCS);
    return 2;
  }
  int fd = -1;
  struct shared *d;
  if (file) {
    fd = memfd_create("comm_procs", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, DATA_OFF + (off_t)sizeof *d) != 0) wl_die("memfd", errno);
    d = map_data(NULL, fd, MAX_PROCS);
  } else {
    d = mmap(NULL, sizeof *d, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (d == MAP_FAILED) wl_die("mmap", errno);
  }
  uint64_t t0 = wl_now_ns();
  pid_t kids[MAX_PROCS];
  for (int i = 0; i < n; i++) {
    kids[i] = fork();
    if (kids[i] < 0) wl_die("fork", errno);
    if (kids[i] == 0) {
      struct shared *mine = map_data(d, fd, i);
      worker(mine, i, limit, ppm, burst);
      unmap_data(mine, fd);
      _exit(0);
    }
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st;
    if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
  }
  double secs = (double)(wl_now_ns() - t0) / 1e9;
  long ta = 0, fa = 0, sum_false = 0;
  for (int i = 0; i < n; i++) {
    ta += cw_load(&d->adds[i][0]);
    fa += cw_load(&d->adds[i][1]);
    sum_false += cw_load(&d->false_line[i]);
  }
  int ok = !bad && sum_false == fa && cw_load(&d->true_line[0]) == ta;
  printf("comm_procs: %ld processes (%s) in %.3f s%s\n", n, file ? "file" : "anonymous", secs,
         ok ? "" : " WRONG COUNTS");
  long pids[MAX_PROCS];
  for (int i = 0; i < n; i++) pids[i] = cw_load(&d->pids[i]);
  unmap_data(d, fd);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"comm_procs\",\"mode\":\"%s\",\"procs\":%ld,\"burst\":%ld,"
            "\"false_fraction\":%g,\"line_size\":%d,\"seconds\":%.3f,\"pids\":[",
            file ? "file" : "anonymous", n, burst, (double)ppm / 1e6, CW_LINE, secs);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%ld", i ? "," : "", pids[i]);
    fprintf(stderr,
            "],\"offsets\":{\"true\":%d,\"false\":%d},\"true_adds\":%ld,\"false_adds\":%ld,"
            "\"expected\":{\"false_fraction\":%g,\"pattern\":\"all\"}}\n",
            file ? DATA_OFF : 0, (file ? DATA_OFF : 0) + CW_LINE, ta, fa, (double)ppm / 1e6);
  }
  return ok ? 0 : 1;
}
