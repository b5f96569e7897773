/* Process life cycle: start-up (configuration from the launcher's LOCUS_* variables, the
 * process directory, proc.bin, the maps), finish (exit, _exit, fatal signals), fork
 * (a sub-run of its own) and exec (a new process entry). */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "real.h"
#include "runtime.h"

struct locus_config locus_cfg;
volatile int locus_enabled;
struct locus_proc *locus_proc_hdr;
int locus_proc_dirfd = -1;
char locus_proc_path[4096];
static char run_path[3900]; /* LOCUS_DIR, absolute */

static int run_dirfd = -1;
int locus_run_dirfd(void) { return run_dirfd; }
static _Atomic int init_state; /* 0 none, 1 running, 2 done */
static _Atomic uint64_t slow_ticks;

/* Once per run, not once per process: a script of 1000 processes under a low `ulimit -n`
 * printed the same line 1000 times. The first process to say a message leaves a mark in the
 * run directory (warned/HASH, created exclusively); the others find it and say nothing. */
static int said_in_run(const char *msg) {
  int dir = locus_run_dirfd();
  if (dir < 0 || locus_sandboxed) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *c = msg; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
  char name[32] = "warned/";
  *locus_put_hex(name + 7, h, 16) = 0;
  syscall(SYS_mkdirat, dir, "warned", 0755);
  int fd = (int)syscall(SYS_openat, dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    syscall(SYS_close, fd);
    return 0;
  }
  return errno == EEXIST;
}

void locus_warn(const char *msg) {
  int saved = errno;
  int said = said_in_run(msg);
  errno = saved;
  if (said) return;
  char buf[512];
  size_t n = strlen(msg);
  if (n > sizeof buf - 10) n = sizeof buf - 10;
  memcpy(buf, "locus: ", 7);
  memcpy(buf + 7, msg, n);
  buf[7 + n] = '\n';
  /* Not through our own write interposer; to our copy of the program's stderr (a daemon
   * may close 2 and reuse the number for a file of its own; the copy follows what the
   * program puts at 2: locus_follow_stderr). */
  ssize_t rc = syscall(SYS_write, locus_warn_fd, buf, 8 + n);
  (void)rc;
}

long locus_read_small(const char *path, char *b, size_t n) {
  int fd = (int)syscall(SYS_open, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long k = (long)syscall(SYS_read, fd, b, n - 1);
  syscall(SYS_close, fd);
  b[k > 0 ? k : 0] = 0;
  return k;
}

const char *locus_hex(const char *p, const char *end, uint64_t *v) {
  *v = 0;
  for (; p < end; p++) {
    int c = *p, d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) break;
    *v = *v * 16 + (uint64_t)d;
  }
  return p;
}

char *locus_put_hex(char *p, uint64_t v, int min_digits) {
  char d[16];
  int n = 0;
  do d[n++] = "0123456789abcdef"[v & 15];
  while ((v >>= 4) != 0);
  while (n < min_digits && n < 16) d[n++] = '0';
  while (n) *p++ = d[--n];
  return p;
}

uint64_t locus_thread_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void locus_add_self_cpu_ns(uint64_t ns) {
  locus_add_self_ticks((uint64_t)((double)ns * locus_ticks_per_us / 1000.0));
}

void locus_add_self_ticks(uint64_t ticks) {
  struct locus_self *me = &locus_me;
  if (me->state == 1)
    me->self_ticks += ticks;
  else
    atomic_fetch_add(&slow_ticks, ticks);
}

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && v[0] == '1';
}

/* One line of a maps file, with where its fields are: merged with the next when that maps
 * the same file on from where this one ends. */
struct maps_line {
  uint64_t lo, hi, off;
  size_t len, perms; /* text length; offset of the permissions field in text */
  size_t offset;     /* offset of the file-offset field */
  size_t rest;       /* offset of the field after the file offset (device, inode, path) */
  int file;          /* a path (starting with '/') */
  int merged;        /* hi moved past the text's */
  char text[400];
};

