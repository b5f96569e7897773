/* The lens table: the one place that lists the lenses. A lens is enabled when its name is
 * in LOCUS_LENSES and its proc_init succeeds. */
#include <string.h>

#include "runtime.h"

extern struct locus_lens locus_lens_locks, locus_lens_comm, locus_lens_numa;

/* numa after comm: its samples come from comm's samplers. */
struct locus_lens *locus_lenses[] = {&locus_lens_locks, &locus_lens_comm, &locus_lens_numa, NULL};

static int wanted(const char *name) {
  const char *p = locus_cfg.lenses;
  size_t n = strlen(name);
  while (*p) {
    if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0)) return 1;
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  return 0;
}

void locus_lenses_init(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    (*l)->enabled = wanted((*l)->name) && (*l)->proc_init() == 0;
}

void locus_lenses_thread_init(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    if ((*l)->enabled && (*l)->thread_init) (*l)->thread_init();
}

void locus_lenses_thread_fini(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    if ((*l)->enabled && (*l)->thread_fini) (*l)->thread_fini();
}

void locus_lenses_proc_fini(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    if ((*l)->enabled && (*l)->proc_fini) (*l)->proc_fini();
}

void locus_lenses_after_fork(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    if ((*l)->enabled && (*l)->after_fork) (*l)->after_fork();
}

void locus_lenses_sandbox(void) {
  for (struct locus_lens **l = locus_lenses; *l; l++)
    if ((*l)->enabled && (*l)->sandbox) (*l)->sandbox();
}
