/* Helpers shared by the workloads: the --truth flag, thread ids, monotonic time.
 *
 * Every workload states its own ground truth (what locus must report) as one JSON line on
 * stderr when run with --truth, so that tests compare a recording against what the program
 * itself knows it did, not against numbers copied into the test. */
#ifndef WORKLOADS_COMMON_H
#define WORKLOADS_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* also set by the Makefile: it must precede every system header */
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Removes "--truth" from argv wherever it is; returns 1 if it was present. */
static inline int wl_take_truth_flag(int *argc, char **argv) {
  int found = 0, out = 0;
  for (int i = 0; i < *argc; i++) {
    if (strcmp(argv[i], "--truth") == 0) {
      found = 1;
      continue;
    }
    argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  return found;
}

/* Parses a positive integer argument; exits with status 2 and a usage line otherwise. */
static inline long wl_arg_long(const char *s, const char *usage) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v <= 0) {
    fprintf(stderr, "usage: %s\n", usage);
    exit(2);
  }
  return v;
}

static inline unsigned wl_gettid(void) { return (unsigned)syscall(SYS_gettid); }

static inline uint64_t wl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps until the absolute CLOCK_MONOTONIC time `ns`: absolute deadlines keep a schedule's
 * intervals exact even when a thread wakes late from an earlier sleep. */
static inline void wl_sleep_until_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

static inline void wl_die(const char *what, int err) {
  fprintf(stderr, "%s: %s\n", what, strerror(err));
  exit(1);
}

#define WL_CHECK(call)       \
  do {                       \
    int wl_rc_ = (call);     \
    if (wl_rc_ != 0) {       \
      wl_die(#call, wl_rc_); \
    }                        \
  } while (0)

#endif