/* A hex field of s[*i..n) ended by `end`: its value, and *i past the end character. */
static int hex_field(const char *s, size_t n, size_t *i, char end, uint64_t *v) {
  const char *p = s + *i, *q = locus_hex(p, s + n, v);
  if (q == p || q >= s + n || *q != end) return -1;
  *i = (size_t)(q - s) + 1;
  return 0;
}

static int maps_parse(struct maps_line *l) {
  size_t i = 0;
  if (hex_field(l->text, l->len, &i, '-', &l->lo) || hex_field(l->text, l->len, &i, ' ', &l->hi))
    return -1;
  l->perms = i;
  while (i < l->len && l->text[i] != ' ') i++;
  l->offset = ++i;
  if (i >= l->len || hex_field(l->text, l->len, &i, ' ', &l->off)) return -1;
  l->rest = i;
  const char *slash = memchr(l->text + i, '/', l->len - i);
  l->file = slash && slash[-1] == ' ';
  l->merged = 0;
  return 0;
}

/* Written when the buffer is full (maps.dl's snapshots are taken one at a time). */
struct maps_out {
  int fd;
  size_t n;
  char buf[512];
};

static void out_write(struct maps_out *o, const char *s, size_t n) {
  if (o->n + n > sizeof o->buf && o->n) {
    syscall(SYS_write, o->fd, o->buf, o->n);
    o->n = 0;
  }
  if (n > sizeof o->buf) {
    syscall(SYS_write, o->fd, s, n);
    return;
  }
  memcpy(o->buf + o->n, s, n);
  o->n += n;
}

static void maps_flush(struct maps_out *o, struct maps_line *l) {
  if (!l->len) return;
  if (!l->merged) {
    out_write(o, l->text, l->len);
  } else {
    /* The first mapping's line, its end moved; the addresses as the kernel's %08lx. */
    char head[40], *h = locus_put_hex(head, l->lo, 8);
    *h++ = '-';
    h = locus_put_hex(h, l->hi, 8);
    *h++ = ' ';
    out_write(o, head, (size_t)(h - head));
    out_write(o, l->text + l->perms, l->len - l->perms);
  }
  l->len = 0;
}

/* Copy /proc/self/maps (raw read/write calls), replacing `to` or appended to it. The
 * runtime gives some pages a mapping each, the decoder's tables and its own read-only
 * segments (against the kernel's fault-around: soft.c isolate_pages and trim_object): 210
 * lines of one process's maps were those pages, 21-52 KiB of each copy, twice per process,
 * 130 MB of a run of 3000 processes. Adjacent mappings of one file at consecutive offsets
 * and with the same permissions are written as one line again, as the kernel lists them
 * without the split. A line longer than the buffer goes out as read. */
