/* The locks lens.
 *
 * Contention is detected the way mutrace does it: try the lock first; only when that
 * fails does the thread wait. Every call is counted exactly, per (lock, call site, kind),
 * in a per-thread hash table that lives in a shared mapping of locks.counts.bin.
 *
 * Timing is what costs (a TSC read is 7-25 ns, as much as an uncontended lock), so each
 * thread times its critical sections with an adaptive period: while timed events of a
 * kind come less than LOCUS_MIN_INTERVAL_US apart the period doubles, when they come more
 * than four times that apart it halves. A thread locking a few thousand times a second
 * times every event; one locking millions of times a second times 1 in N, and each timed
 * event carries weight N. The cost of timing is so bounded to about 2% of the thread's
 * time whatever the program does. LOCUS_TIME_ALL=1 times every event. */
#define _GNU_SOURCE
#include "locks.h"

#include <errno.h>
#include <string.h>

#define MAX_PERIOD (1u << 16)
#define TABLE_FIRST 64u
#define TABLE_MAX (1u << 18)

static struct locus_stream ev_stream, count_stream, obj_stream;
int locus_locks_on;
static uint64_t min_ticks;

LOCUS_TLS struct locus_locks_tls locus_lt;
#define lt locus_lt

/* ---- sampling ---- */

void locus_sample_adapt(struct sampler *s, uint64_t now) {
  uint64_t dt = now - s->last;
  s->last = now;
  if (!s->period) s->period = 1;
  if (dt < min_ticks && s->period < MAX_PERIOD)
    s->period <<= 1;
  else if (dt > 4 * min_ticks && s->period > 1)
    s->period >>= 1;
  s->countdown = s->period;
}

/* ---- exact counts ---- */

/* Tables have a power-of-two number of slots; slot 0 is the header, so probing skips it. */
static inline uint32_t slot_next(uint32_t j, uint32_t n) {
  j = (j + 1) & (n - 1);
  return j ? j : 1;
}

static inline uint32_t slot_of(uint64_t lock, uint64_t site, uint16_t kind, uint32_t n) {
  uint64_t h = (lock ^ (site << 7) ^ kind) * 0x9e3779b97f4a7c15ull;
  uint32_t j = (uint32_t)(h >> 40) & (n - 1);
  return j ? j : 1;
}

/* The header of a table of n slots, the thread's next generation. It goes last: a table
 * without one (cut by a kill) is ignored by readers, who keep the highest generation per
 * thread. */
static void table_seal(struct locus_lock_count *t, uint32_t n, struct locus_self *me) {
  t[0].lock = n;
  t[0].site = ++lt.gen;
  t[0].tid = me->tid;
  t[0].serial = me->serial;
  atomic_signal_fence(memory_order_release);
  t[0].kind = LOCUS_LC_HEADER;
}

static int table_grow(struct locus_self *me) {
  uint32_t n = lt.nslots ? lt.nslots * 4 : TABLE_FIRST;
  if (n > TABLE_MAX) return -1;
  uint64_t at;
  size_t pos = 0, len;
  char *page = NULL;
  /* The first table: an ended thread's, zeroed (table_compact), if there is one. */
  struct locus_lock_count *t =
      n * sizeof *t == 4096 &&
              locus_stream_take_spare(&count_stream, 4096, 4096, &page, &at, &pos, &len) == 0
          ? (struct locus_lock_count *)(void *)page
          : locus_stream_claim_at(&count_stream, (size_t)n * sizeof *t, &at);
  if (!t) return -1;
  for (uint32_t i = 1; lt.tab && i < lt.nslots; i++) {
    struct locus_lock_count *e = &lt.tab[i];
    if (!e->kind) continue;
    uint32_t j = slot_of(e->lock, e->site, e->kind, n);
    while (t[j].kind) j = slot_next(j, n);
    t[j] = *e;
  }
  table_seal(t, n, me);
  if (lt.tab) locus_stream_release(lt.tab, (size_t)lt.nslots * sizeof *t);
  lt.tab = t;
  lt.tab_off = at;
  lt.nslots = n;
  memset(lt.cache, 0, sizeof lt.cache);
  return 0;
}

