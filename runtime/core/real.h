/* The functions the runtime interposes, as found in the next library (libc, libgomp). */
#ifndef LOCUS_REAL_H
#define LOCUS_REAL_H

#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <time.h>

struct locus_real {
  int (*mutex_lock)(pthread_mutex_t *);
  int (*mutex_trylock)(pthread_mutex_t *);
  int (*mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
  int (*mutex_unlock)(pthread_mutex_t *);
  int (*mutex_init)(pthread_mutex_t *, const pthread_mutexattr_t *);
  int (*mutex_destroy)(pthread_mutex_t *);
  int (*rw_rdlock)(pthread_rwlock_t *);
  int (*rw_wrlock)(pthread_rwlock_t *);
  int (*rw_tryrdlock)(pthread_rwlock_t *);
  int (*rw_trywrlock)(pthread_rwlock_t *);
  int (*rw_timedrdlock)(pthread_rwlock_t *, const struct timespec *);
  int (*rw_timedwrlock)(pthread_rwlock_t *, const struct timespec *);
  int (*rw_unlock)(pthread_rwlock_t *);
  int (*rw_init)(pthread_rwlock_t *, const pthread_rwlockattr_t *);
  int (*spin_lock)(pthread_spinlock_t *);
  int (*spin_trylock)(pthread_spinlock_t *);
  int (*spin_unlock)(pthread_spinlock_t *);
  int (*cond_wait)(pthread_cond_t *, pthread_mutex_t *);
  int (*cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
  int (*cond_signal)(pthread_cond_t *);
  int (*cond_broadcast)(pthread_cond_t *);
  int (*barrier_wait)(pthread_barrier_t *);
  int (*barrier_init)(pthread_barrier_t *, const pthread_barrierattr_t *, unsigned);
  int (*sem_wait)(sem_t *);
  int (*sem_trywait)(sem_t *);
  int (*sem_timedwait)(sem_t *, const struct timespec *);
  int (*sem_post)(sem_t *);
  int (*create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  int (*join)(pthread_t, void **);
  void (*exit_)(int) __attribute__((noreturn));
  void (*_exit_)(int) __attribute__((noreturn));
  void (*_Exit_)(int) __attribute__((noreturn));
  int (*execve)(const char *, char *const[], char *const[]);
  int (*execvp)(const char *, char *const[]);
  int (*execvpe)(const char *, char *const[], char *const[]);
  /* OpenMP (libgomp / libomp); NULL until the program has an OpenMP runtime loaded. */
  void (*omp_set_lock)(void *);
  void (*omp_unset_lock)(void *);
  int (*omp_test_lock)(void *);
  void (*omp_set_nest_lock)(void *);
  void (*omp_unset_nest_lock)(void *);
  int (*omp_test_nest_lock)(void *);
  void (*omp_set_lock_)(void *);
  void (*omp_unset_lock_)(void *);
  int (*omp_test_lock_)(void *);
  void (*omp_set_nest_lock_)(void *);
  void (*omp_unset_nest_lock_)(void *);
  int (*omp_test_nest_lock_)(void *);
  void (*gomp_critical_start)(void);
  void (*gomp_critical_end)(void);
  void (*gomp_critical_name_start)(void **);
  void (*gomp_critical_name_end)(void **);
  void (*gomp_barrier)(void);
};

extern struct locus_real locus_real;
void locus_real_resolve(void);
/* Look a symbol up now (for libraries loaded after start-up); aborts with a message when
 * the symbol exists nowhere, since the call cannot be forwarded. */
void *locus_real_need(void **slot, const char *name);

/* The next definition of an interposed function, looked up once into `var` (a static
 * function pointer of the interposer); NULL when there is none. */
#define NEXT(var, name) (var ? var : (var = (__typeof__(var))dlsym(RTLD_NEXT, name)))

#define REAL(field, name)         \
  (LOCUS_LIKELY(locus_real.field) \
       ? locus_real.field         \
       : (__typeof__(locus_real.field))locus_real_need((void **)&locus_real.field, name))

#endif