static void copy_file_to(const char *from, int dirfd, const char *to, int append) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) return;
  struct maps_out o;
  o.fd = openat(dirfd, to, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  o.n = 0;
  if (o.fd >= 0) {
    /* Small buffers: a page or more on the stack is resident in the program for good. */
    struct maps_line pend = {0}, cur = {0};
    char buf[1024]; /* (a maps file of 28 KiB was 112 reads of 256 bytes) */
    int raw = 0;    /* inside a line too long for cur: passed through */
    ssize_t n;
    while ((n = syscall(SYS_read, in, buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; i++) {
        char c = buf[i];
        if (raw) {
          out_write(&o, &buf[i], 1);
          raw = c != '\n';
          continue;
        }
        if (cur.len == sizeof cur.text) { /* too long: out as it comes */
          maps_flush(&o, &pend);
          out_write(&o, cur.text, cur.len);
          cur.len = 0;
          out_write(&o, &buf[i], 1);
          raw = c != '\n';
          continue;
        }
        cur.text[cur.len++] = c;
        if (c != '\n') continue;
        if (maps_parse(&cur) != 0) {
          maps_flush(&o, &pend);
          out_write(&o, cur.text, cur.len);
        } else if (pend.len && pend.file && cur.file && cur.lo == pend.hi &&
                   cur.off == pend.off + (pend.hi - pend.lo) &&
                   cur.offset - cur.perms == pend.offset - pend.perms &&
                   !memcmp(cur.text + cur.perms, pend.text + pend.perms, cur.offset - cur.perms) &&
                   cur.len - cur.rest == pend.len - pend.rest &&
                   !memcmp(cur.text + cur.rest, pend.text + pend.rest, cur.len - cur.rest)) {
          pend.hi = cur.hi;
          pend.merged = 1;
        } else {
          maps_flush(&o, &pend);
          pend = cur;
        }
        cur.len = 0;
      }
    }
    maps_flush(&o, &pend);
    if (cur.len) out_write(&o, cur.text, cur.len);
    if (o.n) syscall(SYS_write, o.fd, o.buf, o.n);
    close(o.fd);
  }
  close(in);
}

static void copy_file(const char *from, int dirfd, const char *to) {
  copy_file_to(from, dirfd, to, 0);
}

/* Whether file `name` of dirfd holds exactly the `size` bytes at `mem`. */
static int same_bytes(int dirfd, const char *name, const void *mem, size_t size) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  size_t at = 0;
  ssize_t n;
  int same = 1;
  while (same && (n = syscall(SYS_read, fd, buf, sizeof buf)) > 0) {
    same = at + (size_t)n <= size && !memcmp(buf, (const char *)mem + at, (size_t)n);
    at += (size_t)n;
  }
  close(fd);
  return same && at == size;
}

/* The vDSO's image, as vdso.so: it is no file, and the report names the samples in its
 * functions (clock_gettime, gettimeofday, getcpu) from this copy (symbolize.py). The whole
 * ELF image is mapped, its section headers last.
 * The vDSO is the kernel's, the same image in every process of a run: one copy per run
 * (RUN/vdso.so), each process's vdso.so a hard link to it when the bytes are the same
 * (6.5 KiB a process otherwise: 20 MB of a run of 3000 processes). The first process
 * writes its own and links it into the run directory. */
