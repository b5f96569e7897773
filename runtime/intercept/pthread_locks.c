/* Interposers for pthread and POSIX semaphore synchronisation. Each one only forwards:
 * to the real function when the locks lens does not record this call, else to a handler
 * in locks/ with the real operations as arguments. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>

#include "../core/real.h"
#include "../locks/locks.h"

#define FUTEX_WAITERS_BIT 0x80000000u
#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))

/* An unlock only has work to do when the thread holds a timed section; otherwise it is a
 * test and a jump to the real function (name##_held also resolves the real function when
 * it is not yet: a call there would make the interposer save a register around it). */
#define UNLOCK(name, type, field)                                                        \
  static __attribute__((noinline)) int name##_held(type *l) {                            \
    locus_lock_release((void *)l);                                                       \
    int r = REAL(field, #name)(l);                                                       \
    locus_lock_released();                                                               \
    return r;                                                                            \
  }                                                                                      \
  LOCUS_EXPORT int name(type *l) {                                                       \
    if (LOCUS_UNLIKELY(locus_lt.nheld != 0) || !locus_real.field) return name##_held(l); \
    return locus_real.field(l);                                                          \
  }

/* ---- adapters: one signature for every try and blocking operation ---- */
static int mutex_try(void *m) { return REAL(mutex_trylock, "pthread_mutex_trylock")(m); }
static int mutex_block(void *m, const void *a) {
  (void)a;
  return REAL(mutex_lock, "pthread_mutex_lock")(m);
}
static int mutex_timed(void *m, const void *a) {
  return REAL(mutex_timedlock, "pthread_mutex_timedlock")(m, a);
}
static int rd_try(void *l) { return REAL(rw_tryrdlock, "pthread_rwlock_tryrdlock")(l); }
static int wr_try(void *l) { return REAL(rw_trywrlock, "pthread_rwlock_trywrlock")(l); }
static int rd_block(void *l, const void *a) {
  (void)a;
  return REAL(rw_rdlock, "pthread_rwlock_rdlock")(l);
}
static int wr_block(void *l, const void *a) {
  (void)a;
  return REAL(rw_wrlock, "pthread_rwlock_wrlock")(l);
}
static int rd_timed(void *l, const void *a) {
  return REAL(rw_timedrdlock, "pthread_rwlock_timedrdlock")(l, a);
}
static int wr_timed(void *l, const void *a) {
  return REAL(rw_timedwrlock, "pthread_rwlock_timedwrlock")(l, a);
}
static int spin_try(void *l) { return REAL(spin_trylock, "pthread_spin_trylock")(l); }
static int spin_block(void *l, const void *a) {
  (void)a;
  return REAL(spin_lock, "pthread_spin_lock")(l);
}

/* ---- mutex ---- */
/* Whether the acquisition just made met contention, read from glibc's lock word (first in
 * every mutex type; the layout is part of its ABI). A thread that goes to wait sets the word
 * to 2, and the one that comes out of a wait leaves it at 2; robust and PI mutexes hold the
 * owner's tid and the FUTEX_WAITERS bit instead. Reading it after the real lock costs
 * nothing: the line is in this core's cache, owned, since the lock's atomic instruction.
 * Looking before the lock (a peek, or mutrace's trylock first) would fetch a line that moves
 * between cores twice, which doubled the cost of a contended program's locking. The word
 * also reads 2 when another thread began to wait in the nanoseconds since this one took the
 * lock; that contention is real, only booked one acquisition early. A recursive relock by
 * the owner is not contention. */
static inline int mutex_was_contended(void *obj) {
  const pthread_mutex_t *m = obj;
  int word = __atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED);
  if (LOCUS_UNLIKELY(m->__data.__kind & (16 /* robust */ | 32 /* PI */)))
    return (word & (int)FUTEX_WAITERS_BIT) != 0;
  return word > 1 && m->__data.__count <= 1;
}

/* The hottest path of the runtime. Its bookkeeping (locus_lock_block, inlined into
 * mutex_lock_slow) needs a frame of six saved registers, which the compiler set up before
 * the first test while it was inlined into the interposer: every lock taken while another
 * lens records alone (--lens comm; sysbench mutex takes 40 M) paid for it on its way to the
 * real function, 5.3 ns a lock/unlock pair instead of 2.5 (3.3 now). The interposer is two
 * tests and a jump; a recorded lock pays one more jump (~0.6 ns). */
