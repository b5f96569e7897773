/* What the runtime's C test drivers share: reading a run's files and reporting cases.
 * Each driver runs itself again under LD_PRELOAD for every case, then checks the files. */
#ifndef LOCUS_TEST_HARNESS_H
#define LOCUS_TEST_HARNESS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

/* The whole of DIR/NAME in a malloc'd buffer (NULL when absent); *len its size. */
static inline char *slurp(const char *dir, const char *name, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  *len = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  *len = fread(b, 1, (size_t)n, f);
  fclose(f);
  return b;
}

/* The (last) procs/<pid> directory of a run. */
static inline int proc_dir(const char *run, char *out, size_t n) {
  char procs[4096];
  snprintf(procs, sizeof procs, "%s/procs", run);
  DIR *d = opendir(procs);
  if (!d) return -1;
  struct dirent *e;
  int found = -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(out, n, "%s/%s", procs, e->d_name);
      found = 0;
    }
  closedir(d);
  return found;
}

static int failures, passes;
/* Inside a case: report a failed condition and mark the case (a local `ok`) failed. */
#define CHECK(cond, ...)                \
  do {                                  \
    if (!(cond)) {                      \
      printf("  not ok: " __VA_ARGS__); \
      printf("\n");                     \
      ok = 0;                           \
    }                                   \
  } while (0)

static inline void finish(const char *name, int ok) {
  printf("%s %s\n", ok ? "ok" : "FAILED", name);
  if (ok)
    passes++;
  else
    failures++;
}

#endif
