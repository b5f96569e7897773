/* The numa lens's runtime: first touches of tracked memory (who, which pages, read then
 * write), system calls writing into protected buffers, the program's own SIGSEGV handler,
 * blocked signals and alternate signal stacks in protected memory, and the pinning log.
 * Each case runs this program again under LD_PRELOAD with a fresh LOCUS_DIR.
 * Usage: test_numa LIBLOCUS */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/locus_format.h"
#include "harness.h"

#define MB (1ul << 20)
#define PAGE 4096ul

/* ---- the workloads, run in the preloaded child ---- */
static FILE *out_file(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/addrs", getenv("LOCUS_DIR"));
  return fopen(path, "w");
}

static char *block;

static void *write_second_half(void *arg) {
  (void)arg;
  for (size_t i = 4 * MB; i < 8 * MB; i += PAGE) block[i] = 1;
  return NULL;
}

/* An 8 MiB malloc block (mmap'd by glibc): main writes the first half, a thread the
 * second; a 1 MiB mmap is read everywhere, then written on even pages. */
static int case_firsttouch(void) {
  FILE *f = out_file();
  block = malloc(8 * MB);
  char *m = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!block || m == MAP_FAILED) return 1;
  for (size_t i = 0; i < 4 * MB; i += PAGE) block[i] = 1;
  pthread_t t;
  pthread_create(&t, NULL, write_second_half, NULL);
  pthread_join(t, NULL);
  long sum = 0;
  for (size_t i = 0; i < MB; i += PAGE) sum += m[i];
  for (size_t i = 0; i < MB; i += 2 * PAGE) m[i] = 2;
  for (size_t i = 0; i < MB; i += PAGE) sum += m[i];
  fprintf(f, "%d %lx %lx %ld\n", gettid(), (unsigned long)block, (unsigned long)m, sum);
  fclose(f);
  free(block);
  munmap(m, MB);
  return sum == 2 * (long)(MB / PAGE / 2) ? 0 : 2;
}

/* The kernel writes into protected pages: read, readv, fread, pread. */
static int case_syscalls(void) {
  char *b = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *c = malloc(4 * MB);
  if (b == MAP_FAILED || !c) return 1;
  int fd = open("/proc/self/exe", O_RDONLY);
  if (fd < 0) return 2;
  if (read(fd, b + 5 * PAGE + 100, 3 * PAGE) != (ssize_t)(3 * PAGE)) return 3;
  if (memcmp(b + 5 * PAGE + 101, "ELF", 3) != 0) return 4;
  struct iovec iov[2] = {{b + 20 * PAGE, 100}, {c + MB, 2 * PAGE}};
  if (pread(fd, c + 2 * MB, PAGE, 0) != (ssize_t)PAGE) return 5;
  lseek(fd, 0, SEEK_SET);
  if (readv(fd, iov, 2) != (ssize_t)(100 + 2 * PAGE)) return 6;
  close(fd);
  FILE *f = fopen("/proc/self/exe", "rb");
  if (!f || fread(c + 3 * MB + 7, 1, 3 * PAGE, f) != 3 * PAGE) return 7;
  fclose(f);
  if (memcmp(c + 3 * MB + 8, "ELF", 3) != 0 || memcmp(c + 2 * MB + 1, "ELF", 3) != 0) return 8;
  free(c);
  /* The kernel reads never-touched (zero) pages: write, writev, fwrite of a calloc'd block;
   * and writes into them: getrandom. */
  char *z = calloc(1, 2 * MB), *g = malloc(MB);
  char path[4096];
  snprintf(path, sizeof path, "%s/zeros", getenv("LOCUS_DIR"));
  int out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!z || !g || out < 0) return 9;
  if (write(out, z, MB) != (ssize_t)MB) return 10;
  struct iovec wv[2] = {{z + MB, PAGE}, {z + MB + 8 * PAGE, 3 * PAGE}};
  if (writev(out, wv, 2) != (ssize_t)(4 * PAGE)) return 11;
  close(out);
  FILE *w = fopen(path, "ab");
  if (!w || fwrite(z + MB + 64 * PAGE, 1, 64 * PAGE, w) != 64 * PAGE) return 12;
  fclose(w);
  if (getrandom(g + 7 * PAGE, PAGE, 0) != (ssize_t)PAGE) return 13;
  struct stat st;
  if (stat(path, &st) != 0 || st.st_size != (off_t)(MB + 68 * PAGE)) return 14;
  /* mlock populates: protected pages would make it fail (ENOMEM). 32 KiB: within any
   * RLIMIT_MEMLOCK. */
  char *l = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (l == MAP_FAILED || (mlock(l, 8 * PAGE) != 0 && errno != EPERM)) return 15;
  l[5 * PAGE] = 1;
  munlock(l, 8 * PAGE);
  free(z);
  free(g);
  return 0;
}

