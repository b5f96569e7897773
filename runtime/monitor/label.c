/* locus_label(): one "label TEXT\n" line to the monitor's control FIFO (include/locus.h).
 *
 * Only async-signal-safe calls (open, write, close) on a stack buffer, plus getenv, which
 * only reads the environment (safe unless the program changes it at the same moment): the
 * label may come from a signal handler or from any thread, and nothing is shared between
 * calls. O_NONBLOCK makes open fail at once (ENXIO) when no monitor has the FIFO open, and
 * write fail at once when the FIFO is full, so a program is never held up by its profiler.
 * The line goes out in one write(2) below PIPE_BUF, so labels from several threads never
 * interleave. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/runtime.h"
#include "../include/locus.h"

LOCUS_EXPORT int locus_label(const char *text) {
  if (!text) return -1;
  const char *path = getenv("LOCUS_MONITOR_FIFO");
  if (!path || !*path) return -1;
  char line[sizeof "label " + LOCUS_LABEL_MAX + 1];
  memcpy(line, "label ", 6);
  size_t n = 6;
  /* A newline or NUL in the text would end the line early: newlines become spaces. */
  for (const char *p = text; *p && n < 6 + LOCUS_LABEL_MAX; p++)
    line[n++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
  if (n == 6) return -1; /* an empty label is no label */
  line[n++] = '\n';
  int saved = errno;
  int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    errno = saved;
    return -1;
  }
  ssize_t w = syscall(SYS_write, fd, line, n); /* async-signal-safe, no interposer */
  close(fd);
  errno = saved;
  return w == (ssize_t)n ? 0 : -1;
}