static void copy_vdso(int dirfd) {
  const Elf64_Ehdr *e = (const void *)getauxval(AT_SYSINFO_EHDR);
  if (!e || memcmp(e->e_ident, ELFMAG, SELFMAG) != 0 || e->e_ident[EI_CLASS] != ELFCLASS64) return;
  size_t size = (size_t)e->e_shoff + (size_t)e->e_shnum * e->e_shentsize;
  if (size < sizeof *e || size > (64u << 10)) return;
  int run = locus_run_dirfd();
  if (run >= 0 && same_bytes(run, "vdso.so", e, size) &&
      syscall(SYS_linkat, run, "vdso.so", dirfd, "vdso.so", 0) == 0)
    return;
  int out = openat(dirfd, "vdso.so", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return;
  int whole = syscall(SYS_write, out, e, size) == (long)size;
  close(out);
  if (whole && run >= 0) syscall(SYS_linkat, dirfd, "vdso.so", run, "vdso.so", 0);
}

/* The maps before a library is unloaded (dlclose): its statics and code stay nameable.
 * At most 64 per process (a plugin loop). */
void locus_maps_before_unload(void) {
  static _Atomic int taken;
  static atomic_flag busy = ATOMIC_FLAG_INIT;
  if (!locus_enabled || locus_proc_dirfd < 0 || atomic_fetch_add(&taken, 1) >= 64) return;
  /* One snapshot at a time: two threads' dlclose appended 8 KiB pieces that interleaved
   * mid-line, and a cut line gave a library a wrong base address. */
  while (atomic_flag_test_and_set(&busy)) sched_yield();
  copy_file_to("/proc/self/maps", locus_proc_dirfd, "maps.dl", 1);
  atomic_flag_clear(&busy);
}

void locus_fmt_u(char *out, unsigned v) {
  char tmp[16];
  int n = 0;
  do tmp[n++] = (char)('0' + v % 10);
  while ((v /= 10) && n < 15);
  while (n) *out++ = tmp[--n];
  *out = 0;
}

/* procs/<pid>, or procs/<pid>.<k> when an earlier image with the same pid (exec) has one. */
static int open_proc_dir(void) {
  int procs = openat(run_dirfd, "procs", O_DIRECTORY | O_CLOEXEC);
  if (procs < 0) {
    mkdirat(run_dirfd, "procs", 0755);
    procs = openat(run_dirfd, "procs", O_DIRECTORY | O_CLOEXEC);
    if (procs < 0) return -1;
  }
  char name[48];
  locus_fmt_u(name, (unsigned)getpid());
  size_t base = strlen(name);
  int fd = -1;
  for (unsigned k = 0; k < 1000 && fd < 0; k++) {
    if (k) {
      name[base] = '.';
      locus_fmt_u(name + base + 1, k);
    }
    if (mkdirat(procs, name, 0755) == 0)
      fd = openat(procs, name, O_DIRECTORY | O_CLOEXEC);
    else if (errno != EEXIST)
      break;
  }
  close(procs);
  locus_proc_path[0] = 0;
  fd = locus_fd_keep(fd);
  /* The kernel's own name for it (symbolic links resolved), which is what /proc/self/fd
   * says of the record files: locus_stream_fd compares the two. */
  char link[32] = "/proc/self/fd/";
  locus_fmt_u(link + strlen(link), (unsigned)fd);
  ssize_t n = fd >= 0 ? readlink(link, locus_proc_path, sizeof locus_proc_path - 1) : -1;
  if (n > 0 && locus_proc_path[0] == '/') {
    locus_proc_path[n] = 0;
  } else if (fd >= 0 && run_path[0] &&
             strlen(run_path) + strlen(name) + 8 < sizeof locus_proc_path) {
    strcpy(locus_proc_path, run_path);
    strcat(locus_proc_path, "/procs/");
    strcat(locus_proc_path, name);
  } else {
    locus_proc_path[0] = 0;
  }
  return fd;
}

static void on_fatal_signal(int sig, siginfo_t *si, void *uc);
/* The end of the records (finish_records, locus_exit_entered; reset in a fork child): */
static _Atomic uintptr_t finisher;   /* &locus_me of the thread finishing, 0: none yet */
static _Atomic int finished_all;     /* it has */
static _Atomic int exit_calls;       /* exit() calls so far */
static _Atomic uintptr_t exit_first; /* &locus_me of the first caller */

/* Every signal whose default action ends the process, but SIGKILL and SIGSTOP (cannot be
 * caught), SIGTRAP (the soft sampler's) and SIGSYS (a seccomp filter's verdict: the runtime
 * finished its records before the filter went on). SIGPIPE is how `prog | head` ends prog,
 * SIGALRM an alarm() nobody handles, SIGXCPU `ulimit -t`: each left an incomplete run. */
static const int fatal_sigs[] = {SIGINT,  SIGTERM,   SIGHUP,  SIGQUIT, SIGABRT, SIGSEGV,  SIGBUS,
                                 SIGFPE,  SIGILL,    SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM,  SIGXCPU,
                                 SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR,  SIGSTKFLT};

static int fatal_listed(int sig) {
  for (size_t i = 0; i < sizeof fatal_sigs / sizeof fatal_sigs[0]; i++)
    if (fatal_sigs[i] == sig) return 1;
  return 0;
}

static void fatal_action(struct sigaction *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sa_sigaction = on_fatal_signal;
  sa->sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa->sa_mask);
}

static int is_fatal_handler(const struct sigaction *a) {
  return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_fatal_signal;
}

/* A program's sigaction(sig, act, old) on an action held for it (the kernel's, or the one
 * the first-touch handler chains to): *old reads SIG_DFL for the finishing handler, and
 * SIG_DFL asked for keeps it. Returns whether `held` is to become *act. */
int locus_fatal_held(const struct sigaction *held, const struct sigaction *act,
                     struct sigaction *old) {
  int ours = is_fatal_handler(held);
  if (old) {
    *old = *held;
    if (ours) {
      memset(old, 0, sizeof *old);
      old->sa_handler = SIG_DFL;
    }
  }
  /* (sa_handler and sa_sigaction share their storage: SIG_DFL is 0 in both) */
  return act && !(ours && act->sa_handler == SIG_DFL);
}

