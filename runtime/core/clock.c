/* Timestamps. The invariant TSC costs one instruction, so it is the clock when the CPU
 * says it is constant and does not stop in idle states; otherwise CLOCK_MONOTONIC. Each
 * process records calibration pairs (ticks, CLOCK_MONOTONIC ns) so the analysis converts
 * ticks to a clock shared by all processes of the run. */
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "runtime.h"

int locus_clock_kind = LOCUS_CLOCK_MONOTONIC;
double locus_ticks_per_us = 1000.0;

static uint64_t mono_ns_syscall(void);
LOCUS_TLS int locus_tsc_off;

uint64_t locus_mono_ns(void) {
  if (LOCUS_UNLIKELY(locus_tsc_off)) return mono_ns_syscall(); /* the vDSO reads the TSC */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A thread whose program disabled the TSC (prctl PR_SET_TSC, PR_TSC_SIGSEGV: rdtsc faults,
 * in the vDSO too) gets TSC ticks from CLOCK_MONOTONIC through the system call, by the
 * calibration pair taken at start. */
static uint64_t cal_ticks, cal_ns;

static uint64_t mono_ns_syscall(void) {
  struct timespec ts;
  syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t locus_ticks(void) {
#if defined(__x86_64__)
  if (LOCUS_LIKELY(locus_clock_kind == LOCUS_CLOCK_TSC)) {
    if (LOCUS_LIKELY(!locus_tsc_off)) return __rdtsc();
    uint64_t ns = mono_ns_syscall();
    return cal_ticks + (uint64_t)((double)(ns - cal_ns) * locus_ticks_per_us / 1000.0);
  }
#endif
  return locus_tsc_off ? mono_ns_syscall() : locus_mono_ns();
}

void locus_tsc_check(void) {
#if defined(__x86_64__) && defined(PR_GET_TSC)
  int v = 0;
  locus_tsc_off = syscall(SYS_prctl, PR_GET_TSC, &v, 0, 0, 0) == 0 && v == PR_TSC_SIGSEGV;
#endif
}

/* Whether a word of the flags line (its first cap - 1 characters, in w) starts with
 * "constant_tsc" (bit 0) or "nonstop_tsc" (bit 1). */
static int tsc_flags(char *w, size_t wl, size_t cap) {
  w[wl < cap ? wl : cap - 1] = 0;
  return (!strncmp(w, "constant_tsc", 12) ? 1 : 0) | (!strncmp(w, "nonstop_tsc", 11) ? 2 : 0);
}

/* True when the first "flags" line of /proc/cpuinfo lists both; read without stdio (no
 * malloc), in small pieces: a buffer for the whole CPU's entry (8 KiB) on the stack made
 * the start-up touch main-thread stack pages below those most programs use, resident in
 * them to the end. */
static int cpu_has_invariant_tsc(void) {
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  static const char key[] = "flags";
  char buf[512], w[16];
  size_t at = 0, wl = 0; /* characters of the line's start matched against key, of the word */
  int in_flags = 0, have = 0, done = 0;
  ssize_t n;
  while (!done && (n = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n && !done; i++) {
      char c = buf[i];
      int sep = c == '\n' || c == ' ' || c == '\t' || c == ':';
      if (in_flags && sep && wl > 0) have |= tsc_flags(w, wl, sizeof w);
      if (in_flags && !sep && wl < sizeof w - 1) w[wl] = c;
      if (in_flags) wl = sep ? 0 : wl + 1;
      if (c == '\n') {
        done = in_flags;
        at = 0;
      } else if (!in_flags && at < sizeof key - 1) {
        at = c == key[at] ? at + 1 : sizeof key; /* sizeof key: not this line */
        in_flags = at == sizeof key - 1;
      }
    }
  if (in_flags && !done && wl > 0) have |= tsc_flags(w, wl, sizeof w); /* no last newline */
  close(fd);
  return have == 3;
}

/* "tsc.BOOTID" in name (its room: 4 + 36 + 1 bytes), from the kernel's boot id: a run whose
 * processes run on several machines (MPI ranks over a shared file system) has one rate
 * per machine. 0, or -1 when there is no boot id. */
static int rate_file_name(char name[48]) {
  if (locus_read_small("/proc/sys/kernel/random/boot_id", name + 4, 44) != 37) return -1;
  for (int i = 4; i < 40; i++)
    if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f') ||
          name[i] == '-'))
      return -1;
  memcpy(name, "tsc.", 4);
  name[40] = 0;
  return 0;
}

/* The rate another process of the run measured on this machine (ticks per ms, decimal), or
 * 0: none yet, or being written. */
static uint64_t rate_read(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char b[24];
  ssize_t n = read(fd, b, sizeof b);
  close(fd);
  uint64_t v = 0;
  for (ssize_t i = 0; i < n && b[i] >= '0' && b[i] <= '9'; i++) v = v * 10 + (uint64_t)(b[i] - '0');
  /* 1 MHz to 100 GHz; a partial write reads as a smaller number: taken only whole. */
  return n > 0 && b[n - 1] == '\n' && v >= 1000 && v <= 100000000 ? v : 0;
}

static void rate_write(int dirfd, const char *name, unsigned per_ms) {
  int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return; /* another process wrote it first */
  char b[16];
  locus_fmt_u(b, per_ms);
  size_t n = strlen(b);
  b[n++] = '\n';
  (void)!write(fd, b, n);
  close(fd);
}

void locus_clock_init(int run_dirfd) {
  /* A rate in the run directory: a process of this run on this machine found the TSC
   * invariant (and /proc/cpuinfo, generated for each read, is not read again: ~40 us). */
  char name[48];
  int named = run_dirfd >= 0 && rate_file_name(name) == 0;
  uint64_t per_ms = named ? rate_read(run_dirfd, name) : 0;
#if defined(__x86_64__)
  if (per_ms || cpu_has_invariant_tsc()) locus_clock_kind = LOCUS_CLOCK_TSC;
#endif
  locus_tsc_check(); /* exec keeps a disabled TSC */
  if (locus_clock_kind != LOCUS_CLOCK_TSC || locus_tsc_off) {
    locus_clock_kind = LOCUS_CLOCK_MONOTONIC;
    return;
  }
  /* The rate is only used inside the runtime (durations, sampling intervals; the analysis
   * converts with the exact calibration pairs): 100 us gives it to ~0.05 % (the two clock
   * reads' skew). The first process of the run on a machine measures it and leaves it in
   * the run directory for the others: the nap took ~0.24 ms of each process's start (200
   * /bin/true under comm: 0.71 s with it in every process, 0.66 s without; 1 ms was most of
   * a short process's start-up before it was cut to 100 us). */
  if (per_ms) {
    locus_ticks_per_us = (double)per_ms / 1000.0;
    cal_ns = locus_mono_ns();
    cal_ticks = __rdtsc();
    return;
  }
  uint64_t n0 = locus_mono_ns(), t0 = __rdtsc();
  struct timespec nap = {0, 100000};
  nanosleep(&nap, NULL);
  uint64_t n1 = locus_mono_ns(), t1 = __rdtsc();
  if (n1 > n0 && t1 > t0) {
    locus_ticks_per_us = (double)(t1 - t0) * 1000.0 / (double)(n1 - n0);
    /* (ticks per ms fit an unsigned up to 4 THz) */
    if (named) rate_write(run_dirfd, name, (unsigned)(locus_ticks_per_us * 1000.0 + 0.5));
  } else {
    locus_clock_kind = LOCUS_CLOCK_MONOTONIC;
  }
  cal_ticks = t1;
  cal_ns = n1;
}
