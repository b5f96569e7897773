/* The hw backend of the comm lens (see hw.h). NOT VERIFIED ON HARDWARE YET: written against
 * perf_event_open(2) and the kernel's PEBS/IBS drivers, but the development machines have
 * no PMU, so only the probe's "unavailable" path and the record parser have been run.
 *
 * Per thread: Intel opens two precise events (mem-loads with a load-latency threshold, and
 * mem-stores), AMD one IBS op event; each has its own ring buffer, so the handler knows a
 * store event's samples are stores even where data_src does not say. The kernel signals
 * the owning thread (F_SETOWN_EX, F_OWNER_TID) at every sample (wakeup_events = 1), so the
 * ring rarely holds more than one record and samples are written by the thread that made
 * the access, as locus_comm_put_sample requires. */
#define _GNU_SOURCE
#include "hw.h"

#include "../soft/soft.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EVENTS_DIR "/sys/bus/event_source/devices/"
#define SAMPLE_TYPE                                                                           \
  (PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU | \
   PERF_SAMPLE_DATA_SRC | PERF_SAMPLE_WEIGHT)
#define RING_PAGES 8 /* data pages per event (a power of two), plus the control page */
#define LDLAT 30     /* cycles: mem-loads only samples loads at least this slow */
/* Fallback encodings when sysfs names the event but the string cannot be read:
 * MEM_TRANS_RETIRED.LOAD_LATENCY and MEM_INST_RETIRED.ALL_STORES (Skylake and later). */
#define INTEL_LOADS 0x01cdu
#define INTEL_STORES 0x82d0u
#define IBS_PERIOD 0x10000u /* IBS op counts ops; its period is a multiple of 16 */

enum { HW_NONE, HW_INTEL, HW_AMD };

static struct {
  int kind;
  uint32_t type; /* perf type of the PMU (sysfs `type`) */
  uint64_t load_cfg, load_cfg1, store_cfg;
  int exclude_kernel; /* IBS on older kernels refuses exclude_kernel */
  int sig;
  size_t page;
} hw;

struct hw_event {
  int fd;
  struct perf_event_mmap_page *page;
  uint32_t flags; /* LOCUS_AC_* every sample of this event has */
};

static LOCUS_TLS struct {
  struct hw_event ev[2];
  int n;
  pid_t pid; /* process that opened ev[]: after fork the child must not touch them */
} ht;

static atomic_flag warned_thread = ATOMIC_FLAG_INIT;

