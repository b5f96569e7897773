/* Memory this process maps MAP_SHARED (shared.c): where a line is the same line in other
 * processes of the run, wherever each maps it. */
#ifndef LOCUS_COMM_SHARED_H
#define LOCUS_COMM_SHARED_H
#include <stdint.h>

/* A place in a mapped object: its device and inode (as stat() gives them) and the offset in
 * it. Two processes that map the object reach the same bytes through it. */
struct locus_shared_loc {
  uint64_t ino;
  uint64_t off;
  uint32_t dev;
};

/* The object and offset of addr, when addr is in memory this process maps shared; 0 when it
 * is, -1 when it is not (or a writer of the table was interrupted by this call's signal
 * handler). Async-signal-safe, lock-free. */
int locus_shared_find(uint64_t addr, struct locus_shared_loc *out);
/* This process's address of *l; 0 when it maps it, -1 otherwise. Of two mappings of it (a
 * mapping inherited at a fork, and the child's own), the newest. Async-signal-safe. */
int locus_shared_addr(const struct locus_shared_loc *l, uint64_t *addr);
/* Mappings: [lo, lo + len) maps `ino` on `dev` from offset `off`; the removal of [lo, lo +
 * len) (munmap, or a mapping placed over it) drops every entry it touches. Normal context. */
void locus_shared_add(uint64_t lo, uint64_t len, uint32_t dev, uint64_t ino, uint64_t off);
void locus_shared_remove(uint64_t lo, uint64_t len);
/* The mapping that starts at lo is gone (shmdt: its length is the table's to know): its
 * length, 0 when the table had none there. */
uint64_t locus_shared_detach(uint64_t lo);
/* A mapping the program just made MAP_SHARED at [lo, lo + len) (the mmap interposer; shmat):
 * its object from /proc/self/map_files, else (it needs CAP_SYS_ADMIN) from the mapping's line
 * of /proc/self/maps (anonymous and System V shared memory have an inode there too). */
void locus_shared_mapped(uint64_t lo, uint64_t len, uint64_t off);
/* The shared mappings /proc/self/maps lists now, but the run's own files (in the run
 * directory, the parent of the parent of proc_dir, the process's record directory; NULL:
 * none left out). Returns the entries in the table. Normal context. */
int locus_shared_scan(const char *proc_dir);
/* Set once the board between processes is on (detect.c): the interposers keep the table. */
extern int locus_shared_tracking;
/* Entries in the table. */
int locus_shared_count(void);

#endif