static __attribute__((noinline)) int mutex_lock_slow(pthread_mutex_t *m, uint64_t site) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(mutex_lock, "pthread_mutex_lock")(m);
  return locus_lock_block(me, m, LOCUS_LK_MUTEX, site, mutex_block, NULL, mutex_was_contended);
}

LOCUS_EXPORT int pthread_mutex_lock(pthread_mutex_t *m) {
  if (locus_locks_on || !locus_real.mutex_lock) return mutex_lock_slow(m, SITE);
  return locus_real.mutex_lock(m);
}

LOCUS_EXPORT int pthread_mutex_trylock(pthread_mutex_t *m) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(mutex_trylock, "pthread_mutex_trylock")(m);
  return locus_lock_try(me, m, LOCUS_LK_MUTEX, SITE, mutex_try);
}

LOCUS_EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *t) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(mutex_timedlock, "pthread_mutex_timedlock")(m, t);
  return locus_lock_acquire(me, m, LOCUS_LK_MUTEX, SITE, mutex_try, mutex_timed, t);
}

UNLOCK(pthread_mutex_unlock, pthread_mutex_t, mutex_unlock)

LOCUS_EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
  int r = REAL(mutex_init, "pthread_mutex_init")(m, a);
  struct locus_self *me = locus_locks_self();
  if (me && r == 0) {
    int type = 0;
    if (a) pthread_mutexattr_gettype(a, &type);
    locus_lock_object(me, m, LOCUS_LK_MUTEX, SITE, (uint64_t)type, 1);
  }
  return r;
}

LOCUS_EXPORT int pthread_mutex_destroy(pthread_mutex_t *m) {
  struct locus_self *me = locus_locks_self();
  if (me) locus_lock_object(me, m, LOCUS_LK_MUTEX, SITE, 0, 2);
  return REAL(mutex_destroy, "pthread_mutex_destroy")(m);
}

/* ---- rwlock ---- */
LOCUS_EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_rdlock, "pthread_rwlock_rdlock")(l);
  return locus_lock_acquire(me, l, LOCUS_LK_RWLOCK_RD, SITE, rd_try, rd_block, NULL);
}

LOCUS_EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_wrlock, "pthread_rwlock_wrlock")(l);
  return locus_lock_acquire(me, l, LOCUS_LK_RWLOCK_WR, SITE, wr_try, wr_block, NULL);
}

LOCUS_EXPORT int pthread_rwlock_tryrdlock(pthread_rwlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_tryrdlock, "pthread_rwlock_tryrdlock")(l);
  return locus_lock_try(me, l, LOCUS_LK_RWLOCK_RD, SITE, rd_try);
}

LOCUS_EXPORT int pthread_rwlock_trywrlock(pthread_rwlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_trywrlock, "pthread_rwlock_trywrlock")(l);
  return locus_lock_try(me, l, LOCUS_LK_RWLOCK_WR, SITE, wr_try);
}

LOCUS_EXPORT int pthread_rwlock_timedrdlock(pthread_rwlock_t *l, const struct timespec *t) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_timedrdlock, "pthread_rwlock_timedrdlock")(l, t);
  return locus_lock_acquire(me, l, LOCUS_LK_RWLOCK_RD, SITE, rd_try, rd_timed, t);
}

LOCUS_EXPORT int pthread_rwlock_timedwrlock(pthread_rwlock_t *l, const struct timespec *t) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(rw_timedwrlock, "pthread_rwlock_timedwrlock")(l, t);
  return locus_lock_acquire(me, l, LOCUS_LK_RWLOCK_WR, SITE, wr_try, wr_timed, t);
}

UNLOCK(pthread_rwlock_unlock, pthread_rwlock_t, rw_unlock)

LOCUS_EXPORT int pthread_rwlock_init(pthread_rwlock_t *l, const pthread_rwlockattr_t *a) {
  int r = REAL(rw_init, "pthread_rwlock_init")(l, a);
  struct locus_self *me = locus_locks_self();
  if (me && r == 0) locus_lock_object(me, l, LOCUS_LK_RWLOCK_WR, SITE, 0, 1);
  return r;
}

/* ---- spin ---- */
LOCUS_EXPORT int pthread_spin_lock(pthread_spinlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(spin_lock, "pthread_spin_lock")(l);
  return locus_lock_acquire(me, (void *)l, LOCUS_LK_SPIN, SITE, spin_try, spin_block, NULL);
}

LOCUS_EXPORT int pthread_spin_trylock(pthread_spinlock_t *l) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(spin_trylock, "pthread_spin_trylock")(l);
  return locus_lock_try(me, (void *)l, LOCUS_LK_SPIN, SITE, spin_try);
}

