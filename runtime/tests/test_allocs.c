/* Allocation tracking of the comm lens: the records of a few known allocations (kind,
 * address, size, site, thread, stacks), nothing recorded with the lens off, a fork child
 * writing its own allocs.bin, and a program doing 1e6 malloc/free pairs running correctly
 * under the runtime (its timings with the lens off and on are printed, never asserted).
 * Those cases keep every block (LOCUS_HEAP_ALL=1); `young` checks which blocks are dropped
 * without it (comm/allocs.c, drop_young).
 * Each case runs this program again under LD_PRELOAD with a fresh LOCUS_DIR.
 * Usage: test_allocs LIBLOCUS */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../include/locus_format.h"
#include "harness.h"

/* ---- the workloads, run in the preloaded child ---- */
static FILE *addrs_file(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/addrs", getenv("LOCUS_DIR"));
  return fopen(path, "w");
}

static void *thread_body(void *arg) {
  int local = 0;
  void *p = malloc(777);
  FILE *f = arg;
  fprintf(f, "thread %d %lx %lx\n", gettid(), (unsigned long)&local, (unsigned long)p);
  free(p);
  return NULL;
}

static __attribute__((noinline)) int case_known(void) {
  int local = 0;
  FILE *f = addrs_file();
  void *m = malloc(1000);
  unsigned long m_addr = (unsigned long)m; /* realloc may free m */
  void *c = calloc(10, 100);
  void *r = realloc(m, 5000);
  void *pa = NULL;
  if (posix_memalign(&pa, 64, 256) != 0) return 1;
  void *aa = aligned_alloc(128, 512);
  void *ma = memalign(256, 300);
  void *mm = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!m || !c || !r || !aa || !ma || mm == MAP_FAILED) return 1;
  if (((uintptr_t)pa & 63) || ((uintptr_t)aa & 127) || ((uintptr_t)ma & 255)) return 2;
  munmap(mm, 65536);
  /* Moved (a fixed new address forces the move), and it keeps its object: a REMAP record. */
  void *rm = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void *to = mmap(NULL, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (rm == MAP_FAILED || to == MAP_FAILED) return 1;
  void *rm2 = mremap(rm, 65536, 1 << 20, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  if (rm2 != to) return 3;
  fprintf(f, "mremap %lx %lx 1048576\n", (unsigned long)rm, (unsigned long)rm2);
  munmap(rm2, 1 << 20);
  fprintf(f, "main %d %lx %lx\n", getpid(), (unsigned long)&local, (unsigned long)case_known);
  fprintf(f, "malloc %lx 1000\ncalloc %lx 1000\nrealloc %lx 5000\nposix_memalign %lx 256\n", m_addr,
          (unsigned long)c, (unsigned long)r, (unsigned long)pa);
  fprintf(f, "aligned_alloc %lx 512\nmemalign %lx 300\nmmap %lx 65536\n", (unsigned long)aa,
          (unsigned long)ma, (unsigned long)mm);
  free(r);
  free(c);
  free(pa);
  free(aa);
  free(ma);
  pthread_t t;
  fflush(f);
  pthread_create(&t, NULL, thread_body, f);
  pthread_join(t, NULL);
  fclose(f);
  return 0;
}

/* 1e6 malloc/free pairs of varying sizes, each block written and checked: the program's
 * results must be what they are without locus. */
static int case_stress(void) {
  uint64_t sum = 0;
  void *keep[64] = {0};
  for (unsigned i = 0; i < 1000000; i++) {
    size_t n = 16 + (i * 2654435761u) % 4000;
    unsigned char *p = malloc(n);
    if (!p) return 1;
    memset(p, (int)(i & 0xff), n);
    if (malloc_usable_size(p) < n) return 2;
    unsigned k = i % 64;
    if (keep[k]) {
      unsigned char *q = keep[k];
      sum += q[0];
      free(q);
    }
    keep[k] = p;
    if (p[n - 1] != (unsigned char)(i & 0xff)) return 3;
  }
  /* The resident pages of the allocation record files (a hot chunk is 1 MiB), to addrs. */
  FILE *sm = fopen("/proc/self/smaps", "r"), *f = addrs_file();
  char line[512];
  int rec = 0;
  unsigned long rss = 0, kb;
  while (sm && fgets(line, sizeof line, sm)) {
    if ((line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f')) /* a mapping */
      rec = strstr(line, "/heap.bin\n") || strstr(line, "/frees.bin\n");
    if (rec && sscanf(line, "Rss: %lu kB", &kb) == 1) rss += kb;
  }
  if (sm) fclose(sm);
  if (f) fprintf(f, "records_rss %lu\n", rss), fclose(f);
  for (unsigned k = 0; k < 64; k++) free(keep[k]);
  /* sum of (i & 0xff) over the blocks freed inside the loop */
  uint64_t want = 0;
  for (unsigned i = 0; i < 1000000 - 64; i++) want += i & 0xff;
  return sum == want ? 0 : 4;
}

/* Threads one after the other, 150 ms apart: each ends with the main thread alone, which
 * drops the record files' spare pages from memory (locus_streams_shed, at most every 100
 * ms), and the next thread's first records go to those pages. Sizes name the blocks. */
enum { SERIAL_ROUNDS = 6, SERIAL_BLOCKS = 50 };
static void *serial_allocs(void *arg) {
  long r = (long)arg;
  for (int i = 0; i < SERIAL_BLOCKS; i++) {
    volatile char *p = malloc((size_t)(100000 + r * SERIAL_BLOCKS + i));
    if (!p) return (void *)1;
    p[0] = 1;
    free((void *)p);
  }
  return NULL;
}

static int case_serial(void) {
  for (long r = 0; r < SERIAL_ROUNDS; r++) {
    pthread_t t;
    void *ret = NULL;
    if (pthread_create(&t, NULL, serial_allocs, (void *)r) != 0) return 1;
    pthread_join(t, &ret);
    if (ret) return 2;
    struct timespec gap = {0, 150000000};
    nanosleep(&gap, NULL);
  }
  return 0;
}

static int case_fork(void) {
  FILE *f = addrs_file();
  void *before = malloc(4100);
  fflush(f);
  pid_t pid = fork();
  if (pid == 0) {
    void *p = malloc(4242);
    fprintf(f, "child %d %lx\n", getpid(), (unsigned long)p);
    fclose(f);
    free(p);
    exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  void *after = malloc(4343);
  fprintf(f, "parent %d %lx %lx\n", getpid(), (unsigned long)before, (unsigned long)after);
  fclose(f);
  free(before);
  free(after);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* Blocks no sample can name, and blocks one can: 100,000 LIFO pairs of temporaries (40 and
 * 72 bytes), 10,000 rounds of 4 blocks freed first in, first out (56 bytes), 10,000 rounds of
 * 12 (88 bytes: the first 4 freed are older than the last 8 heap records), then a block
 * written for 30 ms of CPU time (sampled in its life), and a block freed by another thread.
 * The last two's addresses go to addrs. */
static void *free_it(void *p) {
  free(p);
  return NULL;
}

/* Frees the block and allocates one of its size again, which glibc's thread cache gives at
 * the same address. */
static void *free_and_again(void *p) {
  free(p);
  return malloc(777);
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 100 blocks of 200 bytes, each alive for 2 ms of CPU time spent writing a buffer of the
 * thread's own: samples fall in every block's life, none on the block. */
static void *named_elsewhere(void *arg) {
  (void)arg;
  static __thread volatile char buf[1024];
  for (int i = 0; i < 100; i++) {
    char *volatile p = malloc(200);
    if (!p) return (void *)1;
    p[0] = 1;
    for (double t0 = cpu_s(); cpu_s() - t0 < 0.002;)
      for (int k = 0; k < 1024; k++) buf[k]++;
    free(p);
  }
  return NULL;
}

/* A block the numa lens tracks (mmap'd, 16 pages or more), written and freed at once: no
 * sample in its life, but the numa lens's census of its pages at its free names it. Its
 * address to addrs. */
/* Threads one after the other each allocate NURSERY_LIVE blocks and end with them alive (in
 * their nursery's slots); main frees the first thread's. */
#define NURSERY_THREADS 3
#define NURSERY_LIVE 600
#define NURSERY_KEPT 5000
static void *allocate_live(void *arg) {
  void **keep = arg;
  for (int i = 0; i < NURSERY_LIVE; i++)
    if (!(keep[i] = malloc(136))) return arg;
  return NULL;
}

static int case_nursery_end(void) {
  static void *keep[NURSERY_THREADS][NURSERY_LIVE];
  /* Blocks never freed: the nursery moves each to the stream, and closes after a window. */
  for (int i = 0; i < NURSERY_KEPT; i++)
    if (!malloc(152)) return 1;
  for (int k = 0; k < NURSERY_THREADS; k++) {
    pthread_t t;
    void *ret = NULL;
    if (pthread_create(&t, NULL, allocate_live, keep[k]) != 0) return 1;
    pthread_join(t, &ret);
    if (ret) return 1;
  }
  for (int i = 0; i < NURSERY_LIVE; i++) free(keep[0][i]);
  return 0;
}

/* HANDOFF_THREADS threads in a ring, each allocating blocks it hands to the next, which
 * frees them, amid blocks of its own; a block's address comes back to the thread that
 * allocated it before, freed by another in between: the case freed_tab is for. */
#define HANDOFF_THREADS 4
#define HANDOFF_N 200000
static struct {
  pthread_mutex_t mu;
  void *q[256];
  unsigned head, tail;
} handoff_q[HANDOFF_THREADS];

static void *handoff(void *arg) {
  int me = (int)(intptr_t)arg, next = (me + 1) % HANDOFF_THREADS;
  void *own[16] = {0};
  for (long i = 0; i < HANDOFF_N; i++) {
    volatile char *p = malloc(24 + (size_t)(i & 7) * 8);
    if (!p) return arg;
    p[0] = 1;
    pthread_mutex_lock(&handoff_q[next].mu);
    int full = handoff_q[next].tail - handoff_q[next].head == 256;
    if (!full) handoff_q[next].q[handoff_q[next].tail++ % 256] = (void *)p;
    pthread_mutex_unlock(&handoff_q[next].mu);
    if (full) free((void *)p);
    void *got = NULL;
    pthread_mutex_lock(&handoff_q[me].mu);
    if (handoff_q[me].head != handoff_q[me].tail) got = handoff_q[me].q[handoff_q[me].head++ % 256];
    pthread_mutex_unlock(&handoff_q[me].mu);
    free(got);
    free(own[i & 15]);
    own[i & 15] = malloc(200);
  }
  for (int k = 0; k < 16; k++) free(own[k]);
  return NULL;
}

static int case_handoff(void) {
  pthread_t t[HANDOFF_THREADS];
  for (int i = 0; i < HANDOFF_THREADS; i++) pthread_mutex_init(&handoff_q[i].mu, NULL);
  for (int i = 0; i < HANDOFF_THREADS; i++)
    if (pthread_create(&t[i], NULL, handoff, (void *)(intptr_t)i) != 0) return 1;
  void *ret, *bad = NULL;
  for (int i = 0; i < HANDOFF_THREADS; i++) pthread_join(t[i], &ret), bad = ret ? ret : bad;
  for (int i = 0; i < HANDOFF_THREADS; i++)
    while (handoff_q[i].head != handoff_q[i].tail) free(handoff_q[i].q[handoff_q[i].head++ % 256]);
  return bad ? 1 : 0;
}

static int case_numa_block(void) {
  FILE *f = addrs_file();
  void *p = malloc(1 << 20);
  if (!p || !f) return 1;
  memset(p, 1, 1 << 20);
  fprintf(f, "numa %lx\n", (unsigned long)p);
  fclose(f);
  free(p);
  return 0;
}

static int case_young(void) {
  FILE *f = addrs_file();
  pthread_t two[2];
  void *ret[2] = {0, 0};
  for (int i = 0; i < 2; i++)
    if (pthread_create(&two[i], NULL, named_elsewhere, NULL) != 0) return 1;
  for (int i = 0; i < 2; i++) pthread_join(two[i], &ret[i]);
  if (ret[0] || ret[1]) return 1;
  for (long i = 0; i < 100000; i++) {
    volatile char *a = malloc(40), *b = malloc(72);
    if (!a || !b) return 1;
    a[0] = b[0] = 1;
    free((void *)b);
    free((void *)a);
  }
  /* FIFO rounds of 4 and 12 blocks (in the nursery's 512 slots while they live), and of
   * 1024 (half of them outlive their slots). */
  static const struct {
    int k, size;
    long n;
  } fifo[] = {{4, 56, 10000}, {12, 88, 10000}, {1024, 104, 20}};
  static volatile char *p[1024];
  for (int r = 0; r < 3; r++)
    for (long i = 0; i < fifo[r].n; i++) {
      for (int j = 0; j < fifo[r].k; j++)
        if (!(p[j] = malloc((size_t)fifo[r].size))) return 1;
      for (int j = 0; j < fifo[r].k; j++) free((void *)p[j]);
    }
  volatile char *kept = malloc(4113);
  if (!kept) return 1;
  unsigned long kept_addr = (unsigned long)kept;
  for (double t0 = cpu_s(); cpu_s() - t0 < 0.03;)
    for (int i = 0; i < 4113; i++) kept[i]++;
  void *shared = malloc(5555); /* (before kept is freed: not at its address) */
  free((void *)kept);
  pthread_t t;
  if (!shared || pthread_create(&t, NULL, free_it, shared) != 0) return 1;
  pthread_join(t, NULL);
  /* A block of this thread's freed by another, which allocates its address again; this
   * thread frees that second block: its free must not drop the first one's record. */
  void *again = NULL, *first = malloc(777);
  if (!first || pthread_create(&t, NULL, free_and_again, first) != 0) return 1;
  pthread_join(t, &again);
  free(again);
  fprintf(f, "young %lx %lx %lx\n", kept_addr, (unsigned long)shared,
          again == first ? (unsigned long)again : 0ul);
  fclose(f);
  return 0;
}

/* ---- the driver ---- */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Run `self name` with the runtime (lib != NULL) and the given lenses; returns the exit
 * status (or -1) and the child's pid. */
static const char *case_period_ns = "100000000";
static int run_case(const char *self, const char *lib, const char *lenses, const char *name,
                    const char *run, pid_t *child) {
  pid_t pid = fork();
  if (pid == 0) {
    if (lib) {
      setenv("LD_PRELOAD", lib, 1);
      setenv("LOCUS_LENSES", lenses, 1);
      /* The soft sampler with a long period and no watchpoints: this test is about the
       * allocation records, not about sampling. */
      setenv("LOCUS_COMM_BACKEND", "soft", 1);
      setenv("LOCUS_COMM_PERIOD_NS", case_period_ns, 1);
      setenv("LOCUS_COMM_WATCHPOINTS", "0", 1);
    }
    setenv("LOCUS_DIR", run, 1);
    execl(self, self, name, (char *)NULL);
    _exit(127);
  }
  int st;
  if (child) *child = pid;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void fresh_dir(char *out, size_t n, const char *name) {
  snprintf(out, n, "/tmp/locus-test-allocs-%d-%s", getpid(), name);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
  if (system(cmd) != 0) abort();
}

static void remove_dir(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) printf("  (could not remove %s)\n", dir);
}

/* The used records of one file of procs/<pid>/ (rec bytes each, `used` tells); NULL when
 * there is no file. */
static void *load_file(const char *run, pid_t pid, const char *name, size_t rec, size_t *n) {
  char path[4300];
  snprintf(path, sizeof path, "%s/procs/%d/%s", run, pid, name);
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat sb;
  fstat(fileno(f), &sb);
  char *all = malloc((size_t)sb.st_size + rec);
  *n = fread(all, rec, (size_t)sb.st_size / rec, f);
  fclose(f);
  return all;
}

/* Every allocation record of a process as struct locus_alloc: allocs.bin, heap.bin (heap
 * blocks: kind MALLOC) and frees.bin (kind FREE), as the reader merges them; NULL (and
 * *n = 0) when there is no allocs.bin. */
static struct locus_alloc *load_allocs(const char *run, pid_t pid, size_t *n) {
  size_t na, nh, nf;
  struct locus_alloc *a = load_file(run, pid, "allocs.bin", sizeof *a, &na);
  struct locus_heap *h = load_file(run, pid, "heap.bin", sizeof *h, &nh);
  struct locus_free *f = load_file(run, pid, "frees.bin", sizeof *f, &nf);
  *n = 0;
  if (!a) {
    free(h);
    free(f);
    return NULL;
  }
  struct locus_alloc *all = calloc(na + nh + nf + 1, sizeof *all);
  size_t k = 0;
  for (size_t i = 0; i < na; i++)
    if (a[i].kind) all[k++] = a[i];
  for (size_t i = 0; i < nh; i++) {
    if (!h[i].site) continue;
    struct locus_alloc *r = &all[k++];
    r->t = h[i].t;
    r->addr = h[i].addr;
    r->size = h[i].size_tid & ((1ull << LOCUS_HEAP_SIZE_BITS) - 1);
    r->tid = (uint32_t)(h[i].size_tid >> LOCUS_HEAP_SIZE_BITS & LOCUS_HEAP_TID_MASK);
    r->site = h[i].site;
    r->kind = LOCUS_AL_MALLOC;
    r->flags = h[i].size_tid & LOCUS_HEAP_NEW ? LOCUS_ALF_NEW : 0;
  }
  for (size_t i = 0; i < nf; i++) {
    if (!f[i].addr) continue;
    all[k].t = f[i].t;
    all[k].addr = f[i].addr;
    all[k++].kind = LOCUS_AL_FREE;
  }
  free(a);
  free(h);
  free(f);
  *n = k;
  return all;
}

static const struct locus_alloc *find(const struct locus_alloc *a, size_t n, uint16_t kind,
                                      uint64_t addr) {
  for (size_t i = 0; i < n; i++)
    if (a[i].kind == kind && a[i].addr == addr) return &a[i];
  return NULL;
}

/* Any record written by thread tid. */
static int has_tid(const struct locus_alloc *a, size_t n, uint32_t tid) {
  for (size_t i = 0; i < n; i++)
    if (a[i].tid == tid) return 1;
  return 0;
}

static int stack_covers(const struct locus_alloc *a, size_t n, uint32_t tid, uint64_t addr) {
  for (size_t i = 0; i < n; i++)
    if (a[i].kind == LOCUS_AL_STACK && a[i].tid == tid && addr >= a[i].addr &&
        addr < a[i].addr + a[i].size)
      return 1;
  return 0;
}

/* Case `name` under `lenses` in a fresh run directory (`dir` under the base, in run): the
 * program's exit code in *rc (0 expected), its pid in *pid and its allocation records (NULL
 * when there are none; the caller frees them), *n of them. */
static struct locus_alloc *run_loaded(const char *self, const char *lib, const char *lenses,
                                      const char *name, const char *dir, char *run, size_t cap,
                                      int *rc, pid_t *pid, size_t *n) {
  fresh_dir(run, cap, dir);
  *rc = run_case(self, lib, lenses, name, run, pid);
  return load_allocs(run, *pid, n);
}

static void test_known(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], path[4300];
  int rc;
  pid_t pid;
  size_t n;
  struct locus_alloc *a =
      run_loaded(self, lib, "comm", "known", "known", run, sizeof run, &rc, &pid, &n);
  CHECK(rc == 0, "the program exited %d", rc);
  CHECK(a && n > 0, "no allocs.bin records (did the comm lens start?)");
  snprintf(path, sizeof path, "%s/addrs", run);
  FILE *f = fopen(path, "r");
  char line[256], what[32];
  unsigned long addr = 0, size = 0, fn = 0;
  int tid = 0;
  unsigned long main_local = 0, old_malloc = 0;
  while (a && f && fgets(line, sizeof line, f)) {
    if (sscanf(line, "main %d %lx %lx", &tid, &main_local, &fn) == 3) {
      CHECK(stack_covers(a, n, (uint32_t)tid, main_local), "main thread's stack record");
      continue;
    }
    if (sscanf(line, "thread %d %lx %lx", &tid, &addr, &size) == 3) {
      CHECK(stack_covers(a, n, (uint32_t)tid, addr), "new thread's stack record");
      const struct locus_alloc *r = find(a, n, LOCUS_AL_MALLOC, size);
      CHECK(r && r->size == 777 && r->tid == (uint32_t)tid, "the thread's malloc(777)");
      CHECK(find(a, n, LOCUS_AL_FREE, size), "the thread's free");
      continue;
    }
    unsigned long to = 0;
    if (sscanf(line, "mremap %lx %lx %lu", &addr, &to, &size) == 3) {
      int found = 0; /* (after the mmap that reserved the place) */
      for (size_t i = 0; i < n; i++)
        found |= a[i].kind == LOCUS_AL_MMAP && a[i].addr == to && (a[i].flags & LOCUS_ALF_REMAP) &&
                 a[i].reserved[0] == addr && a[i].size == size;
      CHECK(found, "mremap: no REMAP record of %lx at %lx", addr, to);
      CHECK(find(a, n, LOCUS_AL_MUNMAP, addr), "mremap: the old range ends");
      continue;
    }
    if (sscanf(line, "%31s %lx %lu", what, &addr, &size) != 3) continue;
    uint16_t kind = strcmp(what, "mmap") ? LOCUS_AL_MALLOC : LOCUS_AL_MMAP;
    const struct locus_alloc *r = find(a, n, kind, addr);
    CHECK(r, "%s: no record at %lx", what, addr);
    if (!r) continue;
    CHECK(r->size == size, "%s: size %lu, want %lu", what, (unsigned long)r->size, size);
    CHECK(r->tid == (uint32_t)pid, "%s: tid %u, want %d", what, r->tid, pid);
    /* The site is the return address into case_known (fn is its address in the child). */
    CHECK(r->site > fn && r->site < fn + 4096, "%s: site %lx outside case_known (%lx)", what,
          (unsigned long)r->site, fn);
    if (!strcmp(what, "malloc")) old_malloc = addr;
    if (!strcmp(what, "mmap"))
      CHECK(find(a, n, LOCUS_AL_MUNMAP, addr), "munmap of the mapping");
    else if (strcmp(what, "malloc"))
      CHECK(find(a, n, LOCUS_AL_FREE, addr), "%s: no free record", what);
  }
  /* realloc moved or grew the malloc(1000) block: its old address is freed. */
  CHECK(a && old_malloc && find(a, n, LOCUS_AL_FREE, old_malloc), "realloc frees the old block");
  for (size_t i = 0; a && i < n; i++)
    CHECK(a[i].kind <= LOCUS_AL_TLS && a[i].t != 0, "record %zu: kind %u t %lu", i, a[i].kind,
          (unsigned long)a[i].t);
  /* The main thread's stack record carries its thread pointer, and the modules' static TLS
   * blocks (libc's at least) are recorded at their offsets from it. */
  uint64_t tp = 0;
  int blocks = 0;
  for (size_t i = 0; a && i < n; i++)
    if (a[i].kind == LOCUS_AL_STACK && a[i].tid == (uint32_t)pid) tp = a[i].reserved[0];
  for (size_t i = 0; a && i < n; i++)
    blocks +=
        a[i].kind == LOCUS_AL_TLS && a[i].size && a[i].site && a[i].addr + a[i].reserved[0] == tp;
  CHECK(tp != 0, "the main thread's stack record has no thread pointer");
  CHECK(blocks >= 1, "no TLS block at an offset from the thread pointer %lx", (unsigned long)tp);
  if (f) fclose(f);
  free(a);
  finish("allocation records: malloc, calloc, realloc, aligned, mmap, frees, stacks", ok);
  if (ok) remove_dir(run);
}

static void test_off(const char *self, const char *lib) {
  int ok = 1;
  char run[4096];
  int rc;
  size_t n;
  pid_t pid;
  struct locus_alloc *a =
      run_loaded(self, lib, "locks", "known", "off", run, sizeof run, &rc, &pid, &n);
  CHECK(rc == 0, "the program exited %d", rc);
  CHECK(!a, "allocs.bin written with the comm lens off");
  free(a);
  finish("no allocation records without the comm lens", ok);
  if (ok) remove_dir(run);
}

static void test_fork(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], path[4300];
  fresh_dir(run, sizeof run, "fork");
  pid_t pid;
  int rc = run_case(self, lib, "comm", "fork", run, &pid);
  CHECK(rc == 0, "the program exited %d", rc);
  snprintf(path, sizeof path, "%s/addrs", run);
  FILE *f = fopen(path, "r");
  int child = 0, parent = 0;
  unsigned long cp = 0, before = 0, after = 0;
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    sscanf(line, "child %d %lx", &child, &cp);
    sscanf(line, "parent %d %lx %lx", &parent, &before, &after);
  }
  if (f) fclose(f);
  size_t n, m;
  struct locus_alloc *pa = load_allocs(run, pid, &n);
  struct locus_alloc *ca = load_allocs(run, child, &m);
  CHECK(parent == pid && child > 0, "addresses written (parent %d child %d)", parent, child);
  CHECK(pa && find(pa, n, LOCUS_AL_MALLOC, before) && find(pa, n, LOCUS_AL_MALLOC, after),
        "the parent's records before and after fork");
  /* By writer, not by address: the child's heap is a copy of the parent's, so its malloc may
   * return the very address the parent's next malloc gets. */
  CHECK(pa && !has_tid(pa, n, (uint32_t)child), "no record of the child in the parent's file");
  CHECK(ca && find(ca, m, LOCUS_AL_MALLOC, cp), "the child's malloc in the child's allocs.bin");
  free(pa);
  free(ca);
  finish("fork: the child records into its own allocs.bin", ok);
  if (ok) remove_dir(run);
}

static void test_stress(const char *self, const char *lib) {
  int ok = 1;
  char run[4096];
  fresh_dir(run, sizeof run, "stress");
  double t0 = now_s();
  int rc0 = run_case(self, NULL, "", "stress", run, NULL);
  double t1 = now_s();
  int rc1 = run_case(self, lib, "locks", "stress", run, NULL);
  double t2 = now_s();
  remove_dir(run);
  fresh_dir(run, sizeof run, "stress");
  pid_t pid;
  int rc2 = run_case(self, lib, "comm", "stress", run, &pid);
  double t3 = now_s();
  CHECK(rc0 == 0 && rc1 == 0 && rc2 == 0, "exit statuses: plain %d, comm off %d, comm on %d", rc0,
        rc1, rc2);
  size_t n;
  struct locus_alloc *a = load_allocs(run, pid, &n);
  size_t mallocs = 0, frees = 0;
  for (size_t i = 0; a && i < n; i++) {
    mallocs += a[i].kind == LOCUS_AL_MALLOC;
    frees += a[i].kind == LOCUS_AL_FREE;
  }
  CHECK(mallocs >= 1000000 && frees >= 1000000, "%zu malloc and %zu free records", mallocs, frees);
  free(a);
  /* Written pages leave the resident set behind the cursor, 64 KiB at a time in a hot
   * chunk: at most 64 KiB and a page of each file (1 MiB each before). */
  char path[4300];
  snprintf(path, sizeof path, "%s/addrs", run);
  FILE *f = fopen(path, "r");
  unsigned long rss = ~0ul;
  CHECK(f && fscanf(f, "records_rss %lu", &rss) == 1, "no records_rss from the program");
  if (f) fclose(f);
  CHECK(rss <= 2 * (64 + 4), "heap.bin and frees.bin: %lu KiB resident", rss);
  printf(
      "  1e6 malloc/free pairs: %.3f s plain, %.3f s preloaded with comm off, %.3f s with "
      "comm on (%zu records)\n",
      t1 - t0, t2 - t1, t3 - t2, n);
  finish("1e6 malloc/free pairs run correctly and are all recorded", ok);
  remove_dir(run);
}

static void test_serial(const char *self, const char *lib) {
  int ok = 1;
  char run[4096];
  int rc;
  pid_t pid;
  size_t n;
  struct locus_alloc *a =
      run_loaded(self, lib, "comm", "serial", "serial", run, sizeof run, &rc, &pid, &n);
  CHECK(rc == 0, "the program exited %d", rc);
  static uint8_t seen[SERIAL_ROUNDS * SERIAL_BLOCKS];
  int blocks = 0, frees = 0;
  for (size_t i = 0; a && i < n; i++) {
    uint64_t k = a[i].size - 100000;
    if (a[i].kind == LOCUS_AL_MALLOC && a[i].size >= 100000 && k < sizeof seen && !seen[k]++)
      blocks++;
    frees += a[i].kind == LOCUS_AL_FREE;
  }
  CHECK(blocks == SERIAL_ROUNDS * SERIAL_BLOCKS && frees >= SERIAL_ROUNDS * SERIAL_BLOCKS,
        "%d of %d blocks recorded, %d frees", blocks, SERIAL_ROUNDS * SERIAL_BLOCKS, frees);
  free(a);
  finish("threads one after the other: every record kept across the spare pages' drops", ok);
  if (ok) remove_dir(run);
}

static int by_addr_t(const void *x, const void *y) {
  const struct locus_alloc *a = x, *b = y;
  if (a->addr != b->addr) return a->addr < b->addr ? -1 : 1;
  return a->t < b->t ? -1 : a->t > b->t;
}

/* Whether a (sorted by address and time) has a malloc of size bytes at addr whose next
 * record at addr is a free (later blocks may take the address). */
static int kept_with_free(const struct locus_alloc *a, size_t n, uint64_t addr, uint64_t size) {
  for (size_t i = 0; i + 1 < n; i++)
    if (a[i].addr == addr && a[i].kind == LOCUS_AL_MALLOC && a[i].size == size)
      return a[i + 1].addr == addr && a[i + 1].kind == LOCUS_AL_FREE;
  return 0;
}

/* Case `name` with the drops on (the other cases keep every block: LOCUS_HEAP_ALL=1), its
 * records (NULL when none) and the first line of its addrs file in addrs. */
static struct locus_alloc *run_dropping(const char *self, const char *lib, const char *lenses,
                                        const char *name, char *run, size_t cap, int *rc,
                                        pid_t *pid, size_t *n, char *addrs, size_t addrs_cap) {
  unsetenv("LOCUS_HEAP_ALL");
  struct locus_alloc *a = run_loaded(self, lib, lenses, name, name, run, cap, rc, pid, n);
  setenv("LOCUS_HEAP_ALL", "1", 1);
  char path[4300];
  snprintf(path, sizeof path, "%s/addrs", run);
  FILE *f = fopen(path, "r");
  if (!f || !fgets(addrs, (int)addrs_cap, f)) addrs[0] = 0;
  if (f) fclose(f);
  return a;
}

static void test_young(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], path[4300], addrs[256];
  int rc;
  pid_t pid;
  size_t n;
  case_period_ns = "1000000"; /* the default period: samples while the blocks live */
  struct locus_alloc *a =
      run_dropping(self, lib, "comm", "young", run, sizeof run, &rc, &pid, &n, addrs, sizeof addrs);
  case_period_ns = "100000000";
  CHECK(rc == 0, "the program exited %d", rc);
  CHECK(a && n > 0, "no allocation records (did the comm lens start?)");
  size_t lifo = 0, fifo4 = 0, fifo12 = 0, fifo1024 = 0, elsewhere = 0;
  for (size_t i = 0; a && i < n; i++) {
    if (a[i].kind != LOCUS_AL_MALLOC) continue;
    elsewhere += a[i].size == 200;
    lifo += a[i].size == 40 || a[i].size == 72;
    fifo4 += a[i].size == 56;
    fifo12 += a[i].size == 88;
    fifo1024 += a[i].size == 104;
  }
  /* Kept: the blocks a sample's mark fell in the life of (a few per millisecond of the
   * loops), and of the rounds of 1024 those that outlived their nursery slot. */
  CHECK(lifo < 2000, "%zu of 200,000 LIFO temporaries recorded", lifo);
  /* Samples fell in their lives, on other lines: the table of named lines drops them (a
   * slot another line took keeps the blocks older than that). */
  CHECK(elsewhere < 60, "%zu of 200 blocks that samples did not name recorded", elsewhere);
  CHECK(fifo4 < 1000, "%zu of 40,000 blocks of rounds of 4 recorded", fifo4);
  CHECK(fifo12 < 1000, "%zu of 120,000 blocks of rounds of 12 recorded", fifo12);
  /* 512 slots: at least 512 of each round's 1024 are moved to the stream (the stream's
   * look-back may still drop its last 8), and most of the others fit. */
  CHECK(fifo1024 >= 20 * (512 - 8) && fifo1024 <= 20 * 768,
        "%zu of 20,480 blocks of rounds of 1024 recorded, want 10,080-15,360", fifo1024);
  /* A block keeps its free record exactly when it keeps its malloc record: at each address
   * (in time order) mallocs and frees alternate, for the loops' blocks. */
  qsort(a, n, sizeof *a, by_addr_t);
  size_t broken = 0;
  for (size_t i = 0; a && i < n; i++) {
    if (a[i].kind != LOCUS_AL_MALLOC || (a[i].size != 40 && a[i].size != 72 && a[i].size != 56 &&
                                         a[i].size != 88 && a[i].size != 104))
      continue;
    int freed = i + 1 < n && a[i + 1].addr == a[i].addr && a[i + 1].kind == LOCUS_AL_FREE;
    int orphan = i > 0 && a[i - 1].addr == a[i].addr && a[i - 1].kind == LOCUS_AL_MALLOC;
    broken += !freed || orphan;
  }
  size_t frees = 0, mallocs = lifo + fifo4 + fifo12 + fifo1024;
  for (size_t i = 0; a && i < n; i++)
    if (a[i].kind == LOCUS_AL_FREE)
      for (size_t j = i; j-- > 0 && a[j].addr == a[i].addr;)
        if (a[j].kind == LOCUS_AL_MALLOC) {
          frees += a[j].size == 40 || a[j].size == 72 || a[j].size == 56 || a[j].size == 88 ||
                   a[j].size == 104;
          break;
        }
  CHECK(!broken && frees == mallocs,
        "%zu blocks without their free or after an unfreed one; "
        "%zu frees of %zu recorded blocks",
        broken, frees, mallocs);
  /* The process's count of them (proc.bin heap_dropped): the loops' and a few more. */
  struct locus_proc hdr;
  memset(&hdr, 0, sizeof hdr);
  snprintf(path, sizeof path, "%s/procs/%d/proc.bin", run, pid);
  FILE *pf = fopen(path, "rb");
  CHECK(pf && fread(&hdr, sizeof hdr, 1, pf) == 1, "no proc.bin");
  if (pf) fclose(pf);
  uint64_t want = 380680 - mallocs - elsewhere;
  CHECK(hdr.heap_dropped >= want && hdr.heap_dropped < want + 1000,
        "proc.bin heap_dropped %lu, want %lu and a few more", (unsigned long)hdr.heap_dropped,
        (unsigned long)want);
  unsigned long kept = 0, shared = 0, again = 0;
  CHECK(sscanf(addrs, "young %lx %lx %lx", &kept, &shared, &again) == 3,
        "no addresses from the program");
  CHECK(kept_with_free(a, n, kept, 4113),
        "the block sampled in its life keeps its malloc and free "
        "records");
  CHECK(kept_with_free(a, n, shared, 5555),
        "the block freed by another thread keeps its malloc and "
        "free records");
  /* At that address: malloc (this thread), free (the other), malloc (the other), free. */
  size_t at_again = 0, i0 = 0;
  while (a && i0 < n && !(a[i0].addr == again && a[i0].size == 777)) i0++;
  for (size_t i = i0; a && i < n && a[i].addr == again; i++)
    CHECK(a[i].kind == (at_again++ % 2 ? LOCUS_AL_FREE : LOCUS_AL_MALLOC),
          "record %zu at the address freed and allocated again is kind %u", at_again, a[i].kind);
  CHECK(!again || at_again == 4, "%zu records at the address freed and allocated again, want 4",
        at_again);
  free(a);
  printf("  recorded: %zu LIFO, %zu of rounds of 4, %zu of 12, %zu of 1024, %zu named elsewhere\n",
         lifo, fifo4, fifo12, fifo1024, elsewhere);
  finish("blocks no sample names are dropped, the others kept with their frees", ok);
  if (ok) remove_dir(run);
}

static void test_numa_block(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], addrs[256];
  int rc;
  pid_t pid;
  size_t n;
  setenv("LOCUS_NUMA_FIRST_TOUCH", "0", 1); /* the census only: no first-touch records */
  struct locus_alloc *a = run_dropping(self, lib, "comm,numa", "numablock", run, sizeof run, &rc,
                                       &pid, &n, addrs, sizeof addrs);
  unsetenv("LOCUS_NUMA_FIRST_TOUCH");
  CHECK(rc == 0, "the program exited %d", rc);
  unsigned long p = 0;
  CHECK(sscanf(addrs, "numa %lx", &p) == 1, "no address from the program");
  if (a) qsort(a, n, sizeof *a, by_addr_t);
  CHECK(a && kept_with_free(a, n, p, 1 << 20), "the block keeps its malloc and free records");
  free(a);
  finish("a block the numa lens tracks keeps its records (its census names it at the free)", ok);
  if (ok) remove_dir(run);
}

static void test_nursery_end(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], addrs[256];
  int rc;
  pid_t pid;
  size_t n;
  struct locus_alloc *a = run_dropping(self, lib, "comm", "nursery", run, sizeof run, &rc, &pid, &n,
                                       addrs, sizeof addrs);
  CHECK(rc == 0, "the program exited %d", rc);
  size_t blocks = 0, freed = 0, kept = 0;
  if (a) qsort(a, n, sizeof *a, by_addr_t);
  for (size_t i = 0; a && i < n; i++) {
    kept += a[i].kind == LOCUS_AL_MALLOC && a[i].size == 152;
    if (a[i].kind == LOCUS_AL_MALLOC && a[i].size == 136) {
      blocks++;
      freed += i + 1 < n && a[i + 1].addr == a[i].addr && a[i + 1].kind == LOCUS_AL_FREE;
    }
  }
  CHECK(kept == NURSERY_KEPT, "%zu of %d blocks never freed recorded", kept, NURSERY_KEPT);
  CHECK(blocks == NURSERY_THREADS * NURSERY_LIVE && freed == NURSERY_LIVE,
        "%zu of %d blocks that outlived their threads recorded, %zu of %d frees", blocks,
        NURSERY_THREADS * NURSERY_LIVE, freed, NURSERY_LIVE);
  free(a);
  finish("blocks alive in a thread's nursery at its end keep their records", ok);
  if (ok) remove_dir(run);
}

