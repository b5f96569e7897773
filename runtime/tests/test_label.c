/* Unit test of locus_label() (monitor/label.c) in the built liblocus.so, which the test
 * preloads by running itself again (its initial-exec TLS forbids dlopen): the line it writes
 * to a FIFO, and that it fails at once, never blocking, when the variable is unset, the FIFO
 * absent, nobody reads it or it is full; from a signal handler too; errno untouched.
 * Usage: test_label LIBLOCUS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../include/locus.h"
#include "harness.h"

static int (*label)(const char *);
static char fifo[256];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Everything waiting in the FIFO (its reader is non-blocking). */
static size_t drain(int fd, char *buf, size_t cap) {
  size_t n = 0;
  ssize_t r;
  while (n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
  buf[n] = 0;
  return n;
}

static void case_unset(void) {
  int ok = 1;
  unsetenv("LOCUS_MONITOR_FIFO");
  CHECK(label("x") == -1, "unset variable: -1");
  setenv("LOCUS_MONITOR_FIFO", "", 1);
  CHECK(label("x") == -1, "empty variable: -1");
  setenv("LOCUS_MONITOR_FIFO", "/nonexistent/locus.fifo", 1);
  errno = 1234;
  CHECK(label("x") == -1, "absent FIFO: -1");
  CHECK(errno == 1234, "errno kept (%d)", errno);
  finish("label without a monitor", ok);
}

static void case_no_reader(void) {
  int ok = 1;
  setenv("LOCUS_MONITOR_FIFO", fifo, 1);
  double t0 = now_s();
  CHECK(label("nobody listens") == -1, "no reader: -1");
  CHECK(now_s() - t0 < 0.5, "no reader: returned at once");
  finish("label with nobody reading", ok);
}

static void case_lines(int rfd) {
  int ok = 1;
  char buf[8192];
  setenv("LOCUS_MONITOR_FIFO", fifo, 1);
  CHECK(label("phase 2") == 0, "label sent");
  CHECK(label("two\nlines\r") == 0, "label with newlines sent");
  CHECK(label("") == -1, "empty label: -1");
  CHECK(label(NULL) == -1, "NULL label: -1");
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  CHECK(label(big) == 0, "long label sent");
  drain(rfd, buf, sizeof buf);
  const char *want = "label phase 2\nlabel two lines \n";
  CHECK(strncmp(buf, want, strlen(want)) == 0, "lines: [%.40s]", buf);
  const char *third = buf + strlen(want);
  size_t len = strcspn(third, "\n");
  CHECK(len == 6 + LOCUS_LABEL_MAX, "long label cut to the limit (%zu)", len);
  finish("label lines", ok);
}

static volatile int handler_rc = -2;
static void on_usr1(int sig) {
  (void)sig;
  handler_rc = label("from a handler");
}

static void case_signal(int rfd) {
  int ok = 1;
  char buf[256];
  signal(SIGUSR1, on_usr1);
  raise(SIGUSR1);
  CHECK(handler_rc == 0, "label from a signal handler: %d", handler_rc);
  drain(rfd, buf, sizeof buf);
  CHECK(strcmp(buf, "label from a handler\n") == 0, "handler line: [%s]", buf);
  finish("label from a signal handler", ok);
}

static void case_full(int rfd) {
  int ok = 1;
  char buf[65536];
  /* Fill the FIFO through a second writer, then a label must fail, not wait. */
  int wfd = open(fifo, O_WRONLY | O_NONBLOCK);
  memset(buf, 'x', sizeof buf);
  while (write(wfd, buf, sizeof buf) > 0) {
  }
  while (write(wfd, buf, 1) > 0) {
  }
  double t0 = now_s();
  CHECK(label("no room") == -1, "full FIFO: -1");
  CHECK(now_s() - t0 < 0.5, "full FIFO: returned at once");
  close(wfd);
  while (read(rfd, buf, sizeof buf) > 0) {
  }
  CHECK(label("room again") == 0, "drained FIFO: sent");
  finish("label into a full FIFO", ok);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_label LIBLOCUS\n");
    return 2;
  }
  const char *pre = getenv("LD_PRELOAD");
  if (!pre || strcmp(pre, argv[1]) != 0) {
    setenv("LD_PRELOAD", argv[1], 1);
    unsetenv("LOCUS_DIR"); /* the runtime stays idle: only its API is under test */
    execv("/proc/self/exe", argv);
    perror("execv");
    return 1;
  }
  label = (int (*)(const char *))dlsym(RTLD_DEFAULT, "locus_label");
  if (!label) {
    fprintf(stderr, "test_label: no locus_label in %s\n", argv[1]);
    return 1;
  }
  snprintf(fifo, sizeof fifo, "/tmp/locus-test-label-%d.fifo", (int)getpid());
  unlink(fifo);
  if (mkfifo(fifo, 0600) != 0) {
    perror("mkfifo");
    return 1;
  }
  case_unset();
  case_no_reader();
  int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
  case_lines(rfd);
  case_signal(rfd);
  case_full(rfd);
  close(rfd);
  unlink(fifo);
  printf("test_label: %d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
