/* signal_floor [0|1] [period_ns]: a CPU-bound loop's thread CPU time, without (0) or with (1)
 * a task-clock perf event that raises SIGTRAP every period_ns of the thread's CPU time
 * (sigtrap, as the soft backend's sampler) and an empty handler: the cost of the signal
 * and of the timer's interrupts on this machine, which no sampler at that period avoids.
 * Prints "cpu SECONDS signals N". Built and run by bench/signal_floor.py. */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
static volatile long n;
static void h(int s, siginfo_t *i, void *c) {
  (void)s;
  (void)i;
  (void)c;
  n++;
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
  int on = argc > 1 && atoi(argv[1]);
  long period = argc > 2 ? atol(argv[2]) : 1000000;
  if (on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = h;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGTRAP, &sa, 0);
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.sample_period = (unsigned long)period;
    a.sigtrap = 1;
    a.remove_on_exec = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
      perror("perf");
      return 1;
    }
  }
  double t0 = now();
  volatile double x = 0;
  for (long i = 0; i < 1500000000; i++) x += i * 0.5;
  double t1 = now();
  printf("cpu %.6f signals %ld\n", t1 - t0, n);
}
