/* The locks lens: handlers called by the interposers in intercept/. Each handler takes the
 * real operation as a function so that one path serves every lock family. */
#ifndef LOCUS_LOCKS_H
#define LOCUS_LOCKS_H

#include <errno.h>
#include <stdint.h>

#include "../core/runtime.h"

/* Returns 0 on success, EBUSY when the lock is taken, or another error. */
typedef int (*locus_try_fn)(void *obj);
/* Blocks until acquired (or `arg`, a deadline, passes). Returns 0 or an error. */
typedef int (*locus_block_fn)(void *obj, const void *arg);

#define MAX_HELD 32
#define LOCUS_CACHE 16
/* Locks are often adjacent in memory (an array of 40-byte mutexes): mix the address bits
 * above the alignment so that neighbours land in different slots. */
#define LOCUS_CACHE_SLOT(lock) \
  ((((lock) >> 3) ^ ((lock) >> 7) ^ ((lock) >> 11)) & (LOCUS_CACHE - 1))

struct sampler {
  uint32_t period, countdown;
  uint64_t last;
};

struct held {
  uint64_t lock, site, t_req, t_acq;
  uint32_t weight, stack;
  uint16_t kind, flags;
};

struct locus_locks_tls {
  struct locus_cursor ev, objs;
  struct locus_lock_count *tab;
  struct locus_lock_count *cache[LOCUS_CACHE];
  uint32_t nslots, used, gen;
  uint64_t tab_off; /* the table's offset in locks.counts.bin */
  struct sampler us, cs, ss;
  int nheld, has_done;
  struct held held[MAX_HELD];
  /* A released section whose record is written after the real unlock, so that writing it
   * (and now and then mapping a new chunk) never lengthens the program's critical section. */
  struct held done;
  uint64_t t_done;
};
extern LOCUS_TLS struct locus_locks_tls locus_lt;
extern int locus_locks_on;

struct locus_lock_count *locus_count_lookup(struct locus_self *me, uint64_t lock, uint64_t site,
                                            uint16_t kind);
void locus_sample_adapt(struct sampler *s, uint64_t now);

/* The count entry of (lock, site, kind): a direct-mapped cache hit in the common case. */
static inline struct locus_lock_count *locus_count_entry(struct locus_self *me, uint64_t lock,
                                                         uint64_t site, uint16_t kind) {
  struct locus_lock_count *e = locus_lt.cache[LOCUS_CACHE_SLOT(lock)];
  if (LOCUS_LIKELY(e && e->lock == lock && e->site == site && e->kind == kind)) return e;
  return locus_count_lookup(me, lock, site, kind);
}

/* Weight of this event if it is to be timed, else 0. */
static inline uint32_t locus_sample_hit(struct sampler *s) {
  if (LOCUS_LIKELY(s->countdown > 1)) {
    s->countdown--;
    return 0;
  }
  return s->period ? s->period : 1;
}

/* An acquisition that succeeded at the first attempt. */
void locus_lock_timed_fast(struct locus_self *me, struct locus_lock_count *e, uint64_t lock,
                           uint16_t kind, uint64_t site, uint32_t w);
static inline void locus_lock_fast(struct locus_self *me, void *obj, uint16_t kind, uint64_t site) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind);
  if (LOCUS_LIKELY(e != NULL)) e->acquisitions++;
  uint32_t w = locus_sample_hit(&locus_lt.us);
  if (LOCUS_UNLIKELY(w)) locus_lock_timed_fast(me, e, lock, kind, site, w);
}
/* A blocking acquisition, for locks whose contention can be read after the fact
 * (`contended_fn`, on the lock just taken). Everything but the contention test is booked
 * before the real lock is called, so the program's critical section is not lengthened by
 * the runtime; only the 1-in-N timed acquisitions go out of line. */
typedef int (*locus_contended_fn)(void *obj);
void locus_lock_timed_done(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                           struct locus_lock_count *e, uint32_t w, uint64_t t0, uint64_t t1,
                           int contended, struct sampler *smp);