UNLOCK(pthread_spin_unlock, pthread_spinlock_t, spin_unlock)

/* ---- condition variables ---- */
LOCUS_EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(cond_wait, "pthread_cond_wait")(c, m);
  uint64_t t;
  locus_wait_begin(me, &t);
  locus_cond_release(me, m, t);
  int r = REAL(cond_wait, "pthread_cond_wait")(c, m);
  locus_wait_end(me, LOCUS_LK_COND_WAIT, c, (uint64_t)(uintptr_t)m, SITE, t, r != 0);
  locus_cond_reacquire(me, m, SITE);
  return r;
}

LOCUS_EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m,
                                        const struct timespec *ts) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(cond_timedwait, "pthread_cond_timedwait")(c, m, ts);
  uint64_t t;
  locus_wait_begin(me, &t);
  locus_cond_release(me, m, t);
  int r = REAL(cond_timedwait, "pthread_cond_timedwait")(c, m, ts);
  locus_wait_end(me, LOCUS_LK_COND_WAIT, c, (uint64_t)(uintptr_t)m, SITE, t, r != 0);
  locus_cond_reacquire(me, m, SITE);
  return r;
}

LOCUS_EXPORT int pthread_cond_signal(pthread_cond_t *c) {
  struct locus_self *me = locus_locks_self();
  if (me) locus_lock_instant(me, LOCUS_LK_COND_SIGNAL, c, SITE, 0);
  return REAL(cond_signal, "pthread_cond_signal")(c);
}

LOCUS_EXPORT int pthread_cond_broadcast(pthread_cond_t *c) {
  struct locus_self *me = locus_locks_self();
  if (me) locus_lock_instant(me, LOCUS_LK_COND_SIGNAL, c, SITE, LOCUS_EV_BROADCAST);
  return REAL(cond_broadcast, "pthread_cond_broadcast")(c);
}

/* ---- barriers ---- */
LOCUS_EXPORT int pthread_barrier_wait(pthread_barrier_t *b) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(barrier_wait, "pthread_barrier_wait")(b);
  uint64_t t;
  locus_wait_begin(me, &t);
  int r = REAL(barrier_wait, "pthread_barrier_wait")(b);
  locus_wait_end(me, LOCUS_LK_BARRIER, b, 0, SITE, t, r != 0 && r != PTHREAD_BARRIER_SERIAL_THREAD);
  return r;
}

LOCUS_EXPORT int pthread_barrier_init(pthread_barrier_t *b, const pthread_barrierattr_t *a,
                                      unsigned count) {
  int r = REAL(barrier_init, "pthread_barrier_init")(b, a, count);
  struct locus_self *me = locus_locks_self();
  if (me && r == 0) locus_lock_object(me, b, LOCUS_LK_BARRIER, SITE, count, 1);
  return r;
}

/* ---- semaphores ---- */
LOCUS_EXPORT int sem_wait(sem_t *s) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(sem_wait, "sem_wait")(s);
  if (REAL(sem_trywait, "sem_trywait")(s) == 0) {
    locus_wait_uncontended(me, LOCUS_LK_SEM_WAIT, s, SITE);
    return 0;
  }
  uint64_t t;
  locus_wait_begin(me, &t);
  int r = REAL(sem_wait, "sem_wait")(s);
  int saved = errno;
  locus_wait_end(me, LOCUS_LK_SEM_WAIT, s, 0, SITE, t, r != 0);
  errno = saved;
  return r;
}

LOCUS_EXPORT int sem_timedwait(sem_t *s, const struct timespec *ts) {
  struct locus_self *me = locus_locks_self();
  if (!me) return REAL(sem_timedwait, "sem_timedwait")(s, ts);
  if (REAL(sem_trywait, "sem_trywait")(s) == 0) {
    locus_wait_uncontended(me, LOCUS_LK_SEM_WAIT, s, SITE);
    return 0;
  }
  uint64_t t;
  locus_wait_begin(me, &t);
  int r = REAL(sem_timedwait, "sem_timedwait")(s, ts);
  int saved = errno;
  locus_wait_end(me, LOCUS_LK_SEM_WAIT, s, 0, SITE, t, r != 0);
  errno = saved;
  return r;
}

LOCUS_EXPORT int sem_post(sem_t *s) {
  struct locus_self *me = locus_locks_self();
  if (me) locus_lock_instant(me, LOCUS_LK_SEM_POST, s, SITE, 0);
  return REAL(sem_post, "sem_post")(s);
}