static sigjmp_buf jb;
static volatile int app_faults;
static void app_handler(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)si, (void)uc;
  app_faults++;
  siglongjmp(jb, 1);
}

/* The program's own SIGSEGV handler still gets its own faults; a fresh page touched with
 * every signal blocked and from a handler on an alternate stack in fresh memory works. */
static volatile int alt_ran;
static void alt_handler(int sig) {
  (void)sig;
  char local[256];
  memset(local, 1, sizeof local);
  alt_ran = local[10];
}

static void *blocked_thread(void *arg) {
  char *p = arg;
  for (size_t i = 0; i < MB; i += PAGE) p[i] = 3;
  return NULL;
}

static int case_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = app_handler;
  sa.sa_flags = SA_SIGINFO;
  sigfillset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, NULL) != 0) return 1;
  char *guard = mmap(NULL, PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (sigsetjmp(jb, 1) == 0) guard[0] = 1;
  if (app_faults != 1) return 2;
  /* All signals blocked, in a thread too, then fresh memory touched. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  char *p = malloc(2 * MB);
  pthread_t t;
  pthread_create(&t, NULL, blocked_thread, p);
  pthread_join(t, NULL);
  for (size_t i = MB; i < 2 * MB; i += PAGE) p[i] = 4;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  /* An alternate signal stack in fresh memory. */
  char *alt = mmap(NULL, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  stack_t ss = {.ss_sp = alt, .ss_size = 64 * 1024, .ss_flags = 0};
  if (sigaltstack(&ss, NULL) != 0) return 3;
  struct sigaction su;
  memset(&su, 0, sizeof su);
  su.sa_handler = alt_handler;
  su.sa_flags = SA_ONSTACK;
  sigaction(SIGUSR1, &su, NULL);
  raise(SIGUSR1);
  if (alt_ran != 1) return 4;
  free(p);
  return 0;
}

/* Pinning: this thread to CPU 0, then to every CPU. */
static int case_pins(void) {
  FILE *f = out_file();
  cpu_set_t one, all;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  sched_getaffinity(0, sizeof all, &all);
  if (sched_setaffinity(0, sizeof one, &one) != 0) return 1;
  if (pthread_setaffinity_np(pthread_self(), sizeof all, &all) != 0) return 2;
  fprintf(f, "%d %d\n", gettid(), CPU_COUNT(&all));
  fclose(f);
  return 0;
}

/* ---- the driver ---- */
static int run_case(const char *self, const char *lib, const char *name, const char *run) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("LD_PRELOAD", lib, 1);
    setenv("LOCUS_LENSES", "numa,comm", 1);
    setenv("LOCUS_COMM_DETECT", "0", 1);
    setenv("LOCUS_COMM_BACKEND", "soft", 1);
    setenv("LOCUS_COMM_PERIOD_NS", "1000000", 1);
    setenv("LOCUS_DIR", run, 1);
    execl(self, self, name, (char *)NULL);
    _exit(127);
  }
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *fresh_run(const char *name) {
  static char path[4096];
  snprintf(path, sizeof path, "/tmp/locus-test-numa-%d-%s", getpid(), name);
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", path, path);
  if (system(cmd) != 0) return NULL;
  return path;
}

static size_t records(const char *run, const char *file, size_t size, char **buf) {
  char pd[4096];
  size_t len = 0;
  *buf = NULL;
  if (proc_dir(run, pd, sizeof pd) != 0) return 0;
  *buf = slurp(pd, file, &len);
  return len / size;
}

/* AnonHugePages (kB) of the mappings inside [p, p + len), from /proc/self/smaps. */
static long anon_huge_kb(const void *p, size_t len) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  unsigned long lo, hi, a = (unsigned long)p;
  int inside = 0;
  long kb = 0, v;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      inside = lo >= a && hi <= a + len;
    else if (inside && sscanf(line, "AnonHugePages: %ld kB", &v) == 1)
      kb += v;
  }
  fclose(f);
  return kb;
}

/* Huge pages: an 8 MiB mmap with MADV_HUGEPAGE, one write per aligned 2 MiB; then the first
 * huge page dropped (MADV_DONTNEED) and written again. */