/* At a thread's end its table (64 slots or more, mostly empty for a short-lived thread: a
 * page of locks.counts.bin per thread, 80 MB for 20,000 threads) is written again dense,
 * its header then the used slots, in the rest of a page another thread left (or a new page,
 * whose rest the next threads take), under the next generation (a reader keeps the highest
 * generation per thread). The hash table's page, zeroed and still mapped, is the next thread's
 * first table (a page each time from fallocate: 20,000 threads' fallocates queued on the file's
 * lock in the kernel, and each munmap was a TLB shootdown). */
static void table_compact(struct locus_self *me) {
  size_t rec = sizeof lt.tab[0], bytes = (size_t)(lt.used + 1) * rec, tab = lt.nslots * rec;
  char *map = NULL;
  uint64_t at = 0;
  size_t pos = 0, len = 0;
  if (!lt.tab || bytes > 4096 / 2) return;
  if (lt.used) {
    if (locus_stream_take_spare(&count_stream, bytes, rec, &map, &at, &pos, &len) != 0) {
      if (!(map = locus_stream_claim_at(&count_stream, 4096, &at))) return;
      pos = 0, len = 4096;
    }
    struct locus_lock_count *t = (struct locus_lock_count *)(void *)(map + pos);
    uint32_t k = 1;
    for (uint32_t i = 1; i < lt.nslots && k <= lt.used; i++)
      if (lt.tab[i].kind) t[k++] = lt.tab[i];
    table_seal(t, k, me);
    if (locus_stream_put_spare(&count_stream, at + pos + k * rec, len - k * rec, map) != 0)
      locus_stream_release(map, 4096);
  }
  memset(lt.tab, 0, tab);
  if (tab == 4096 && locus_stream_put_spare(&count_stream, lt.tab_off, tab, lt.tab) == 0)
    lt.tab = NULL; /* handed over, mapped: the next thread's table */
  else
    locus_stream_punch(&count_stream, lt.tab_off, tab);
}

struct locus_lock_count *locus_count_lookup(struct locus_self *me, uint64_t lock, uint64_t site,
                                            uint16_t kind) {
  struct locus_lock_count *e;
  for (;;) {
    if (lt.tab) {
      uint32_t j = slot_of(lock, site, kind, lt.nslots);
      for (;;) {
        e = &lt.tab[j];
        if (!e->kind) break;
        if (e->lock == lock && e->site == site && e->kind == kind)
          return lt.cache[LOCUS_CACHE_SLOT(lock)] = e;
        j = slot_next(j, lt.nslots);
      }
      if ((lt.used + 1) * 10 < (lt.nslots - 1) * 7) {
        e->lock = lock;
        e->site = site;
        e->tid = me->tid;
        e->serial = me->serial;
        atomic_signal_fence(memory_order_release);
        e->kind = kind;
        lt.used++;
        return lt.cache[LOCUS_CACHE_SLOT(lock)] = e;
      }
    }
    me->guard++;
    int rc = table_grow(me);
    me->guard--;
    if (rc != 0) {
      me->dropped++;
      return NULL;
    }
  }
}

/* ---- events ---- */

static void put_event(struct locus_self *me, const struct held *h, uint64_t obj, uint64_t t_rel,
                      uint16_t extra) {
  struct locus_lock_event ev = {
      .lock = h->lock,
      .site = h->site,
      .obj = obj,
      .t_req = h->t_req,
      .t_acq = h->t_acq,
      .t_rel = t_rel,
      .tid = me->tid,
      .weight = h->weight,
      .stack = h->stack,
      .kind = h->kind,
      .flags = (uint16_t)(h->flags | extra),
  };
  me->guard++;
  if (locus_cursor_put(&ev_stream, &lt.ev, &ev, sizeof ev) == 0)
    me->records++;
  else
    me->dropped++;
  me->guard--;
}

