/* The one SIGTRAP handler of the comm lens. Our perf events (the soft sampler's task clock,
 * the detector's watchpoints) send a synchronous SIGTRAP tagged with a cookie in
 * si_perf_data; every other SIGTRAP (int3, the program's own perf events, debuggers) goes
 * to the program's handler, or to the default action. The program's later sigaction() or
 * signal() calls for SIGTRAP are recorded as the handler to chain to, so that ours stays
 * in front: without it, a program installing SIG_DFL would be killed by our next sample. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>

#include "soft.h"

#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif

int (*locus_comm_trap_sampler)(siginfo_t *si, void *uc);

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static _Atomic int installed;
/* What the program asked for SIGTRAP (or had before us). Updates from two threads at once
 * are not ordered; the program racing with itself on its own handler is its problem. */
static struct sigaction app_action;

static sigaction_fn get_real(void) {
  if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return real_sigaction;
}

static void chain(int sig, siginfo_t *si, void *uc) {
  struct sigaction a = app_action;
  if (!(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_IGN) return;
  if (!(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL) {
    /* The default action of SIGTRAP ends the process with a core dump: reproduce it. The
     * signal is blocked while we run, so it is taken on return, with the default action. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    if (get_real()) real_sigaction(SIGTRAP, &dfl, NULL);
    raise(SIGTRAP);
    return;
  }
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &a.sa_mask, &old);
  if (a.sa_flags & SA_RESETHAND) {
    memset(&app_action, 0, sizeof app_action);
    app_action.sa_handler = SIG_DFL;
  }
  if (a.sa_flags & SA_SIGINFO)
    a.sa_sigaction(sig, si, uc);
  else
    a.sa_handler(sig);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void on_trap(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  /* Counted while ours runs (a seccomp filter waits for it); once quiet, the sampler and the
   * watchpoints see locus_quiet and only tell their signals apart. */
  int busy = locus_busy_enter();
  const struct locus_perf_siginfo *p = (const void *)si;
  if (si->si_code == TRAP_PERF && (p->perf_data & LOCUS_TRAP_COOKIE_MASK) == LOCUS_TRAP_COOKIE) {
    unsigned low = (unsigned)(p->perf_data & 0xffu);
    if (low == LOCUS_TRAP_SAMPLER) {
      if (locus_comm_trap_sampler) locus_comm_trap_sampler(si, uc);
    } else {
      locus_comm_detect_on_watch(low, si, uc);
    }
  } else if (!(locus_comm_trap_sampler && locus_comm_trap_sampler(si, uc))) {
    if (busy) locus_busy_leave(); /* the program's handler may not return */
    busy = 0;
    struct sigaction a = app_action;
    int no_handler =
        !(a.sa_flags & SA_SIGINFO) && (a.sa_handler == SIG_DFL || a.sa_handler == SIG_IGN);
    if (si->si_code == TRAP_TRACE && no_handler) {
      /* A trap flag the program cannot have set for itself (no SIGTRAP handler; a debugger
       * would have taken the trap first): ours, carried by its own pushf/popf. */
      ((ucontext_t *)uc)->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)0x100;
    } else {
      chain(sig, si, uc);
    }
  }
  if (busy) locus_busy_leave();
  errno = saved;
}

int locus_comm_trap_install(void) {
  if (atomic_load(&installed)) return 0;
  if (!get_real()) return -1;
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  int expect = 0;
  if (!atomic_compare_exchange_strong(&installed, &expect, 1)) return 0;
  if (real_sigaction(SIGTRAP, NULL, &old) != 0) {
    atomic_store(&installed, 0);
    return -1;
  }
  app_action = old;
  if (real_sigaction(SIGTRAP, &sa, NULL) != 0) {
    atomic_store(&installed, 0);
    return -1;
  }
  return 0;
}

/* ---- interposers: SIGTRAP (and SIGSEGV for the numa lens), everything else forwards ---- */
int locus_ft_sigaction(const struct sigaction *act, struct sigaction *old);
int locus_ft_installed(void);

/* Signals the program may not block while locus needs them: SIGSEGV while first touches are
 * tracked (a synchronous fault cannot wait: blocked, the first touch of a fresh page would
 * kill the thread), SIGTRAP while our samplers and watchpoints run, and the hw backend's
 * ring-buffer signal (locus_keep_signal) (blocked, a perf event's
 * SIGTRAP stays pending until the mask is restored: a worker thread that blocks every
 * signal, as xz's do, would never be sampled). Like HPCToolkit's libmonitor, the masks the
 * program sets (sigprocmask, pthread_sigmask, a handler's sa_mask) are passed on without
 * them; the program's own SIGTRAP handler is still chained. Returns set or its copy. */
static _Atomic int kept_sig; /* the hw backend's sample signal, 0: none */

void locus_keep_signal(int sig) { atomic_store(&kept_sig, sig); }

const sigset_t *locus_keep_unblocked(int how, const sigset_t *set, sigset_t *copy) {
  if (!set || how == SIG_UNBLOCK) return set;
  int segv = locus_ft_installed() && sigismember(set, SIGSEGV);
  int trap = atomic_load_explicit(&installed, memory_order_relaxed) && sigismember(set, SIGTRAP);
  int kept = atomic_load_explicit(&kept_sig, memory_order_relaxed);
  int other = kept > 0 && sigismember(set, kept) == 1;
  if (!segv && !trap && !other) return set;
  *copy = *set;
  if (segv) sigdelset(copy, SIGSEGV);
  if (trap) sigdelset(copy, SIGTRAP);
  if (other) sigdelset(copy, kept);
  return copy;
}

LOCUS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  sigaction_fn real = get_real();
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  struct sigaction unblocked;
  sigset_t mask;
  if (act && locus_keep_unblocked(SIG_BLOCK, &act->sa_mask, &mask) != &act->sa_mask) {
    unblocked = *act;
    unblocked.sa_mask = mask;
    act = &unblocked;
  }
  if (sig == SIGSEGV && locus_ft_sigaction(act, old)) return 0;
  int rc = locus_fatal_sigaction(sig, act, old, real);
  if (rc != -2) return rc;
  if (sig != SIGTRAP || !atomic_load(&installed)) return real(sig, act, old);
  if (old) *old = app_action;
  if (act) app_action = *act;
  return 0;
}

/* signal() and its variants, for the two signals locus keeps its handler in front of: the
 * program's handler is recorded as the one to chain to (kept_signal: 1, *prev its previous
 * one); 0 for every other signal, which the caller forwards. The flags are the variant's:
 * BSD's signal() and bsd_signal() restart and mask the signal in its handler; System V's
 * sysv_signal() - what signal() is in a program built with -std=c99 or -ansi, glibc's
 * headers redirecting it to __sysv_signal - neither restarts nor masks, and resets to the
 * default on delivery. zstd is one such program: its SIGSEGV handler, installed through
 * __sysv_signal, replaced the numa lens' first-touch handler, and the first touch of a
 * fresh page ran zstd's handler instead ("Caught SIGSEGV signal, printing stack", exit
 * 139). sigset() (System V) installs with no flags. */
static int kept_signal(int sig, sighandler_t handler, int flags, sighandler_t *prev) {
  /* SIG_HOLD (sigset) blocks it, and sigprocmask keeps ours unblocked; SIG_ERR is libc's
   * EINVAL to give. */
  if (handler == SIG_HOLD || handler == SIG_ERR) return 0;
  struct sigaction a, old;
  memset(&a, 0, sizeof a);
  a.sa_handler = handler;
  a.sa_flags = flags;
  sigemptyset(&a.sa_mask);
  if (!(flags & SA_NODEFER) && flags & SA_RESTART) sigaddset(&a.sa_mask, sig);
  if (sig == SIGSEGV && locus_ft_sigaction(&a, &old)) {
    *prev = old.sa_handler;
    return 1;
  }
  /* A fatal signal whose handler is the runtime's finishing one (it reads as SIG_DFL). */
  int rc = locus_fatal_sigaction(sig, &a, &old, get_real());
  if (rc != -2) {
    *prev = rc == 0 ? old.sa_handler : SIG_ERR;
    return 1;
  }
  if (sig != SIGTRAP || !atomic_load(&installed)) return 0;
  *prev = app_action.sa_handler; /* shares its storage with sa_sigaction */
  app_action = a;
  return 1;
}

#ifndef SA_INTERRUPT
#define SA_INTERRUPT 0x20000000
#endif
#define BSD_FLAGS SA_RESTART
#define SYSV_FLAGS (SA_INTERRUPT | SA_NODEFER | SA_RESETHAND)

/* One interposer of the signal() family: kept_signal, else the next definition of `name`. */
#define SIGNAL_INTERPOSER(name, flags)                                             \
  LOCUS_EXPORT sighandler_t name(int sig, sighandler_t handler) {                  \
    static sighandler_t (*next)(int, sighandler_t);                                \
    sighandler_t prev;                                                             \
    if (kept_signal(sig, handler, flags, &prev)) return prev;                      \
    if (!next) next = (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, #name); \
    if (!next) {                                                                   \
      errno = ENOSYS;                                                              \
      return SIG_ERR;                                                              \
    }                                                                              \
    return next(sig, handler);                                                     \
  }

SIGNAL_INTERPOSER(signal, BSD_FLAGS)
SIGNAL_INTERPOSER(bsd_signal, BSD_FLAGS)
SIGNAL_INTERPOSER(__sysv_signal, SYSV_FLAGS)
SIGNAL_INTERPOSER(sysv_signal, SYSV_FLAGS)
SIGNAL_INTERPOSER(sigset, 0)