void locus_lock_failed(struct locus_self *me, void *obj, uint16_t kind, uint64_t site);
static inline int locus_lock_block(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                                   locus_block_fn block_fn, const void *arg,
                                   locus_contended_fn contended_fn) {
  struct locus_lock_count *e = locus_count_entry(me, (uint64_t)(uintptr_t)obj, site, kind);
  /* Contention comes in runs: after a contended acquisition of this lock at this site, the
   * thread times with the contended sampler (shorter period), so that waits, rare among
   * acquisitions, are timed often enough to estimate; each event's weight is the period it
   * was timed with, and the analysis weights its means by it. */
  struct sampler *smp = LOCUS_UNLIKELY(e && e->hint) ? &locus_lt.cs : &locus_lt.us;
  uint32_t w = locus_sample_hit(smp);
  if (LOCUS_UNLIKELY(w)) {
    uint64_t t0 = locus_ticks();
    int r = block_fn(obj, arg);
    uint64_t t1 = locus_ticks();
    if (r != 0 && r != EOWNERDEAD)
      locus_lock_failed(me, obj, kind, site);
    else
      locus_lock_timed_done(me, obj, kind, site, e, w, t0, t1, contended_fn(obj), smp);
    return r;
  }
  if (LOCUS_LIKELY(e != NULL)) e->acquisitions++;
  int r = block_fn(obj, arg);
  if (LOCUS_UNLIKELY(r != 0 && r != EOWNERDEAD)) {
    if (e) e->acquisitions--;
    locus_lock_failed(me, obj, kind, site);
  } else if (LOCUS_LIKELY(e != NULL)) {
    uint32_t c = (uint32_t)contended_fn(obj);
    if (LOCUS_UNLIKELY(c)) e->contended++;
    if (LOCUS_UNLIKELY(c != e->hint)) e->hint = c;
  }
  return r;
}
/* After the first attempt failed with `r` (EBUSY: the lock was seen held). */
int locus_lock_slow(struct locus_self *me, void *obj, uint16_t kind, uint64_t site, int r,
                    locus_block_fn block_fn, const void *arg);

/* The calling thread's identity when the locks lens should record this call, else NULL.
 * Inlined into every interposer: it is most of the cost of an unrecorded call. */
static inline struct locus_self *locus_locks_self(void) {
  struct locus_self *me = &locus_me;
  if (LOCUS_LIKELY(me->state == 1 && !me->guard && locus_locks_on && locus_enabled)) return me;
  if (!locus_locks_on || !locus_enabled || me->guard) return NULL;
  return locus_self_get();
}

void locus_lock_release_held(struct locus_self *me, void *obj);
void locus_lock_flush_done(void);
/* Call before the real unlock, so the release time precedes the next acquisition. Only
 * timed sections are on the held stack, so most releases end at the first test. */
static inline void locus_lock_release(void *obj) {
  if (LOCUS_UNLIKELY(locus_lt.nheld != 0)) {
    struct locus_self *me = locus_locks_self();
    if (me) locus_lock_release_held(me, obj);
  }
}
/* Call after the real unlock. */
static inline void locus_lock_released(void) {
  if (LOCUS_UNLIKELY(locus_lt.has_done)) locus_lock_flush_done();
}

int locus_lock_acquire(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                       locus_try_fn try_fn, locus_block_fn block_fn, const void *arg);
/* A trylock the program called itself: never waits. */
int locus_lock_try(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                   locus_try_fn try_fn);
/* A lock without a try operation (GOMP_critical_start): timed, contention inferred. */
void locus_lock_blind(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                      void (*lock_fn)(void *), void *lock_arg);

/* Waits that are not critical sections (cond, barrier, semaphore, join). */
void locus_wait_begin(struct locus_self *me, uint64_t *t_req);
void locus_wait_end(struct locus_self *me, uint16_t kind, void *obj, uint64_t obj2, uint64_t site,
                    uint64_t t_req, int failed);
/* A cond wait releases `mutex` at t_req and holds it again when it returns. */
void locus_cond_release(struct locus_self *me, void *mutex, uint64_t t_req);
void locus_cond_reacquire(struct locus_self *me, void *mutex, uint64_t site);
/* Instants the critical path follows: cond signal/broadcast, sem_post. */
void locus_lock_instant(struct locus_self *me, uint16_t kind, void *obj, uint64_t site,
                        uint16_t flags);
/* A try-wait (sem_trywait-style) that succeeded without waiting. */
void locus_wait_uncontended(struct locus_self *me, uint16_t kind, void *obj, uint64_t site);
void locus_lock_object(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                       uint64_t attr, uint16_t flags);

#endif