static uint32_t stack_of(struct locus_self *me, uint64_t site) {
  if (!locus_cfg.call_stack) return 0;
  me->guard++;
  uint32_t id = locus_stack_capture(site);
  me->guard--;
  return id;
}

static void push_held(struct locus_self *me, uint64_t lock, uint16_t kind, uint64_t site,
                      uint64_t t_req, uint64_t t_acq, uint16_t flags, uint32_t weight) {
  if (lt.nheld == MAX_HELD) {
    me->dropped++;
    return;
  }
  struct held *h = &lt.held[lt.nheld++];
  h->lock = lock;
  h->site = site;
  h->t_req = t_req;
  h->t_acq = t_acq;
  h->weight = weight;
  h->kind = kind;
  h->flags = (uint16_t)(flags | (weight > 1 ? LOCUS_EV_SAMPLED : 0));
  h->stack = stack_of(me, site);
}

void locus_lock_timed_fast(struct locus_self *me, struct locus_lock_count *e, uint64_t lock,
                           uint16_t kind, uint64_t site, uint32_t w) {
  uint64_t now = locus_ticks();
  locus_sample_adapt(&lt.us, now);
  push_held(me, lock, kind, site, now, now, 0, w);
  if (e) e->timed++;
}

void locus_lock_timed_done(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                           struct locus_lock_count *e, uint32_t w, uint64_t t0, uint64_t t1,
                           int contended, struct sampler *smp) {
  locus_sample_adapt(smp, t1);
  if (e) {
    e->acquisitions++;
    e->timed++;
    if (contended) e->contended++;
    e->hint = (uint32_t)(contended != 0);
  }
  /* An uncontended acquisition's few nanoseconds in the real lock are not waiting. */
  push_held(me, (uint64_t)(uintptr_t)obj, kind, site, contended ? t0 : t1, t1,
            contended ? LOCUS_EV_CONTENDED : 0, w);
}

void locus_lock_flush_done(void) {
  lt.has_done = 0;
  put_event(&locus_me, &lt.done, 0, lt.t_done, 0);
}

void locus_lock_failed(struct locus_self *me, void *obj, uint16_t kind, uint64_t site) {
  struct locus_lock_count *e = locus_count_entry(me, (uint64_t)(uintptr_t)obj, site, kind);
  if (e) e->failed++;
}

int locus_lock_slow(struct locus_self *me, void *obj, uint16_t kind, uint64_t site, int r,
                    locus_block_fn block_fn, const void *arg) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  if (r == EOWNERDEAD) {
    locus_lock_fast(me, obj, kind, site);
    return r;
  }
  /* Any answer but "busy" (a deadlock check, a bad lock) comes from the real call. */
  uint32_t w = r == EBUSY ? locus_sample_hit(&lt.cs) : 0;
  /* Find (or make) the count entry before taking the lock: a new thread's first lookup
   * maps its table (system calls), which must not happen inside the critical section. */
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind);
  uint64_t t0 = w ? locus_ticks() : 0;
  r = block_fn(obj, arg);
  if (r != 0 && r != EOWNERDEAD) {
    if (e) e->failed++;
    if (w) {
      uint64_t t1 = locus_ticks();
      struct held h = {lock, site, t0, t1, w, 0, kind, LOCUS_EV_CONTENDED};
      put_event(me, &h, 0, t1, LOCUS_EV_FAILED | (w > 1 ? LOCUS_EV_SAMPLED : 0));
      locus_sample_adapt(&lt.cs, t1);
    }
    return r;
  }
  if (e) {
    e->acquisitions++;
    e->contended++;
  }
  if (w) {
    uint64_t t1 = locus_ticks();
    locus_sample_adapt(&lt.cs, t1);
    push_held(me, lock, kind, site, t0, t1, LOCUS_EV_CONTENDED, w);
    if (e) e->timed++;
  }
  return r;
}