static void test_handoff(const char *self, const char *lib) {
  int ok = 1;
  char run[4096], addrs[256];
  int rc;
  pid_t pid;
  size_t n;
  case_period_ns = "1000000"; /* samples name some blocks while they live */
  struct locus_alloc *a = run_dropping(self, lib, "comm", "handoff", run, sizeof run, &rc, &pid, &n,
                                       addrs, sizeof addrs);
  case_period_ns = "100000000";
  CHECK(rc == 0, "the program exited %d", rc);
  /* At each address, in time order, a malloc record is followed by its free (the blocks are
   * all freed): two mallocs in a row are a block whose free was lost. */
  size_t mallocs = 0, lost = 0;
  if (a) qsort(a, n, sizeof *a, by_addr_t);
  for (size_t i = 0; a && i < n; i++) {
    if (a[i].kind != LOCUS_AL_MALLOC || a[i].size < 24 || a[i].size > 200) continue;
    mallocs++;
    lost += !(i + 1 < n && a[i + 1].addr == a[i].addr && a[i + 1].kind == LOCUS_AL_FREE);
  }
  CHECK(mallocs > 0 && !lost, "%zu of %zu blocks handed between threads lost their free", lost,
        mallocs);
  printf("  %zu of %d blocks recorded\n", mallocs, HANDOFF_THREADS * HANDOFF_N * 2);
  free(a);
  finish("blocks handed between threads keep their frees", ok);
  if (ok) remove_dir(run);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "known")) return case_known();
  if (argc == 2 && !strcmp(argv[1], "stress")) return case_stress();
  if (argc == 2 && !strcmp(argv[1], "fork")) return case_fork();
  if (argc == 2 && !strcmp(argv[1], "serial")) return case_serial();
  if (argc == 2 && !strcmp(argv[1], "young")) return case_young();
  if (argc == 2 && !strcmp(argv[1], "numablock")) return case_numa_block();
  if (argc == 2 && !strcmp(argv[1], "nursery")) return case_nursery_end();
  if (argc == 2 && !strcmp(argv[1], "handoff")) return case_handoff();
  if (argc != 2) {
    fprintf(stderr, "usage: test_allocs LIBLOCUS\n");
    return 2;
  }
  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) return 2;
  self[k] = 0;
  setenv("LOCUS_HEAP_ALL", "1", 1); /* the record mechanics: every block */
  test_known(self, argv[1]);
  test_off(self, argv[1]);
  test_fork(self, argv[1]);
  test_stress(self, argv[1]);
  test_serial(self, argv[1]);
  test_young(self, argv[1]);
  test_nursery_end(self, argv[1]);
  test_handoff(self, argv[1]);
  test_numa_block(self, argv[1]);
  printf("test_allocs: %d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