/* The finishing handler stands for the default action, and the program sees it as that:
 * sigaction() and the signal() family report SIG_DFL where it is installed, and a program
 * asking for SIG_DFL gets it (installed again if the program's own handler had replaced
 * it). Python's signal module reads every handler at start-up and takes one it did not
 * install for None: `signal.signal(s, signal.getsignal(s))`, the save-and-restore of every
 * Python program that handles SIGTERM for a while, raised "TypeError: signal handler must
 * be signal.SIG_IGN, signal.SIG_DFL, or a callable object" under locus. Returns -2 when the
 * call is not about the finishing handler (the caller makes it), else what `real` did. */
int locus_fatal_sigaction(int sig, const struct sigaction *act, struct sigaction *old,
                          int (*real)(int, const struct sigaction *, struct sigaction *)) {
  struct sigaction cur, was, fin;
  /* After a seccomp filter: no system call of the runtime's own (the query below). */
  if (locus_sandboxed || !fatal_listed(sig) || !real || real(sig, NULL, &cur) != 0) return -2;
  int dfl = act && act->sa_handler == SIG_DFL;
  if (!is_fatal_handler(&cur) && !(dfl && locus_enabled)) return -2;
  int rc = 0;
  if (locus_fatal_held(&cur, act, &was)) {
    if (dfl) fatal_action(&fin); /* the default action, the records finished first */
    rc = real(sig, dfl ? &fin : act, NULL);
  }
  if (rc == 0 && old) *old = was;
  return rc;
}

static void install_signal_handlers(void) {
  for (size_t i = 0; i < sizeof fatal_sigs / sizeof fatal_sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(fatal_sigs[i], NULL, &old) != 0) continue;
    /* The program's own handlers (or SIG_IGN) stay; only default dispositions, which would
     * kill the process without running exit handlers, get a finishing handler. */
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL) continue;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) continue;
    struct sigaction sa;
    fatal_action(&sa);
    sigaction(fatal_sigs[i], &sa, NULL);
  }
}

/* start_ns: CLOCK_MONOTONIC when the runtime began setting the process up (the start-up's
 * time counts in self_ns: a later start made /bin/true's runtime time exceed its life). */