int locus_lock_acquire(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                       locus_try_fn try_fn, locus_block_fn block_fn, const void *arg) {
  /* The entry is made before the lock is taken (a new table is a system call: a thread
   * must not make it while it holds, say, a spinlock others spin on); the lookup after
   * the lock is then a hit in the thread's direct-mapped cache. */
  locus_count_entry(me, (uint64_t)(uintptr_t)obj, site, kind);
  int r = try_fn(obj);
  if (LOCUS_LIKELY(r == 0)) {
    locus_lock_fast(me, obj, kind, site);
    return 0;
  }
  return locus_lock_slow(me, obj, kind, site, r, block_fn, arg);
}

int locus_lock_try(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                   locus_try_fn try_fn) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind); /* before the lock */
  int r = try_fn(obj);
  if (r != 0 && r != EOWNERDEAD) {
    if (e) e->failed++;
    return r;
  }
  if (e) e->acquisitions++;
  uint32_t w = locus_sample_hit(&lt.us);
  if (w) {
    uint64_t now = locus_ticks();
    locus_sample_adapt(&lt.us, now);
    push_held(me, lock, kind, site, now, now, LOCUS_EV_TRY, w);
    if (e) e->timed++;
  }
  return r;
}

void locus_lock_release_held(struct locus_self *me, void *obj) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  for (int i = lt.nheld - 1; i >= 0; i--) {
    if (lt.held[i].lock != lock) continue;
    if (lt.has_done) locus_lock_flush_done();
    lt.done = lt.held[i];
    lt.t_done = locus_ticks();
    lt.has_done = 1;
    (void)me;
    memmove(&lt.held[i], &lt.held[i + 1], (size_t)(lt.nheld - 1 - i) * sizeof lt.held[0]);
    lt.nheld--;
    return;
  }
}

void locus_lock_blind(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                      void (*lock_fn)(void *), void *lock_arg) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind);
  uint32_t w = locus_sample_hit(&lt.cs);
  uint64_t t0 = w ? locus_ticks() : 0;
  lock_fn(lock_arg);
  if (e) e->acquisitions++;
  if (!w) return;
  uint64_t t1 = locus_ticks();
  locus_sample_adapt(&lt.cs, t1);
  /* Without a try operation, a wait longer than 2 µs is taken to be contention. */
  int contended = (double)(t1 - t0) > 2.0 * locus_ticks_per_us;
  if (e) {
    e->timed++;
    if (contended) e->contended++;
  }
  push_held(me, lock, kind, site, t0, t1, contended ? LOCUS_EV_CONTENDED : 0, w);
}

void locus_wait_begin(struct locus_self *me, uint64_t *t_req) {
  (void)me;
  *t_req = locus_ticks();
}

void locus_wait_end(struct locus_self *me, uint16_t kind, void *obj, uint64_t obj2, uint64_t site,
                    uint64_t t_req, int failed) {
  uint64_t t = locus_ticks();
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind);
  if (e) {
    if (failed)
      e->failed++;
    else
      e->acquisitions++;
    e->contended++;
    e->timed++;
  }
  struct held h = {lock, site, t_req, t, 1, stack_of(me, site), kind, LOCUS_EV_CONTENDED};
  put_event(me, &h, obj2, t, failed ? LOCUS_EV_FAILED : 0);
}

void locus_wait_uncontended(struct locus_self *me, uint16_t kind, void *obj, uint64_t site) {
  struct locus_lock_count *e = locus_count_entry(me, (uint64_t)(uintptr_t)obj, site, kind);
  if (e) e->acquisitions++;
}

void locus_cond_release(struct locus_self *me, void *mutex, uint64_t t_req) {
  uint64_t lock = (uint64_t)(uintptr_t)mutex;
  for (int i = lt.nheld - 1; i >= 0; i--) {
    if (lt.held[i].lock != lock) continue;
    put_event(me, &lt.held[i], 0, t_req, 0);
    memmove(&lt.held[i], &lt.held[i + 1], (size_t)(lt.nheld - 1 - i) * sizeof lt.held[0]);
    lt.nheld--;
    return;
  }
}

void locus_cond_reacquire(struct locus_self *me, void *mutex, uint64_t site) {
  uint64_t lock = (uint64_t)(uintptr_t)mutex;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, LOCUS_LK_MUTEX);
  if (e) {
    e->acquisitions++;
    e->timed++;
  }
  uint64_t now = locus_ticks();
  push_held(me, lock, LOCUS_LK_MUTEX, site, now, now, 0, 1);
}

