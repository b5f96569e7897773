/* Timestamps. The invariant TSC costs one instruction, so it is the clock when the CPU
 * says it is constant and does not stop in idle states; otherwise CLOCK_MONOTONIC. Each
 * process records calibration pairs (ticks, CLOCK_MONOTONIC ns) so the analysis converts
 * ticks to a clock shared by all processes of the run. */
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "runtime.h"

int locus_clock_kind = LOCUS_CLOCK_MONOTONIC;
double locus_ticks_per_us = 1000.0;

uint64_t locus_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t locus_ticks(void) {
#if defined(__x86_64__)
  if (LOCUS_LIKELY(locus_clock_kind == LOCUS_CLOCK_TSC)) return __rdtsc();
#endif
  return locus_mono_ns();
}

/* True when /proc/cpuinfo lists both flags; read without stdio (no malloc). */
static int cpu_has_invariant_tsc(void) {
  char buf[8192];
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *flags = strstr(buf, "\nflags");
  if (!flags) return 0;
  char *eol = strchr(flags + 1, '\n');
  if (eol) *eol = 0;
  return strstr(flags, " constant_tsc") && strstr(flags, " nonstop_tsc");
}

void locus_clock_init(void) {
#if defined(__x86_64__)
  if (cpu_has_invariant_tsc()) locus_clock_kind = LOCUS_CLOCK_TSC;
#endif
  if (locus_clock_kind != LOCUS_CLOCK_TSC) return;
  uint64_t n0 = locus_mono_ns(), t0 = __rdtsc();
  struct timespec nap = {0, 1000000};
  nanosleep(&nap, NULL);
  uint64_t n1 = locus_mono_ns(), t1 = __rdtsc();
  if (n1 > n0 && t1 > t0)
    locus_ticks_per_us = (double)(t1 - t0) * 1000.0 / (double)(n1 - n0);
  else
    locus_clock_kind = LOCUS_CLOCK_MONOTONIC;
}