static int case_huge(void) {
  FILE *f = out_file();
  size_t len = 8 * MB, hp = 2 * MB;
  char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 1;
  if (madvise(m, len, MADV_HUGEPAGE) != 0) return 2;
  uintptr_t lo = ((uintptr_t)m + hp - 1) & ~(hp - 1), hi = ((uintptr_t)m + len) & ~(hp - 1);
  for (uintptr_t a = lo; a < hi; a += hp) ((volatile char *)a)[100] = 1;
  long kb = anon_huge_kb(m, len);
  if (madvise((void *)lo, hp, MADV_DONTNEED) != 0) return 3;
  ((volatile char *)lo)[200] = 2;
  if (((volatile char *)lo)[100] != 0) return 4; /* dropped: a fresh page */
  fprintf(f, "%lx %lx %lx %ld\n", (unsigned long)m, (unsigned long)lo, (unsigned long)hi, kb);
  fclose(f);
  munmap(m, len);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "firsttouch")) return case_firsttouch();
  if (argc == 2 && !strcmp(argv[1], "huge")) return case_huge();
  if (argc == 2 && !strcmp(argv[1], "syscalls")) return case_syscalls();
  if (argc == 2 && !strcmp(argv[1], "signals")) return case_signals();
  if (argc == 2 && !strcmp(argv[1], "pins")) return case_pins();
  if (argc != 2) {
    fprintf(stderr, "usage: test_numa LIBLOCUS\n");
    return 2;
  }
  const char *lib = argv[1], *self = "/proc/self/exe";
  char exe[4096];
  ssize_t k = readlink(self, exe, sizeof exe - 1);
  if (k <= 0) return 2;
  exe[k] = 0;

  {
    int ok = 1;
    char *run = fresh_run("ft");
    int rc = run_case(exe, lib, "firsttouch", run);
    CHECK(rc == 0, "firsttouch exited %d", rc);
    size_t n;
    char *a = slurp(run, "addrs", &n);
    int main_tid = 0;
    unsigned long blk = 0, m = 0;
    long sum = 0;
    CHECK(a && sscanf(a, "%d %lx %lx %ld", &main_tid, &blk, &m, &sum) == 4, "no addrs");
    char *buf;
    size_t nt = records(run, "numa.touch.bin", sizeof(struct locus_numa_touch), &buf);
    const struct locus_numa_touch *t = (const void *)buf;
    size_t main_pages = 0, other_pages = 0, m_first = 0, bad = 0;
    size_t blk_final = 0, m_final_placed = 0, m_final_absent = 0;
    for (size_t i = 0; i < nt; i++) {
      if (t[i].kind != 1) continue;
      if (t[i].flags & LOCUS_NT_FINAL) {
        if (t[i].region == blk) blk_final += t[i].node >= 0 ? t[i].pages : 0;
        if (t[i].region == m && t[i].node >= 0) m_final_placed += t[i].pages;
        if (t[i].region == m && t[i].node == -2) m_final_absent += t[i].pages;
        continue;
      }
      if (t[i].flags & LOCUS_NT_PLACE) continue;
      if (t[i].addr >= blk && t[i].addr < blk + 8 * MB) {
        int second = t[i].addr >= ((blk + 4 * MB) & ~(PAGE - 1));
        if (!(t[i].flags & LOCUS_NT_WRITE) || t[i].region != blk || t[i].node < 0) bad++;
        if ((int)t[i].tid == main_tid && !second) main_pages += t[i].pages;
        if ((int)t[i].tid != main_tid && second) other_pages += t[i].pages;
      } else if (t[i].addr >= m && t[i].addr < m + MB) {
        m_first += t[i].pages;
        if (t[i].flags & LOCUS_NT_WRITE) bad++; /* the mmap is read first */
      }
    }
    /* The block's first page holds glibc's chunk header (touched by malloc itself); a
     * sequential run opens blocks of up to 64 pages ahead, so the thread's half may lose up
     * to 63 pages to main at the boundary. */
    CHECK(main_pages + other_pages >= 8 * MB / PAGE - 2, "block pages %zu + %zu", main_pages,
          other_pages);
    CHECK(other_pages >= 4 * MB / PAGE - 64, "second half by the thread: %zu", other_pages);
    CHECK(m_first == MB / PAGE, "mmap first touches %zu", m_first);
    CHECK(blk_final >= 8 * MB / PAGE - 1, "block final placement %zu", blk_final);
    CHECK(m_final_placed + m_final_absent == MB / PAGE, "mmap final %zu + %zu", m_final_placed,
          m_final_absent);
    CHECK(m_final_placed >= MB / PAGE / 2, "mmap written pages placed %zu", m_final_placed);
    CHECK(bad == 0, "%zu inconsistent records", bad);
    finish("first touch: who, which pages, then the final placement of each block", ok);
    free(a);
    free(buf);
  }
  {
    int ok = 1;
    char thp[128] = "";
    FILE *tf = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (tf) {
      if (!fgets(thp, sizeof thp, tf)) thp[0] = 0;
      fclose(tf);
    }
    if (!thp[0] || strstr(thp, "[never]")) {
      printf("skip huge pages: transparent huge pages are off here\n");
    } else {
      char *run = fresh_run("huge");
      int rc = run_case(exe, lib, "huge", run);
      CHECK(rc == 0, "huge exited %d", rc);
      size_t n;
      char *a = slurp(run, "addrs", &n);
      unsigned long m = 0, lo = 0, hi = 0;
      long kb = -1;
      CHECK(a && sscanf(a, "%lx %lx %lx %ld", &m, &lo, &hi, &kb) == 4, "no addrs");
      char *buf;
      size_t nt = records(run, "numa.touch.bin", sizeof(struct locus_numa_touch), &buf);
      const struct locus_numa_touch *t = (const void *)buf;
      size_t huge = 0, first_block = 0, other = 0;
      for (size_t i = 0; i < nt; i++) {
        if (t[i].kind != 1 || (t[i].flags & LOCUS_NT_FINAL) || t[i].addr < m ||
            t[i].addr >= m + 8 * MB)
          continue;
        if (t[i].flags & LOCUS_NT_HUGE) {
          huge++;
          CHECK(t[i].pages == 512 && t[i].addr % (2 * MB) == 0 && t[i].node >= 0 &&
                    (t[i].flags & LOCUS_NT_WRITE),
                "huge record: %u pages at %lx node %d", t[i].pages, (unsigned long)t[i].addr,
                t[i].node);
          first_block += t[i].addr == lo;
        } else {
          other++;
        }
      }
      size_t blocks = (hi - lo) / (2 * MB);
      /* One first touch per huge page, and the dropped one again after MADV_DONTNEED. */
      CHECK(huge == blocks + 1 && first_block == 2, "%zu huge records (%zu blocks), first %zu",
            huge, blocks, first_block);
      CHECK(other == 0, "%zu page records for one write per huge page", other);
      CHECK(kb >= 2048, "the kernel backed them with huge pages: AnonHugePages %ld kB", kb);
      finish("huge pages: one first touch per huge page, backed by THP; MADV_DONTNEED re-arms", ok);
      free(a);
      free(buf);
    }
  }
  {
    int ok = 1;
    char *run = fresh_run("sys");
    int rc = run_case(exe, lib, "syscalls", run);
    CHECK(rc == 0, "syscalls exited %d", rc);
    finish(
        "read, pread, readv, fread, getrandom into, write, writev, fwrite from and mlock of "
        "protected pages",
        ok);
  }
  {
    int ok = 1;
    char *run = fresh_run("sig");
    int rc = run_case(exe, lib, "signals", run);
    CHECK(rc == 0, "signals exited %d", rc);
    finish("own SIGSEGV handler, all signals blocked, altstack in fresh memory", ok);
  }
  {
    int ok = 1;
    char *run = fresh_run("pins");
    int rc = run_case(exe, lib, "pins", run);
    CHECK(rc == 0, "pins exited %d", rc);
    size_t n;
    char *a = slurp(run, "addrs", &n);
    int tid = 0, ncpu = 0;
    CHECK(a && sscanf(a, "%d %d", &tid, &ncpu) == 2, "no addrs");
    char *buf;
    size_t np = records(run, "numa.pins.bin", sizeof(struct locus_numa_pin), &buf);
    const struct locus_numa_pin *p = (const void *)buf;
    int seq[8], k2 = 0;
    for (size_t i = 0; i < np && k2 < 8; i++)
      if (p[i].kind == 1 && (int)p[i].tid == tid) {
        seq[k2++] = p[i].what;
        if (p[i].what == LOCUS_NP_SCHED_SETAFFINITY) CHECK(p[i].ncpus == 1, "ncpus");
        if (p[i].what == LOCUS_NP_PTHREAD_SETAFFINITY)
          CHECK((int)p[i].ncpus == ncpu, "ncpus %u", p[i].ncpus);
      }
    CHECK(k2 == 4 && seq[0] == LOCUS_NP_START && seq[1] == LOCUS_NP_SCHED_SETAFFINITY &&
              seq[2] == LOCUS_NP_PTHREAD_SETAFFINITY && seq[3] == LOCUS_NP_END,
          "pin sequence of %d records", k2);
    finish("pinning log: start, sched_setaffinity, pthread_setaffinity_np, end", ok);
    free(a);
    free(buf);
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/locus-test-numa-%d-*", getpid());
  if (system(cmd) != 0) return 1;
  printf("%d passed, %d failed\n", passes, failures);
  return failures != 0;
}