void locus_lock_instant(struct locus_self *me, uint16_t kind, void *obj, uint64_t site,
                        uint16_t flags) {
  uint64_t lock = (uint64_t)(uintptr_t)obj;
  struct locus_lock_count *e = locus_count_entry(me, lock, site, kind);
  if (e) e->acquisitions++;
  uint32_t w = locus_sample_hit(&lt.ss);
  if (!w) return;
  uint64_t now = locus_ticks();
  locus_sample_adapt(&lt.ss, now);
  if (e) e->timed++;
  struct held h = {lock, site, now, now, w, 0, kind, flags};
  put_event(me, &h, 0, now, w > 1 ? LOCUS_EV_SAMPLED : 0);
}

void locus_lock_object(struct locus_self *me, void *obj, uint16_t kind, uint64_t site,
                       uint64_t attr, uint16_t flags) {
  struct locus_lock_object o = {
      .lock = (uint64_t)(uintptr_t)obj,
      .site = site,
      .t = locus_ticks(),
      .attr = attr,
      .tid = me->tid,
      .stack = stack_of(me, site),
      .kind = kind,
      .flags = flags,
  };
  me->guard++;
  if (locus_cursor_put(&obj_stream, &lt.objs, &o, sizeof o) == 0)
    me->records++;
  else
    me->dropped++;
  me->guard--;
}

/* ---- life cycle ---- */

static void flush_unreleased(void) {
  struct locus_self *me = &locus_me;
  if (me->state != 1) return;
  if (lt.has_done) locus_lock_flush_done();
  uint64_t now = locus_ticks();
  for (int i = 0; i < lt.nheld; i++) put_event(me, &lt.held[i], 0, now, LOCUS_EV_UNRELEASED);
  lt.nheld = 0;
}

static void thread_fini(void) {
  flush_unreleased();
  locus_cursor_finish(&ev_stream, &lt.ev);
  locus_cursor_finish(&obj_stream, &lt.objs);
  table_compact(&locus_me);
  if (lt.tab) locus_stream_release(lt.tab, (size_t)lt.nslots * sizeof lt.tab[0]);
  lt.tab = NULL;
  memset(lt.cache, 0, sizeof lt.cache);
  lt.nslots = lt.used = 0;
}

static void proc_fini(void) { flush_unreleased(); }

static int open_streams(void) {
  if (locus_stream_open(&ev_stream, locus_proc_dirfd, "locks.events.bin") ||
      locus_stream_open(&count_stream, locus_proc_dirfd, "locks.counts.bin") ||
      locus_stream_open(&obj_stream, locus_proc_dirfd, "locks.objects.bin")) {
    locus_warn("locks: cannot create the record files; the locks lens is off");
    return -1;
  }
  min_ticks = (uint64_t)(locus_cfg.min_interval_us * locus_ticks_per_us);
  locus_locks_on = 1;
  return 0;
}

static int proc_init(void) { return open_streams(); }

static void after_fork(void) {
  /* The child keeps the locks its forking thread holds, but writes its own files. */
  memset(&lt.ev, 0, sizeof lt.ev);
  memset(&lt.objs, 0, sizeof lt.objs);
  lt.tab = NULL;
  memset(lt.cache, 0, sizeof lt.cache);
  lt.nslots = lt.used = lt.gen = 0;
  locus_stream_reset_after_fork(&ev_stream);
  locus_stream_reset_after_fork(&count_stream);
  locus_stream_reset_after_fork(&obj_stream);
  locus_locks_on = 0;
  lt.has_done = 0;
  open_streams();
  for (int i = 0; i < lt.nheld; i++) lt.held[i].stack = 0;
}

struct locus_lens locus_lens_locks = {
    .name = "locks",
    .proc_init = proc_init,
    .thread_fini = thread_fini,
    .proc_fini = proc_fini,
    .after_fork = after_fork,
};