static int open_proc_header(int ppid_known_fork, uint64_t start_ns) {
  int fd = openat(locus_proc_dirfd, "proc.bin", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  /* The file holds exactly one record; the mapping is a page (bytes past the end of the
   * file within its last page are valid memory, just not stored). */
  /* Blocks reserved (a full disk: no mapping that would SIGBUS the program), within
   * RLIMIT_FSIZE (no SIGXFSZ). */
  if (fd < 0 || locus_file_reserve(fd, 0, sizeof(struct locus_proc)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return -1;
  struct locus_proc *h = p;
  memset(h, 0, sizeof *h);
  h->format_version = LOCUS_FORMAT_VERSION;
  h->pid = (uint32_t)getpid();
  h->ppid = (uint32_t)getppid();
  h->clock = (uint32_t)locus_clock_kind;
  h->tsc0 = locus_ticks();
  h->ns0 = locus_mono_ns();
  h->tsc1 = h->tsc0;
  h->ns1 = h->ns0;
  h->start_ns = start_ns ? start_ns : h->ns0;
  h->exit_status = INT32_MIN;
  h->flags = ppid_known_fork ? LOCUS_PROC_FORKED : 0;
  /* The magic goes last: a reader seeing it knows the header is whole. */
  atomic_signal_fence(memory_order_release);
  h->magic = LOCUS_PROC_MAGIC;
  locus_proc_hdr = h;
  return 0;
}

static void start_process(int forked) {
  uint64_t t0 = locus_ticks(), before = atomic_load(&slow_ticks), ns = locus_mono_ns();
  locus_proc_dirfd = open_proc_dir();
  if (locus_proc_dirfd < 0 || open_proc_header(forked, ns) != 0) {
    locus_warn("cannot create the process directory in LOCUS_DIR; this process is not recorded");
    return;
  }
  copy_file("/proc/self/maps", locus_proc_dirfd, "maps");
  copy_vdso(locus_proc_dirfd);
  locus_threads_open();
  locus_stack_open();
  locus_lenses_init();
  locus_enabled = 1;
  install_signal_handlers();
  /* Register the main thread now: lenses that sample (comm) start with it. */
  locus_self_get();
  /* The start-up's wall time, less what its parts already counted (stream claims, the comm
   * lens's set-up): counted twice, /bin/true's runtime time exceeded its lifetime. */
  uint64_t wall = locus_ticks() - t0;
  uint64_t counted = atomic_load(&slow_ticks) - before;
  if (locus_me.state == 1) counted += locus_me.self_ticks;
  atomic_fetch_add(&slow_ticks, wall > counted ? wall - counted : 0);
}

static void after_fork_child(void) {
  /* A sandboxed parent's header is not the child's (no getpid() to tell them apart later). */
  if (locus_sandboxed) locus_proc_hdr = NULL;
  /* The parent's other threads ending it (exit, a finishing handler) are not the child's. */
  atomic_store(&finisher, 0);
  atomic_store(&finished_all, 0);
  atomic_store(&exit_calls, 0);
  atomic_store(&exit_first, 0);
  /* Only the forking thread goes on: the parent's other threads' work in flight is not the
   * child's to wait for (locus_before_sandbox). */
  atomic_store(&locus_busy, 0);
  if (!locus_enabled) return;
  /* The signals that end a process wait until the child's records are set up: a pool
   * that terminates a worker just forked would otherwise leave it half-recorded. */
  sigset_t ends, old;
  sigemptyset(&ends);
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&ends, sigs[i]);
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, &ends, &old, sizeof(uint64_t));
  locus_enabled = 0;
  locus_fd_close(locus_proc_dirfd);
  locus_proc_hdr = NULL; /* the parent's mapping stays the parent's */
  atomic_store(&slow_ticks, 0);
  locus_proc_dirfd = open_proc_dir();
  if (locus_proc_dirfd >= 0 && open_proc_header(1, 0) == 0) {
    copy_file("/proc/self/maps", locus_proc_dirfd, "maps");
    copy_vdso(locus_proc_dirfd);
    locus_threads_after_fork();
    locus_stack_after_fork();
    locus_lenses_after_fork();
    locus_enabled = 1;
  }
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof(uint64_t));
}

static void read_config(void) {
  const char *dir = getenv("LOCUS_DIR");
  if (!dir || !*dir) return;
  run_dirfd = locus_fd_keep(open(dir, O_DIRECTORY | O_CLOEXEC));
  run_path[0] = 0;
  if (dir[0] == '/' && strlen(dir) < sizeof run_path) {
    strcpy(run_path, dir);
  } else if (getcwd(run_path, sizeof run_path - 1) &&
             strlen(run_path) + strlen(dir) + 2 < sizeof run_path) {
    strcat(run_path, "/");
    strcat(run_path, dir);
  } else {
    run_path[0] = 0;
  }
  if (run_dirfd < 0) {
    locus_warn("LOCUS_DIR is not a directory; nothing is recorded");
    return;
  }
  locus_cfg.call_stack = env_flag("LOCUS_CALL_STACK");
  locus_cfg.time_all = env_flag("LOCUS_TIME_ALL");
  const char *mi = getenv("LOCUS_MIN_INTERVAL_US");
  locus_cfg.min_interval_us = mi ? strtod(mi, NULL) : 20.0;
  if (locus_cfg.time_all) locus_cfg.min_interval_us = 0;
  const char *l = getenv("LOCUS_LENSES");
  strncpy(locus_cfg.lenses, l ? l : "locks", sizeof locus_cfg.lenses - 1);
  locus_cfg.active = 1;
}