static long perf_open(struct perf_event_attr *at) {
  return locus_fd_keep_high((int)syscall(SYS_perf_event_open, at, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
}

/* "event=0xcd,umask=0x1,ldlat=3": the standard Intel core PMU format (event config:0-7,
 * umask config:8-15, ldlat config1:0-15). */
static int sysfs_event(const char *dev, const char *name, uint64_t *cfg, uint64_t *cfg1) {
  char path[160], buf[256];
  strcpy(path, EVENTS_DIR);
  strcat(path, dev);
  strcat(path, "/events/");
  strcat(path, name);
  if (locus_read_small(path, buf, sizeof buf) <= 0) return -1;
  uint64_t c = 0, c1 = 0;
  for (char *p = buf; *p;) {
    char *eq = strchr(p, '='), *comma = strchr(p, ',');
    if (!comma) comma = p + strlen(p);
    uint64_t v = eq && eq < comma ? strtoull(eq + 1, NULL, 0) : 1;
    if (!strncmp(p, "event=", 6)) c |= v & 0xff;
    if (!strncmp(p, "umask=", 6)) c |= (v & 0xff) << 8;
    if (!strncmp(p, "ldlat=", 6)) c1 = v;
    p = *comma ? comma + 1 : comma;
  }
  *cfg = c;
  if (cfg1) *cfg1 = c1;
  return c ? 0 : -1;
}

static int sysfs_type(const char *dev, uint32_t *type) {
  char path[160], buf[32];
  strcpy(path, EVENTS_DIR);
  strcat(path, dev);
  strcat(path, "/type");
  if (locus_read_small(path, buf, sizeof buf) <= 0) return -1;
  *type = (uint32_t)strtoul(buf, NULL, 10);
  return 0;
}

static void fill_attr(struct perf_event_attr *at, uint64_t cfg, uint64_t cfg1) {
  memset(at, 0, sizeof *at);
  at->size = sizeof *at;
  at->type = hw.type;
  at->config = cfg;
  at->config1 = cfg1;
  at->sample_type = SAMPLE_TYPE;
  if (hw.kind == HW_AMD) {
    at->sample_period = locus_comm_cfg.period_n ? locus_comm_cfg.period_n : IBS_PERIOD;
  } else if (locus_comm_cfg.period_n) {
    at->sample_period = locus_comm_cfg.period_n;
  } else {
    /* A time period becomes a frequency the kernel adapts the count period to. */
    uint64_t ns = locus_comm_cfg.period_ns ? locus_comm_cfg.period_ns : 1000000;
    at->freq = 1;
    at->sample_freq = 1000000000ull / ns ? 1000000000ull / ns : 1;
  }
  at->precise_ip = hw.kind == HW_INTEL ? 2 : 0;
  at->exclude_kernel = (unsigned)hw.exclude_kernel;
  at->exclude_hv = 1;
  at->disabled = 1;
  at->wakeup_events = 1;
  at->use_clockid = 1;
  at->clockid = CLOCK_MONOTONIC;
}

/* Open one event on the calling thread and close it: can this machine do it? */
static int try_event(uint64_t cfg, uint64_t cfg1) {
  struct perf_event_attr at;
  fill_attr(&at, cfg, cfg1);
  long fd = perf_open(&at);
  if (fd < 0) return -errno;
  locus_fd_close((int)fd);
  return 0;
}

static void warn_errno(const char *what, int err) {
  char msg[256];
  strcpy(msg, "comm: --backend hw: ");
  strcat(msg, what);
  strcat(msg, ": ");
  strcat(msg, strerror(err));
  if (err == EACCES || err == EPERM)
    strcat(msg, " (sysctl kernel.perf_event_paranoid=2, or CAP_PERFMON)");
  strcat(msg, "; the comm lens is off");
  locus_warn(msg);
}

/* ---- the signal handler ---- */
struct drain_ctx {
  uint32_t flags;
  uint64_t now_ns, now_ticks;
  const void *uc; /* the signal's context: the callers' stack scan */
};

static void on_access(const struct locus_comm_access *a, void *arg) {
  const struct drain_ctx *c = arg;
  struct locus_comm_access x = *a;
  x.flags |= c->flags;
  if (x.ip >> 63) { /* kernel address: only when exclude_kernel was refused (old IBS) */
    locus_ct.st.kernel++;
    locus_ct.st.skipped++;
    return;
  }
  /* No data address: an IBS op that is not a memory access, or whose address is not valid. */
  if (x.addr < 4096) {
    locus_ct.st.skipped++;
    return;
  }
  /* The PMU gives no access size (8 was assumed): the instruction's memory operand does.
   * Two threads' 4-byte counters in one 8-byte word are false sharing, not true. */
  int store = (x.flags & LOCUS_AC_STORE) ? 1 : hw.kind == HW_INTEL ? 0 : -1;
  uint32_t len, fl;
  if (locus_comm_access_size(x.ip, store, &len, &fl) == 0) {
    x.len = len;
    x.flags |= fl & (store < 0 ? LOCUS_AC_STORE | LOCUS_AC_ATOMIC : LOCUS_AC_ATOMIC);
  }
  /* The record's time is CLOCK_MONOTONIC ns (use_clockid); samples carry runtime ticks. */
  uint64_t age = x.t && x.t <= c->now_ns ? c->now_ns - x.t : 0;
  x.t = c->now_ticks - (uint64_t)((double)age * locus_ticks_per_us / 1000.0);
  /* In a system library (a lock word in pthread_mutex_lock): the program's call into it. */
  if (c->uc) x.caller = locus_comm_sample_caller(x.ip, c->uc);
  locus_comm_take(&x);
}

static void drain(struct hw_event *e, int use, const void *uc) {
  struct perf_event_mmap_page *pg = e->page;
  if (!pg) return;
  uint64_t head = __atomic_load_n(&pg->data_head, __ATOMIC_ACQUIRE);
  uint64_t tail = pg->data_tail;
  if (use) {
    const char *ring = (const char *)pg + (pg->data_offset ? pg->data_offset : hw.page);
    size_t size = pg->data_size ? pg->data_size : RING_PAGES * hw.page;
    struct drain_ctx c = {e->flags, locus_mono_ns(), locus_ticks(), uc};
    /* A record that wraps the ring's end is copied here: on the handler's frame (on the
     * alternate stack), not in thread-local storage, which every thread of the program
     * carries whether or not it samples. */
    unsigned char bounce[512];
    /* A malformed record (never expected) ends the walk: the rest is skipped to head. */
    locus_hw_drain(ring, size, tail, head, SAMPLE_TYPE, on_access, &c, bounce, sizeof bounce);
  }
  __atomic_store_n(&pg->data_tail, head, __ATOMIC_RELEASE);
}

static void on_signal(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)si;
  (void)uc;
  int saved = errno;
  /* A seccomp filter is coming (locus_before_sandbox): its events are being disabled. */
  if (!locus_busy_enter()) return;
  struct locus_handler_cost c0 = locus_comm_self_begin(0, locus_ticks());
  locus_me.guard++;
  /* After the process finished its records (exit in progress) only empty the rings. */
  int use = locus_enabled && locus_ct.started;
  for (int i = 0; i < ht.n; i++) drain(&ht.ev[i], use, uc);
  if (use) {
    locus_ct.st.signals++;
    locus_comm_checkpoint(locus_ticks());
    locus_comm_self_end(c0);
  }
  locus_me.guard--;
  locus_busy_leave();
  errno = saved;
}

/* ---- per-thread events ---- */
static int open_event(struct hw_event *e, uint64_t cfg, uint64_t cfg1, uint32_t flags) {
  struct perf_event_attr at;
  fill_attr(&at, cfg, cfg1);
  long fd = perf_open(&at);
  if (fd < 0) return -errno;
  size_t len = (1 + RING_PAGES) * hw.page;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
  struct f_owner_ex owner = {F_OWNER_TID, (pid_t)locus_me.tid};
  if (p == MAP_FAILED || fcntl((int)fd, F_SETFL, O_ASYNC | O_NONBLOCK) != 0 ||
      fcntl((int)fd, F_SETSIG, hw.sig) != 0 || fcntl((int)fd, F_SETOWN_EX, &owner) != 0) {
    int err = errno;
    if (p != MAP_FAILED) munmap(p, len);
    locus_fd_close((int)fd);
    return -err;
  }
  e->fd = (int)fd;
  e->page = p;
  e->flags = flags;
  return 0;
}

static void close_event(struct hw_event *e) {
  if (e->page) munmap(e->page, (1 + RING_PAGES) * hw.page);
  locus_fd_close(e->fd);
  e->page = NULL;
  e->fd = -1;
}

/* Events inherited through fork are the parent's (they count the parent's thread): close
 * our copies without disabling them. */
static void forget_inherited(void) {
  if (ht.n && ht.pid != getpid()) {
    for (int i = 0; i < ht.n; i++) close_event(&ht.ev[i]);
    ht.n = 0;
  }
}

static void hw_thread_init(void) {
  forget_inherited();
  if (!hw.kind || ht.n) return;
  ht.pid = getpid();
  locus_comm_soft_thread_stack(); /* the callers' stack scan keeps to it */
  locus_soft_objects_changed();   /* objects dlopen'ed since: callers into them */
  int err = 0;
  if (hw.kind == HW_INTEL) {
    err = open_event(&ht.ev[0], hw.load_cfg, hw.load_cfg1, 0);
    if (!err) {
      ht.n = 1;
      err = open_event(&ht.ev[1], hw.store_cfg, 0, LOCUS_AC_STORE);
      if (!err) ht.n = 2;
    }
  } else {
    err = open_event(&ht.ev[0], 0, 0, 0);
    if (!err) ht.n = 1;
  }
  if (err && !atomic_flag_test_and_set(&warned_thread)) {
    locus_warn("comm: hw: a thread could not open its sampling events; it is not sampled:");
    locus_warn(strerror(-err));
  }
  for (int i = 0; i < ht.n; i++) ioctl(ht.ev[i].fd, PERF_EVENT_IOC_ENABLE, 0);
  locus_comm_detect_thread_init();
}

static void hw_thread_fini(void) {
  forget_inherited();
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, hw.sig);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  for (int i = 0; i < ht.n; i++) ioctl(ht.ev[i].fd, PERF_EVENT_IOC_DISABLE, 0);
  for (int i = 0; i < ht.n; i++) {
    drain(&ht.ev[i], locus_ct.started, NULL);
    close_event(&ht.ev[i]);
  }
  ht.n = 0;
  locus_comm_detect_thread_fini();
  /* A signal queued before the disable is discarded by the handler's empty rings. */
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void hw_after_fork(void) { forget_inherited(); }

/* ---- probe ---- */
static int hw_proc_init(void) {
  memset(&hw, 0, sizeof hw);
  hw.page = (size_t)sysconf(_SC_PAGESIZE);
  hw.exclude_kernel = 1;
  const char *s = getenv("LOCUS_COMM_HW_SIGNAL");
  hw.sig = s && *s ? atoi(s) : SIGRTMIN + 4;
  locus_keep_signal(hw.sig);
  const char *dev = NULL;
  static const char *const intel[] = {"cpu", "cpu_core"};
  for (int i = 0; i < 2 && !dev; i++) {
    char path[128];
    strcpy(path, EVENTS_DIR);
    strcat(path, intel[i]);
    strcat(path, "/events/mem-loads");
    if (access(path, R_OK) == 0) dev = intel[i];
  }
  if (dev) {
    hw.kind = HW_INTEL;
    if (sysfs_type(dev, &hw.type) != 0) hw.type = PERF_TYPE_RAW;
    if (sysfs_event(dev, "mem-loads", &hw.load_cfg, &hw.load_cfg1) != 0) hw.load_cfg = INTEL_LOADS;
    hw.load_cfg1 = LDLAT; /* the sysfs default (3) keeps nearly every load */
    if (sysfs_event(dev, "mem-stores", &hw.store_cfg, NULL) != 0) hw.store_cfg = INTEL_STORES;
    int err = try_event(hw.load_cfg, hw.load_cfg1);
    if (!err) err = try_event(hw.store_cfg, 0);
    if (err) {
      warn_errno("PEBS mem-loads/mem-stores with precise_ip=2", -err);
      hw.kind = HW_NONE;
      return -1;
    }
  } else if (sysfs_type("ibs_op", &hw.type) == 0) {
    hw.kind = HW_AMD;
    int err = try_event(0, 0);
    if (err == -EINVAL) {
      hw.exclude_kernel = 0;
      err = try_event(0, 0);
    }
    if (err) {
      warn_errno("AMD IBS op", -err);
      hw.kind = HW_NONE;
      return -1;
    }
  } else {
    locus_warn(
        "comm: --backend hw: no PEBS (cpu/events/mem-loads) or IBS (ibs_op) PMU on this "
        "machine; the comm lens is off (use --backend soft)");
    return -1;
  }
  if (locus_comm_decoder_open() != 0)
    locus_warn(
        "comm: --backend hw: libZydis.so.4.0 not found (apt-get install libzydis4.0): "
        "access sizes are taken as 8 bytes");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(hw.sig, &sa, NULL) != 0) {
    warn_errno("installing the sample signal handler", errno);
    hw.kind = HW_NONE;
    return -1;
  }
  return 0;
}

struct locus_comm_backend_ops locus_comm_hw = {
    .name = "hw",
    .proc_init = hw_proc_init,
    .thread_init = hw_thread_init,
    .thread_fini = hw_thread_fini,
    .proc_fini = hw_thread_fini,
    .after_fork = hw_after_fork,
};