void locus_ensure_init(void) {
  int expect = 0;
  if (!atomic_compare_exchange_strong(&init_state, &expect, 1)) return;
  locus_real_resolve();
  locus_fds_init();
  read_config();
  locus_clock_init(run_dirfd);
  if (locus_cfg.active) {
    start_process(0);
    pthread_atfork(NULL, NULL, after_fork_child);
  }
  atomic_store(&init_state, 2);
}

__attribute__((constructor(101))) static void locus_ctor(void) { locus_ensure_init(); }

static void finish_records(int status, uint32_t flags);

void locus_proc_finish(int status, uint32_t flags) {
  if (!locus_proc_hdr) return;
  /* A vfork child (or a raw clone) shares or copies our state without a fork handler:
   * it must not finish the parent's run. After a seccomp filter there is no getpid(): the
   * records ended at the filter (locus_enabled is 0), and the end and status are written
   * with the vDSO's clock; a vfork child that ends first is not told apart. */
  if (!locus_sandboxed && (uint32_t)getpid() != locus_proc_hdr->pid) return;
  finish_records(status, flags);
}

/* One thread finishes the records. Another that ends the process meanwhile (exit() or
 * _exit() in two threads at once, a fatal signal in one while another exits) waits until
 * they are whole, at most FINISH_WAIT_NS (the finishing thread may be waiting for it: an
 * exit handler joining it), rather than ending the process with them half-written. */
#define FINISH_WAIT_NS 2000000000ull
/* ...and at most START_WAIT_NS for it to start (an exit handler of the program's own runs
 * before the runtime's: one that joins the waiting thread would otherwise hold both). */
#define START_WAIT_NS 500000000ull

void locus_wait_finished(void) {
  if (locus_sandboxed) return; /* (nanosleep is a system call) */
  /* Nothing to wait for: no records, or none being kept and nobody finishing them. */
  if (!locus_proc_hdr || (!atomic_load(&finisher) && !locus_enabled)) return;
  uint64_t t0 = locus_mono_ns();
  for (uint64_t now = t0; !atomic_load(&finished_all) && now < t0 + FINISH_WAIT_NS &&
                          (atomic_load(&finisher) || now < t0 + START_WAIT_NS);
       now = locus_mono_ns()) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

/* exit() from two threads at once: glibc runs the exit handlers (the runtime's destructor,
 * which finishes the records, among them) in the first; the second, finding none left,
 * ends the process at once: 5 runs in 40 of three threads and main calling exit() read
 * "incomplete". The second waits for the records. Returns 1 for the first caller. */
int locus_exit_entered(void) {
  uintptr_t me = (uintptr_t)&locus_me;
  if (atomic_fetch_add(&exit_calls, 1) == 0) {
    atomic_store(&exit_first, me);
    return 1;
  }
  /* exit() again in the first caller (from an exit handler): nothing to wait for */
  if (atomic_load(&exit_first) != me && atomic_load(&finisher) != me) locus_wait_finished();
  return 0;
}

static void finish_body(int status, uint32_t flags) {
  locus_enabled = 0; /* interposers from here on forward only */
  int interrupted_runtime = locus_me.guard > 0;
  locus_me.guard++;
  if (!interrupted_runtime) {
    locus_lenses_proc_fini();
    locus_thread_finish();
  }
  struct locus_proc *h = locus_proc_hdr;
  if (!h) return;
  h->tsc1 = locus_ticks();
  h->ns1 = locus_mono_ns();
  h->end_ns = h->ns1;
  if (status != INT32_MIN) h->exit_status = status;
  h->threads = locus_thread_count();
  h->self_ns += (uint64_t)((double)atomic_load(&slow_ticks) * 1000.0 / locus_ticks_per_us);
  atomic_signal_fence(memory_order_release);
  h->flags |= flags;
  copy_file("/proc/self/maps", locus_proc_dirfd, "maps.exit");
  locus_me.guard--;
}

static void finish_records(int status, uint32_t flags) {
  uintptr_t me = (uintptr_t)&locus_me, owner = atomic_load(&finisher);
  if (owner && owner != me) { /* another thread is finishing them, or has */
    locus_wait_finished();
    if (!atomic_load(&finished_all)) return; /* gave up waiting */
    /* (finished: below, the end and status of a process that goes on after a seccomp
     * filter) */
  }
  if (!locus_enabled) {
    /* Ended (a pool's SIGTERM) while a forked child was still setting up its records:
     * nothing of it is half-written, only its end is missing. Already finished: nothing. */
    struct locus_proc *h = locus_proc_hdr;
    if (h->flags & (LOCUS_PROC_EXITED | LOCUS_PROC_SIGNALED | LOCUS_PROC_EXECED)) return;
    h->end_ns = locus_mono_ns();
    if (status != INT32_MIN) h->exit_status = status;
    atomic_signal_fence(memory_order_release);
    h->flags |= flags;
    return;
  }
  owner = 0;
  if (!atomic_compare_exchange_strong(&finisher, &owner, me)) {
    if (owner != me) locus_wait_finished();
    return;
  }
  finish_body(status, flags);
  atomic_store(&finished_all, 1);
}

__attribute__((destructor(101))) static void locus_dtor(void) {
  locus_proc_finish(INT32_MIN, LOCUS_PROC_EXITED);
}

static void on_fatal_signal(int sig, siginfo_t *si, void *uc) {
  (void)si;
  (void)uc;
  int saved = errno;
  locus_proc_finish(-sig, LOCUS_PROC_SIGNALED);
  errno = saved;
  /* SA_RESETHAND restored the default action: re-raise it (it is delivered when this
   * handler returns; a faulting instruction simply faults again). */
  raise(sig);
}

/* seccomp: a filter the program installs (prctl(PR_SET_SECCOMP), seccomp(2) through libc's
 * syscall(), as libseccomp does) applies to the runtime's system calls too, and an allow-list
 * refuses them: stress-ng's seccomp workers were killed by SIGSYS at the runtime's getpid()
 * in _exit. A filter that lets the runtime's calls through changes nothing (seccomp.c);
 * before any other, while system calls still work, every thread's sampling stops (timers
 * deleted, perf events disabled, page protections lifted) and the records are finished, as at
 * exit; from then on the runtime makes none (interposers forward, handlers return at once,
 * the exit writes its status to the mapped header). The process goes on unrecorded. A
 * filter installed with a raw system call (Chromium's sandbox) is not seen. */
volatile int locus_sandboxed;
_Atomic int locus_quiet, locus_busy;

void locus_before_sandbox(void) {
  if (!locus_enabled || atomic_load(&locus_quiet) || !locus_proc_hdr ||
      (uint32_t)getpid() != locus_proc_hdr->pid)
    return;
  atomic_store(&locus_quiet, 1);
  /* A handler preempted halfway, a thread starting or ending: 1 s at most (a count left by
   * a handler the program jumped out of must not hang it). */
  for (uint64_t until = locus_mono_ns() + 1000000000ull;
       atomic_load(&locus_busy) > 0 && locus_mono_ns() < until;)
    sched_yield();
  locus_lenses_sandbox();
  locus_fds_disable_perf();
  locus_proc_hdr->sandbox_ns = locus_mono_ns();
  finish_records(INT32_MIN, LOCUS_PROC_SANDBOXED);
  locus_sandboxed = 1;
}

void locus_before_exec(void) {
  if (!locus_enabled || !locus_proc_hdr || (uint32_t)getpid() != locus_proc_hdr->pid) return;
  locus_proc_hdr->exec_ns = locus_mono_ns();
  locus_proc_finish(INT32_MIN, LOCUS_PROC_EXECED);
}

void locus_after_failed_exec(void) {
  /* exec failed and the image goes on, unrecorded: its record ends here, complete. */
  if (locus_proc_hdr && (uint32_t)getpid() == locus_proc_hdr->pid &&
      (locus_proc_hdr->flags & LOCUS_PROC_EXECED)) {
    locus_proc_hdr->exec_ns = 0;
    locus_proc_hdr->flags = (locus_proc_hdr->flags & ~LOCUS_PROC_EXECED) | LOCUS_PROC_EXITED;
  }
}
