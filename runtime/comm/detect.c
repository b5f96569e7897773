/* ComDetective's communication detection (Algorithm 1 of "ComDetective: A Lightweight
 * Communication Detection Tool for Threads", SC'19), shared by the sampling backends.
 *
 * A process-wide BulletinBoard maps a cache line to the last sampled store on it (address,
 * length, thread, cpu, ip, time). On every sample of thread T:
 *   1. look the line up; an entry written by another thread after T's previous sample
 *      (t_prev) is a communication: true sharing if the byte ranges overlap, else false;
 *   2. otherwise T arms its debug registers on an unexpired line another thread published
 *      (reservoir sampling decides whether it replaces what is armed); a trap on it is a
 *      communication with the publisher, and the watchpoints on that line are disarmed;
 *   3. a store is published on the board.
 * A publication expires after two more samples of its publisher (the paper's "two store
 * samples", with its other samples counted too), i.e. after at most two sampling periods of
 * the publisher's own clock: the sampling clock is each thread's CPU time (task-clock), and
 * a period of wall time is not one of a thread that is time-sliced or blocked (with more
 * threads than CPUs, a lifetime of one period of wall time left 11 % of the samples on
 * shared lines without any candidate). A thread that ends expires its publications. A
 * publisher that is not running (not sampled for two periods of wall time) stands for its
 * last stores only: its publication is then a candidate only for a thread not sampled on the
 * line lately, or not sampled at all since (stale()): readers that keep loading the lines of
 * a descheduled writer took them already.
 *
 * Beyond the paper: step 2 prefers, among the unexpired candidates, the lines this thread
 * itself was sampled on lately (its last TOUCHED distinct lines): a watchpoint traps only
 * when this thread touches the line, and the paper's uniform choice spent a quarter of the
 * armings (4 threads on 2 CPUs, comm_writevol) on lines it never touches (other threads'
 * stacks and private arrays). Any candidate is taken when none is on such a line.
 *
 * Volumes are in samples: 1 for a sample detection, L/(D*M) for a trap (line size L, D = 8
 * bytes watched per register, M registers armed on the line).
 *
 * Beyond the paper (LOCUS_COMM_WATCH_LOADS, the soft backend's default): a timer samples
 * time, not accesses, so the few stores of a hand-off spun on with loads (a mailbox, a ring's
 * indices) are almost never sampled, nothing is published, and the paper's steps never see
 * the line. A sampled load that step 1 leaves unresolved (no other thread's store found on
 * its line) is therefore published on a second board, which step 1 never reads. When a
 * thread's sample finds no store to detect or arm on, and another thread's unresolved load
 * is on the same 8-byte chunk as its own sampled access (both wait on one word; unexpired,
 * as above, counted in its load samples), it arms write-only watchpoints on the chunks that
 * hold the loaded bytes. Its store there
 * invalidates the reader's copy, which the reader's next access takes back: the reader's
 * sample was spent on a line another thread writes. That resolves the reader's sample, once
 * (the entry is marked confirmed): one communication from the storing thread to the reader
 * (LOCUS_CE_LOADED), volume 1, the reader's sample. True sharing when the store's bytes
 * overlap the load's. A reader whose samples step 1 resolves (a writer's stores beside its
 * flag, sampled often) publishes no load: false sharing beside a spun-on field stays false.
 *
 * The board is written and read from signal handlers of all threads: each entry carries a
 * seqlock; a writer that finds it taken skips its publication, a reader that keeps seeing
 * it change gives up. Nobody waits. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <stddef.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <ucontext.h>
#include <unistd.h>

#include "comm.h"
#include "shared.h"
#include "soft/soft.h"

#define MAX_WP 4
#define WP_BYTES 8u
#define RECENT 64u       /* ring of recently published slots: where arming looks */
#define PUBLISHERS 4096u /* store-sample counters, by thread serial (mod) */
#define READ_TRIES 4
#define ARM_WINDOW 64u /* armings over which a thread's trap yield is counted */
#define ARM_SKIP_MAX 16u
#define TOUCHED 16u /* lines a thread was sampled on lately: step 2 prefers them */
#define LIFETIME 2u /* a publication's lifetime, in sampling periods of its publisher */
/* A watch of a thread on the scheduler's tick ends after this many of its context switches
 * without a trap (watch_expiry). */
#define WATCH_SWITCHES 8u

struct bb_entry { /* 64 bytes */
  _Atomic uint32_t seq;
  uint32_t tid;
  uint64_t line;
  uint64_t addr;
  uint64_t ip;
  uint64_t caller; /* the program's call into the system library ip is in, 0 none */
  uint64_t t;
  uint16_t len;
  int16_t cpu;
  uint16_t serial; /* publisher's thread serial, mod PUBLISHERS */
  uint16_t loaded; /* a sampled load (the load board): 1, 2 once a trap resolved it; else 0 */
  uint32_t pubno;  /* publisher's sampled periods (pubclock) when it published this */
  uint32_t weight; /* sampling periods the publishing sample stands for */
};
_Static_assert(sizeof(struct bb_entry) == 64, "a bulletin board entry is one cache line");
_Static_assert(PUBLISHERS <= 65536, "serial is 16 bits");

static struct bb_entry *board;
static struct bb_entry *loads; /* the load board (watch_loads), board_cap entries after board */
static uint32_t board_cap;     /* entries mapped: --bulletin-size, a power of two */
static _Atomic uint32_t board_mask; /* entries in use - 1: grows with the threads */
static _Atomic uint32_t recent[RECENT];
static _Atomic uint32_t recent_next;
/* Sampling periods each thread (by serial, mod) has been sampled for: its CPU time, the
 * clock publications expire by. */
static _Atomic uint32_t pubclock[PUBLISHERS];
static _Atomic uint64_t pubtime[PUBLISHERS]; /* time of each thread's latest sample */
static _Atomic int board_state;              /* 0 none, 1 being made, 2 ready */
static pid_t board_pid;
static uint64_t period_ticks;

/* ---- the board between processes ----
 * Memory that processes of the run map shared (shared.c) is one memory at different
 * addresses: a board per process never sees a line pass between them. Its publications also
 * go to a board all the run's processes map (comm.board in the run directory, made by the
 * launcher), keyed by the mapped object and the line's offset in it; step 1 looks a sample
 * on such memory up there too, and step 2 takes the other processes' unexpired publications
 * there as candidates, at this process's address of the line. An entry of another process
 * is the only kind read (a thread of this process is on the process's own board). Times are
 * the run's clock (the TSC, machine-wide; entries of a process on another clock are not
 * compared). A publication of another process expires after XB_LIFETIME periods of wall time:
 * its publisher's sampled periods are counted in its own process. */
#define XB_ENTRIES 4096u
#define XB_RECENT 64u
#define XB_LIFETIME 4u
#define XB_SERIAL 0xffffu /* bb_entry.serial of a candidate from another process */
struct xb_head {
  uint32_t magic, cap;
  _Atomic uint32_t recent_next;
  uint32_t unused;
  _Atomic uint32_t recent[XB_RECENT];
};
struct xb_entry { /* 128 bytes */
  _Atomic uint32_t seq;
  uint32_t tid;
  int32_t pid;
  uint32_t dev;
  uint64_t ino;
  uint64_t line; /* offset of the line in the object */
  uint64_t addr; /* offset of the access */
  uint64_t ip, caller, t;
  uint16_t len;
  int16_t cpu;
  uint32_t weight;
  int32_t clock; /* locus_clock_kind of the publisher */
  uint8_t unused[52];
};
_Static_assert(sizeof(struct xb_entry) == 128, "an entry between processes is two lines");
_Static_assert(sizeof(struct xb_head) <= 4096, "the header is one page");
#define XB_BYTES (4096u + XB_ENTRIES * sizeof(struct xb_entry))
static struct xb_head *xb;   /* NULL: not between processes */
static struct xb_entry *xbe; /* the entries, after the header's page */
static pid_t xb_pid;         /* this process (a fork child's getpid differs) */

struct detect_tls {
  uint64_t t_prev; /* time of this thread's previous sample */
  uint64_t t_trap; /* newest publication counted by a trap */
  uint64_t rng;
  pid_t pid;     /* process that opened the fds (fork check) */
  int8_t nwp;    /* watchpoints opened */
  int8_t want;   /* watchpoints to open at the first arming (0 once tried) */
  int8_t parked; /* locus_comm_detect_park: watchpoints to open again when unparked, plus 1 */
  int8_t armed;  /* watchpoints armed on `on` */
  int fds[MAX_WP];
  int sw_fd1;            /* the context-switch counter (watch_expiry): its fd + 1; 0 none */
  uint8_t chunk[MAX_WP]; /* the 8-byte chunk of on.line each armed register watches */
  uint32_t seen;         /* reservoir: candidates seen since the armed one was chosen */
  uint32_t weight;       /* periods of the sample being handled (arm() keeps it for the trap) */
  uint32_t arm_weight;
  /* Armings on stores and their traps, halved every ARM_WINDOW armings: [1] on lines this
   * thread touched lately, [0] on others. */
  uint8_t arms[2], hits[2];
  uint8_t on_near; /* `on` is on a line this thread touched lately */
  uint8_t ntouched;
  uint8_t sw_on;   /* the counter is enabled: counting the armed watch's switches */
  uint8_t on_tick; /* locus_comm_detect_on_tick: the thread switches context often */
  /* Keys (line_key) of the distinct lines of this thread's latest samples: a per-thread
   * static TLS budget (tests/integration/test_process.py) keeps them 2 bytes each. */
  uint16_t touched[TOUCHED];
  struct bb_entry on; /* the publication being watched */
};
_Static_assert(ARM_WINDOW <= 255, "arms and hits are bytes");
_Static_assert(MAX_WP + 1 <= 127, "nwp, want, parked and armed are bytes");
static LOCUS_TLS struct detect_tls dt;
static LOCUS_TLS uint64_t wp_parking __attribute__((aligned(8)));

static uint64_t rnd(void) {
  uint64_t x = dt.rng ? dt.rng : 0x9e3779b97f4a7c15ull;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  dt.rng = x;
  return x;
}

static inline uint32_t xb_slot(const struct locus_shared_loc *l) {
  uint64_t h = (l->ino * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)l->dev << 32) ^
               (l->off / locus_comm_cfg.line * 0xc2b2ae3d27d4eb4full);
  return (uint32_t)(h >> 40) & (XB_ENTRIES - 1);
}

/* A consistent copy of the entry between processes for line l (l->off: the line's offset);
 * 0 when it holds a publication of another process on that line, on this process's clock. */
static int xb_read(const struct locus_shared_loc *l, struct xb_entry *out) {
  const struct xb_entry *e = &xbe[xb_slot(l)];
  for (int i = 0; i < READ_TRIES; i++) {
    uint32_t s1 = atomic_load_explicit((_Atomic uint32_t *)&e->seq, memory_order_acquire);
    if (s1 & 1) continue;
    memcpy((char *)out + 4, (const char *)e + 4, offsetof(struct xb_entry, unused) - 4);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit((_Atomic uint32_t *)&e->seq, memory_order_relaxed) != s1) continue;
    return out->t && out->pid != xb_pid && out->ino == l->ino && out->dev == l->dev &&
                   out->line == l->off && out->clock == locus_clock_kind
               ? 0
               : -1;
  }
  return -1;
}

/* Publish a sampled store on memory processes share (l: its line), for the other processes. */
static void xb_publish(const struct locus_comm_access *a, const struct locus_shared_loc *l,
                       uint64_t line) {
  uint32_t slot = xb_slot(l);
  struct xb_entry *e = &xbe[slot];
  uint32_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);
  if ((s & 1) || !atomic_compare_exchange_strong(&e->seq, &s, s + 1)) return;
  atomic_thread_fence(memory_order_release);
  e->tid = locus_me.tid;
  e->pid = xb_pid;
  e->dev = l->dev;
  e->ino = l->ino;
  e->line = l->off;
  e->addr = l->off + (a->addr - line);
  e->ip = a->ip;
  e->caller = a->caller;
  e->t = a->t;
  e->len = (uint16_t)a->len;
  e->cpu = (int16_t)a->cpu;
  e->weight = dt.weight;
  e->clock = locus_clock_kind;
  atomic_store_explicit(&e->seq, s + 2, memory_order_release);
  uint32_t r = atomic_fetch_add_explicit(&xb->recent_next, 1, memory_order_relaxed);
  atomic_store_explicit(&xb->recent[r % XB_RECENT], slot, memory_order_relaxed);
}

/* x as a publication on this process's board, serial XB_SERIAL: at `line` when not 0 (the
 * address the sample reached it by: the memory may be mapped twice), else at this process's
 * address of it; -1 when this process does not map it. */
static int xb_local(const struct xb_entry *x, uint64_t line, struct bb_entry *c) {
  struct locus_shared_loc l = {.ino = x->ino, .off = x->line, .dev = x->dev};
  if (!line && locus_shared_addr(&l, &line) != 0) return -1;
  memset(c, 0, sizeof *c);
  c->tid = x->tid;
  c->line = line;
  c->addr = line + (x->addr - x->line);
  c->ip = x->ip;
  c->caller = x->caller;
  c->t = x->t;
  c->len = x->len;
  c->cpu = x->cpu;
  c->serial = XB_SERIAL;
  c->weight = x->weight;
  return 0;
}

static inline uint32_t slot_of(uint64_t line) {
  return (uint32_t)((line / locus_comm_cfg.line * 0x9e3779b97f4a7c15ull) >> 40) &
         atomic_load_explicit(&board_mask, memory_order_relaxed);
}

/* Copy a consistent entry of a board; 0 when one was read. */
static int read_entry(const struct bb_entry *tab, uint32_t slot, struct bb_entry *out) {
  const struct bb_entry *e = &tab[slot];
  for (int i = 0; i < READ_TRIES; i++) {
    uint32_t s1 = atomic_load_explicit((_Atomic uint32_t *)&e->seq, memory_order_acquire);
    if (s1 & 1) continue;
    memcpy((char *)out + 4, (const char *)e + 4, sizeof *out - 4);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit((_Atomic uint32_t *)&e->seq, memory_order_relaxed) == s1)
      return out->t ? 0 : -1;
  }
  return -1;
}

/* Publish a sampled store on the board, or a sampled load on the load board. */
static void publish(const struct locus_comm_access *a, uint64_t line, int loaded) {
  uint32_t slot = slot_of(line);
  struct bb_entry *e = loaded ? &loads[slot] : &board[slot];
  uint32_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);
  if ((s & 1) || !atomic_compare_exchange_strong(&e->seq, &s, s + 1)) return;
  atomic_thread_fence(memory_order_release);
  uint32_t serial = locus_me.serial % PUBLISHERS;
  e->tid = locus_me.tid;
  e->line = line;
  e->addr = a->addr;
  e->ip = a->ip;
  e->caller = a->caller;
  e->t = a->t;
  e->len = (uint16_t)a->len;
  e->cpu = (int16_t)a->cpu;
  e->serial = (uint16_t)serial;
  e->pubno = atomic_load_explicit(&pubclock[serial], memory_order_relaxed);
  e->loaded = (uint16_t)loaded;
  e->weight = dt.weight;
  atomic_store_explicit(&e->seq, s + 2, memory_order_release);
  if (loaded) return; /* step 2's candidates are stores */
  uint32_t r = atomic_fetch_add_explicit(&recent_next, 1, memory_order_relaxed);
  atomic_store_explicit(&recent[r % RECENT], slot, memory_order_relaxed);
  locus_ct.st.published++;
}

/* A publication expires once its publisher has been sampled LIFETIME more periods (see the
 * top of the file). */
static int expired(const struct bb_entry *e) {
  if (e->serial == XB_SERIAL) {
    uint64_t now = locus_ticks();
    return now > e->t && now - e->t > XB_LIFETIME * period_ticks;
  }
  return atomic_load_explicit(&pubclock[e->serial % PUBLISHERS], memory_order_relaxed) - e->pubno >=
         LIFETIME;
}

/* The calling thread has been sampled for `periods` more at `now` (only it writes its
 * counters). */
static void advance_clock(uint32_t periods, uint64_t now) {
  uint32_t serial = locus_me.serial % PUBLISHERS;
  _Atomic uint32_t *c = &pubclock[serial];
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + periods,
                        memory_order_relaxed);
  atomic_store_explicit(&pubtime[serial], now, memory_order_relaxed);
}

/* A publication whose publisher is not running (no sample of it for two periods of wall
 * time: descheduled, blocked) stands for its last stores only, not for stores it goes on
 * making: it is a candidate for a thread that was not sampled on its line lately, or not
 * sampled at all since it was made (the window of step 1). A thread that touches the line
 * all along has taken the line already. */
static int stale(const struct bb_entry *e, int near, uint64_t now) {
  /* (count-based hw sampling: a thread's samples are N accesses apart, at no known time
   * interval, so whether its publisher runs cannot be told: the lifetime rule only) */
  if (locus_comm_cfg.period_n || e->serial == XB_SERIAL) return 0;
  uint64_t last = atomic_load_explicit(&pubtime[e->serial % PUBLISHERS], memory_order_relaxed);
  if (now <= last || now - last <= 2 * period_ticks) return 0;
  return near && e->t <= dt.t_prev;
}

/* A line's key in the touched ring: 15 bits of a hash, never 0 (an empty slot). Two lines
 * with one key (1 in 2^15) only make a candidate look touched. */
static uint16_t line_key(uint64_t line) {
  return (uint16_t)(((line / locus_comm_cfg.line) * 0x9e3779b97f4a7c15ull) >> 48) | 1u;
}

/* Was this thread sampled lately on the line of key k (line_key)? */
static int touched_key(uint16_t k) {
  for (uint32_t i = 0; i < TOUCHED; i++)
    if (dt.touched[i] == k) return 1;
  return 0;
}

static int touched(uint64_t line) { return touched_key(line_key(line)); }

static int overlap(uint64_t a, uint32_t alen, uint64_t b, uint32_t blen) {
  return a < b + blen && b < a + alen;
}

static uint8_t off_in_line(uint64_t addr, uint64_t line) {
  return (uint8_t)(addr > line ? (addr - line) & 0xff : 0);
}

static uint8_t len_in_line(uint64_t addr, uint32_t len, uint64_t line) {
  uint64_t end = addr + len, lend = line + locus_comm_cfg.line;
  if (addr < line) addr = line;
  if (end > lend) end = lend;
  return (uint8_t)(end > addr ? (end - addr) : 0);
}

static void write_event(const struct bb_entry *src, uint64_t t, uint32_t dst_tid, uint64_t dst_addr,
                        uint32_t dst_len, uint64_t dst_ip, uint64_t dst_caller, uint32_t dst_flags,
                        int dst_cpu, uint16_t flags, double volume) {
  struct locus_comm_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t = t;
  ev.line = src->line;
  ev.src_ip = src->ip;
  ev.dst_ip = dst_ip;
  ev.src_caller = src->caller;
  ev.dst_caller = dst_caller;
  ev.volume = volume;
  ev.src_tid = src->tid;
  ev.dst_tid = dst_tid;
  ev.src_cpu = (int16_t)src->cpu;
  ev.dst_cpu = (int16_t)dst_cpu;
  ev.src_off = off_in_line(src->addr, src->line);
  ev.src_len = len_in_line(src->addr, src->len, src->line);
  ev.dst_off = off_in_line(dst_addr, src->line);
  ev.dst_len = len_in_line(dst_addr, dst_len, src->line);
  if (overlap(src->addr, src->len, dst_addr, dst_len)) flags |= LOCUS_CE_TRUE;
  struct locus_shared_loc l;
  if (src->serial == XB_SERIAL && locus_shared_find(src->line, &l) == 0) {
    flags |= LOCUS_CE_PROCS;
    ev.reserved[0] = l.ino;
    ev.reserved[1] = l.off;
    ev.reserved[2] = l.dev;
  }
  ev.flags = flags;
  ev.kind = 1;
  ev.dst_flags = dst_flags;
  locus_comm_put_event(&ev);
}

/* ---- watchpoints ---- */
static void bp_attr(struct perf_event_attr *attr, uint64_t addr, int idx, int disabled,
                    int writes_only) {
  memset(attr, 0, sizeof *attr);
  attr->size = sizeof *attr;
  attr->type = PERF_TYPE_BREAKPOINT;
  attr->bp_type = writes_only ? HW_BREAKPOINT_W : HW_BREAKPOINT_RW;
  attr->bp_addr = addr;
  attr->bp_len = HW_BREAKPOINT_LEN_8;
  attr->sample_period = 1;
  attr->disabled = (uint64_t)disabled;
  attr->sigtrap = 1;
  attr->remove_on_exec = 1;
  attr->exclude_kernel = 1;
  attr->exclude_hv = 1;
  attr->sig_data = LOCUS_TRAP_COOKIE | (uint64_t)idx;
}

/* ---- watch expiry ----
 * An enabled breakpoint costs at each context switch of its thread (perf installs and
 * removes the debug registers; in a VM each write exits to the hypervisor): sysbench mutex,
 * whose threads switch ~6,000 times a second, ran x1.15-1.18 of its plain time with its
 * watchpoints against x1.07 without, and x1.21 with registers armed all along on a line
 * no thread touched (no trap at all). A watch that does not trap stays armed until the
 * thread's next sample replaces it: ~10-30 ms for a thread that mostly waits, hundreds of
 * switches. Its traps come early: 60-80 % before the thread's next switch, all but ~1 %
 * within 4 (getrusage at arming and at trap, 3 runs). So a thread on the tick (one that
 * switches often: soft.c) counts its switches while armed with a perf software event
 * (PERF_COUNT_SW_CONTEXT_SWITCHES, sigtrap every WATCH_SWITCHES), and its watch ends at the
 * WATCH_SWITCHES-th: sysbench mutex's own time x1.07-1.09 against x1.14-1.18 without the
 * expiry, with the same traps (~100 a run; ending the watch at 4 switches kept 88 of them,
 * at 2 72; 20 rounds each, 2026-11-29). The kernel counts
 * switches in its own code, so the event must include the kernel: perf_event_paranoid <= 1
 * or CAP_PERFMON; without them the watch lasts until the next sample, as before (the
 * thread's LOCUS_CT_EXPIRY_DENIED). Threads on the task clock switch too seldom for it to
 * matter and keep no counter. Linux 6.1 or later only: the event overflows while its thread
 * is being switched out, and before 6.1 its signal was sent from an irq_work that ran after
 * the switch, where the kernel dropped it with a warning (WARN_ON_ONCE(event->ctx->task !=
 * current), fixed by "perf: Fix missing SIGTRAPs", which moves it to the task's return to
 * user space). */
enum { SW_UNKNOWN, SW_USABLE, SW_DENIED, SW_OLD_KERNEL };
static _Atomic int sw_state; /* SW_*: whether threads open the counter */

/* The running kernel's version is below major.minor (uname's release, "6.1.0-13-amd64"). */
static int kernel_before(unsigned major, unsigned minor) {
  struct utsname u;
  if (syscall(SYS_uname, &u) != 0) return 1;
  unsigned v[2] = {0, 0};
  const char *p = u.release;
  for (int i = 0; i < 2; i++, p += *p == '.') /* (digits, a dot, digits) */
    for (; *p >= '0' && *p <= '9'; p++) v[i] = v[i] * 10 + (unsigned)(*p - '0');
  return v[0] < major || (v[0] == major && v[1] < minor);
}

static void sw_open(void) {
  if (dt.sw_fd1) return;
  int state = atomic_load_explicit(&sw_state, memory_order_relaxed);
  if (state == SW_UNKNOWN) {
    state = kernel_before(6, 1) ? SW_OLD_KERNEL : SW_USABLE;
    atomic_store_explicit(&sw_state, state, memory_order_relaxed);
  }
  if (state == SW_DENIED) locus_ct.st.flags |= LOCUS_CT_EXPIRY_DENIED;
  if (state != SW_USABLE) return;
  struct perf_event_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.size = sizeof attr;
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_CONTEXT_SWITCHES;
  attr.sample_period = WATCH_SWITCHES;
  attr.disabled = 1;
  attr.sigtrap = 1;
  attr.remove_on_exec = 1;
  attr.exclude_hv = 1;
  attr.sig_data = LOCUS_TRAP_COOKIE | LOCUS_TRAP_EXPIRY;
  int fd =
      locus_fd_keep_high((int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd < 0) {
    if (errno != EMFILE && errno != ENFILE) { /* (descriptors may come back; rights do not) */
      atomic_store_explicit(&sw_state, SW_DENIED, memory_order_relaxed);
      locus_ct.st.flags |= LOCUS_CT_EXPIRY_DENIED;
    }
    return;
  }
  dt.sw_fd1 = fd + 1;
  locus_ct.st.flags |= LOCUS_CT_EXPIRY;
}

/* (forgotten before it is closed: an expiry signal in between finds nothing to disable,
 * not a number the program may open next) */
static void sw_close(void) {
  int fd1 = dt.sw_fd1;
  dt.sw_fd1 = 0;
  dt.sw_on = 0;
  atomic_signal_fence(memory_order_seq_cst);
  if (fd1) locus_fd_close(fd1 - 1);
}

/* A watch was armed: on the tick, count WATCH_SWITCHES switches from now (setting the period
 * of the disabled event restarts its count). */
static void sw_start(void) {
  if (!dt.on_tick || dt.sw_on || !dt.sw_fd1) return;
  uint64_t period = WATCH_SWITCHES;
  ioctl(dt.sw_fd1 - 1, PERF_EVENT_IOC_PERIOD, &period);
  if (ioctl(dt.sw_fd1 - 1, PERF_EVENT_IOC_ENABLE, 0) == 0) dt.sw_on = 1;
}

static void sw_stop(void) {
  if (dt.sw_on) ioctl(dt.sw_fd1 - 1, PERF_EVENT_IOC_DISABLE, 0);
  dt.sw_on = 0;
}

static void disarm(void) {
  for (int i = 0; i < dt.armed; i++) ioctl(dt.fds[i], PERF_EVENT_IOC_DISABLE, 0);
  dt.armed = 0;
  sw_stop();
}

void locus_comm_detect_on_tick(int on) {
  dt.on_tick = (uint8_t)(on != 0);
  if (on && dt.nwp > 0) sw_open(); /* (else when it opens its watchpoints) */
  if (!on) sw_stop();
}

/* The chunks of e's line that hold a sampled load's bytes: [*first, *first + return). */
static int load_chunks(const struct bb_entry *e, uint32_t *first) {
  uint64_t lo = e->addr > e->line ? e->addr : e->line;
  uint64_t hi = e->addr + (e->len ? e->len : 1);
  if (hi > e->line + locus_comm_cfg.line) hi = e->line + locus_comm_cfg.line;
  if (hi <= lo) hi = lo + 1;
  *first = (uint32_t)((lo - e->line) / WP_BYTES);
  return (int)((hi - 1 - e->line) / WP_BYTES - *first + 1);
}

/* Watch e's line: for any access when e is a store, for stores when it is a load.
 * PERF_EVENT_IOC_MODIFY_ATTRIBUTES on a breakpoint disables it, moves it (and changes its
 * type) and re-enables it in one call (about 3.5 us here), so the registers already armed
 * are moved in place, not disabled first; only the ones left over are disabled. */
static void arm(const struct bb_entry *e, int near) {
  uint32_t nchunks = locus_comm_cfg.line / WP_BYTES;
  uint8_t order[64];
  for (uint32_t i = 0; i < nchunks && i < 64; i++) order[i] = (uint8_t)i;
  int n = dt.nwp < (int)nchunks ? dt.nwp : (int)nchunks;
  if (e->loaded) { /* a load: its own chunks, in order */
    uint32_t first;
    int k = load_chunks(e, &first);
    if (k < n) n = k;
    for (int i = 0; i < n; i++) order[i] = (uint8_t)(first + (uint32_t)i);
  }
  for (int i = 0; i < n && !e->loaded; i++) { /* partial Fisher-Yates: n distinct random chunks */
    uint32_t j = (uint32_t)i + (uint32_t)(rnd() % (nchunks - (uint32_t)i));
    uint8_t tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  int armed = 0, was = dt.armed;
  for (int i = 0; i < n; i++) {
    struct perf_event_attr attr;
    uint64_t chunk = e->line + (uint64_t)order[i] * WP_BYTES;
    bp_attr(&attr, chunk, armed, 0, (int)e->loaded);
    if (ioctl(dt.fds[armed], PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &attr) != 0) continue;
    dt.chunk[armed] = order[i];
    armed++;
  }
  for (int i = armed; i < was; i++) ioctl(dt.fds[i], PERF_EVENT_IOC_DISABLE, 0);
  dt.armed = armed;
  if (armed)
    sw_start();
  else
    disarm();
  dt.on = *e;
  dt.on_near = near;
  dt.arm_weight = dt.weight;
  locus_ct.st.armed += (uint64_t)armed;
  if (!e->loaded && armed && ++dt.arms[near] >= ARM_WINDOW) {
    dt.arms[near] /= 2;
    dt.hits[near] /= 2;
  }
}

/* Beyond the paper: a thread whose armings seldom trap (its samples are in private data,
 * and the lines other threads publish are not ones it touches) arms at a fresh candidate
 * with probability 1/k only, and a trap then counts k times: the expected volume is the
 * same, and a thread that shares nothing pays 1/k of the ioctls (4 per arming, ~3.5 us each
 * here). k = the armings per trap over the last ARM_WINDOW armings, divided by 4, rounded
 * down to a power of two, 1 to ARM_SKIP_MAX: a yield of one trap in four armings or better
 * arms every time. The first trap after a private phase brings k back down at once. The
 * yields of candidates on lines the thread touched lately and of the others are counted
 * apart: the first stay high where the second are nil (a thread that works on its own
 * lines until it touches the line another thread left). */
static uint32_t arm_odds(int near) {
  uint32_t per_trap = dt.arms[near] / (4 * dt.hits[near] + 1), k = 1;
  while (k * 2 <= per_trap && k < ARM_SKIP_MAX) k *= 2;
  return k;
}

/* Step 2: a line published by another thread, unexpired, chosen uniformly among those in the
 * ring of recent publications (newest first, each board slot once) that are on a line this
 * thread was sampled on lately, or among all of them when none is: the unexpired ones are
 * the newest (a publication expires after two more samples of its thread), so a ring still
 * full of a phase's stale lines (private data, before a phase of sharing) does not hide the
 * few fresh ones, as a handful of random probes did. Then reservoir sampling over the
 * samples since the armed line was chosen decides whether the pick replaces it, except that
 * a pick on a line the thread touched lately replaces at once one on a line it did not, and
 * is never replaced by one. A fresher publication on the line already watched is followed
 * without an ioctl. 0 when there was no candidate. */
static int consider_arming(uint64_t now, uint64_t line) {
  struct bb_entry c, pick, near_pick;
  uint32_t slots[RECENT];
  uint32_t published = atomic_load_explicit(&recent_next, memory_order_relaxed);
  if (!published) return 0;
  uint32_t n = published < RECENT ? published : RECENT, nslots = 0, found = 0, near = 0;
  int watched = 0;
  for (uint32_t k = 1; k <= n; k++) {
    uint32_t slot = atomic_load_explicit(&recent[(published - k) % RECENT], memory_order_relaxed);
    uint32_t j = 0;
    while (j < nslots && slots[j] != slot) j++;
    if (j < nslots) continue;
    slots[nslots++] = slot;
    if (read_entry(board, slot, &c) != 0) continue;
    if (c.tid == locus_me.tid || expired(&c) || c.t <= dt.t_trap) continue;
    if (dt.armed && !dt.on.loaded && c.line == dt.on.line) {
      if (c.t > dt.on.t) dt.on = c; /* already watched: follow the newer publication */
      watched = 1;
      continue;
    }
    int before = touched(c.line);
    if (stale(&c, before, now)) continue;
    if (rnd() % ++found == 0) pick = c;
    if ((before || c.line == line) && rnd() % ++near == 0) near_pick = c;
  }
  /* Other processes' publications on memory this process maps too. */
  /* (its header is not read, nor its page made resident, in a process that maps no shared
   * memory) */
  uint32_t xpub =
      xb && locus_shared_count() ? atomic_load_explicit(&xb->recent_next, memory_order_relaxed) : 0;
  uint32_t xn = xpub < XB_RECENT ? xpub : XB_RECENT;
  nslots = 0;
  for (uint32_t k = 1; k <= xn; k++) {
    uint32_t slot = atomic_load_explicit(&xb->recent[(xpub - k) % XB_RECENT], memory_order_relaxed);
    uint32_t j = 0;
    while (j < nslots && slots[j] != slot) j++;
    if (j < nslots || slot >= XB_ENTRIES) continue;
    slots[nslots++] = slot;
    struct xb_entry x;
    struct locus_shared_loc l;
    const struct xb_entry *xe = &xbe[slot];
    l.ino = xe->ino; /* a hint: xb_read checks the entry against it */
    l.dev = xe->dev;
    l.off = xe->line;
    /* (expired ones are left before their address is looked up in the table) */
    if (xb_slot(&l) != slot || xb_read(&l, &x) != 0 || x.t <= dt.t_trap ||
        (now > x.t && now - x.t > XB_LIFETIME * period_ticks) || xb_local(&x, 0, &c) != 0)
      continue;
    if (dt.armed && !dt.on.loaded && c.line == dt.on.line) {
      if (c.t > dt.on.t) dt.on = c;
      watched = 1;
      continue;
    }
    int before = touched(c.line);
    if (rnd() % ++found == 0) pick = c;
    if ((before || c.line == line) && rnd() % ++near == 0) near_pick = c;
  }
  if (!found) return watched;
  int is_near = near > 0;
  if (is_near) pick = near_pick;
  /* (loads come after stores) */
  if (!dt.armed || dt.on.loaded || expired(&dt.on) || (is_near && !dt.on_near)) {
    uint32_t k = arm_odds(is_near);
    if (k > 1 && rnd() % k) return 1;
    dt.seen = 1;
    arm(&pick, is_near);
    dt.arm_weight *= k;
    return 1;
  }
  if (dt.on_near && !is_near) return 1;
  /* A replacement keeps something watched: thinned like an arming (its ioctls), it needs no
   * weight for the times it is skipped. */
  dt.seen++;
  if (rnd() % dt.seen == 0 && rnd() % arm_odds(is_near) == 0) arm(&pick, is_near);
  return 1;
}

/* The extension (watch_loads): no store to arm on, and another thread's unresolved load is
 * on an 8-byte chunk this thread's sample is on too (both wait on the same word: a flag, a
 * mailbox; a writer of other fields of that line, whose stores step 1 finds, does not
 * arm). What is armed and unexpired is kept. */
static void consider_loaded(const struct locus_comm_access *a, uint64_t line) {
  struct bb_entry c;
  if (dt.armed && !expired(&dt.on)) return;
  if (read_entry(loads, slot_of(line), &c) != 0 || c.line != line || c.tid == locus_me.tid ||
      c.loaded != 1 || expired(&c) || c.t <= dt.t_trap)
    return;
  uint64_t mine = a->addr & ~(uint64_t)(WP_BYTES - 1), theirs = c.addr & ~(uint64_t)(WP_BYTES - 1);
  if (!overlap(mine, (uint32_t)(a->addr + a->len - mine), theirs,
               (uint32_t)(c.addr + c.len - theirs)))
    return;
  uint32_t f0, f1;
  if (dt.armed && dt.on.loaded && dt.on.line == line && load_chunks(&dt.on, &f0) == dt.armed &&
      load_chunks(&c, &f1) == dt.armed && f0 == f1) {
    dt.on = c; /* the same chunks already watched: follow, no ioctl */
    return;
  }
  dt.seen = 1;
  arm(&c, 0);
}

static void open_watchpoints(void);

void locus_comm_detect(const struct locus_comm_access *a) {
  if (atomic_load_explicit(&board_state, memory_order_acquire) != 2 || !a->len) return;
  uint64_t line = a->addr & ~((uint64_t)locus_comm_cfg.line - 1);
  struct bb_entry e;
  int detected = 0;
  dt.weight = a->weight > 1 ? a->weight : 1;
  advance_clock(dt.weight, a->t);
  if (read_entry(board, slot_of(line), &e) == 0 && e.line == line && e.tid != locus_me.tid &&
      e.t > dt.t_prev)
    detected = 1;
  /* Memory processes share: the line's latest store may be another process's. The newest
   * publication is the one the line came from. */
  struct locus_shared_loc sl;
  struct xb_entry x;
  struct bb_entry r;
  int shared = xb && locus_shared_find(line, &sl) == 0;
  if (shared && xb_read(&sl, &x) == 0 && x.t > dt.t_prev && (!detected || x.t > e.t) &&
      xb_local(&x, line, &r) == 0) {
    e = r;
    detected = 1;
  }
  if (detected)
    write_event(&e, a->t, locus_me.tid, a->addr, a->len, a->ip, a->caller, a->flags, a->cpu, 0,
                (double)dt.weight);
  if (!detected && LOCUS_UNLIKELY(dt.want > 0)) open_watchpoints();
  if (!detected && dt.nwp > 0 && !consider_arming(a->t, line) && loads) consider_loaded(a, line);
  if (a->flags & LOCUS_AC_STORE) {
    publish(a, line, 0);
    if (shared) xb_publish(a, &sl, line);
  } else if (loads && !detected && !(a->flags & LOCUS_AC_STACK))
    publish(a, line, 1);
  uint16_t key = line_key(line);
  if (!touched_key(key)) dt.touched[dt.ntouched++ % TOUCHED] = key;
  dt.t_prev = a->t;
}

int locus_comm_line_foreign(uint64_t addr) {
  if (atomic_load_explicit(&board_state, memory_order_acquire) != 2) return 0;
  uint64_t line = addr & ~((uint64_t)locus_comm_cfg.line - 1);
  struct bb_entry e;
  return read_entry(board, slot_of(line), &e) == 0 && e.line == line && e.tid != locus_me.tid &&
         !expired(&e);
}

/* Mark the load publication e resolved on the load board; 0 when a trap already did. An
 * entry since replaced by a newer publication, or busy, counts as not yet resolved. */
static int confirm(const struct bb_entry *e) {
  struct bb_entry *b = &loads[slot_of(e->line)];
  uint32_t s = atomic_load_explicit(&b->seq, memory_order_relaxed);
  if ((s & 1) || !atomic_compare_exchange_strong(&b->seq, &s, s + 1)) return 1;
  int first = 1;
  if (b->tid == e->tid && b->t == e->t && b->line == e->line) {
    first = b->loaded == 1;
    b->loaded = 2;
  }
  atomic_store_explicit(&b->seq, s + 2, memory_order_release);
  return first;
}

void locus_comm_detect_on_watch(unsigned idx, siginfo_t *si, void *uc) {
  (void)si;
  if (locus_quiet) return; /* a seccomp filter is coming: its event is being disabled */
  if (dt.pid != getpid()) return;
  if (idx == LOCUS_TRAP_EXPIRY) { /* WATCH_SWITCHES switches without a trap: the watch ends */
    disarm();
    return;
  }
  if ((int)idx >= dt.nwp) return;
  if (!locus_ct.started || locus_me.guard || locus_me.state != 1 || !locus_enabled || !dt.armed) {
    disarm();
    return;
  }
  uint64_t t0 = locus_ticks();
  struct locus_handler_cost c0 = locus_comm_self_begin(0, t0);
  locus_me.guard++;
  locus_ct.st.traps++;
  int m = dt.armed;
  uint64_t chunk = (int)idx < m ? dt.on.line + (uint64_t)dt.chunk[idx] * WP_BYTES : dt.on.line;
  /* The trap's pc is after the access: decode the instruction before it when we can (or
   * the rep string instruction it is still on). */
  struct locus_comm_access a;
  memset(&a, 0, sizeof a);
  uint64_t pc = (uint64_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
  uint16_t guessed = 0;
  /* (an access it finds is on the chunk) */
  if (locus_comm_soft_access_before(pc, uc, chunk, WP_BYTES, &a) != 0) {
    a.addr = chunk;
    a.len = WP_BYTES;
    a.ip = pc;
    a.flags = 0;
    guessed = LOCUS_CE_GUESSED;
  }
  disarm();
  /* A load's trap resolves the reader's sample (its periods); a store's is scaled as the
   * paper's, in the periods of the sample that armed it. */
  double volume = dt.on.loaded ? (dt.on.weight > 1 ? (double)dt.on.weight : 1.0)
                               : (double)locus_comm_cfg.line / ((double)WP_BYTES * m) *
                                     (dt.arm_weight > 1 ? (double)dt.arm_weight : 1.0);
  if (!dt.on.loaded) {
    dt.hits[dt.on_near]++;
    write_event(&dt.on, t0, locus_me.tid, a.addr, a.len, a.ip, a.caller, a.flags, sched_getcpu(),
                LOCUS_CE_TRAP | guessed, volume);
  } else if (confirm(&dt.on)) { /* else another thread's store resolved that load first */
    /* This thread stored to a chunk of a line dt.on's thread was sampled loading: the
     * communication goes from this thread (the writer) to the reader. */
    struct bb_entry w = dt.on;
    w.tid = locus_me.tid;
    w.addr = a.addr;
    w.len = a.len;
    w.ip = a.ip;
    w.caller = a.caller;
    w.cpu = (int16_t)sched_getcpu();
    write_event(&w, t0, dt.on.tid, dt.on.addr, dt.on.len, dt.on.ip, dt.on.caller, 0, dt.on.cpu,
                LOCUS_CE_TRAP | LOCUS_CE_LOADED | guessed, volume);
  }
  if (dt.on.t > dt.t_trap) dt.t_trap = dt.on.t;
  if (t0 > dt.t_prev) dt.t_prev = t0;
  locus_comm_self_end(c0);
  locus_me.guard--;
}

/* ---- life cycle ---- */
/* The board between processes (comm.board in the run directory, XB_BYTES, made by the
 * launcher; none with the exact backend, which counts per process), and the table of this
 * process's shared memory, from its maps and then its mmaps. */
static void xb_open(void) {
  if (locus_comm_cfg.backend == LOCUS_BK_EXACT || locus_run_dirfd() < 0) return;
  int fd = openat(locus_run_dirfd(), "comm.board", O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size == (off_t)XB_BYTES)
    p = locus_sys_mmap(NULL, XB_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return;
  xb_pid = getpid();
  xbe = (struct xb_entry *)((char *)p + 4096);
  xb = p;
  locus_shared_scan(locus_proc_path);
  locus_shared_tracking = 1;
}

static void board_init(void) {
  int expect = 0;
  if (atomic_compare_exchange_strong(&board_state, &expect, 1)) {
    uint32_t n = locus_comm_cfg.bulletin;
    if (n < 64) n = 64;
    while (n & (n - 1)) n &= n - 1; /* round down to a power of two */
    size_t boards = locus_comm_cfg.watch_loads ? 2 : 1;
    void *p = mmap(NULL, boards * n * sizeof(struct bb_entry), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      locus_warn("comm: cannot allocate the bulletin board; no communication is detected");
      return; /* stays 1: never ready */
    }
    board = p;
    board_cap = n;
    if (boards == 2) loads = board + n;
    atomic_store(&board_mask, 0);
    uint64_t pns = locus_comm_cfg.period_ns < 100000 ? 100000 : locus_comm_cfg.period_ns;
    period_ticks = (uint64_t)((double)pns * locus_ticks_per_us / 1000.0);
    board_pid = getpid();
    xb_open();
    atomic_store_explicit(&board_state, 2, memory_order_release);
    return;
  }
  /* A forked child inherits the parent's board: its entries name threads it has not. */
  if (atomic_load(&board_state) == 2 && board_pid != getpid()) {
    memset(board, 0, (loads ? 2 : 1) * (size_t)board_cap * sizeof(struct bb_entry));
    memset((void *)recent, 0, sizeof recent);
    memset((void *)pubclock, 0, sizeof pubclock);
    memset((void *)pubtime, 0, sizeof pubtime);
    atomic_store(&recent_next, 0);
    board_pid = getpid();
    xb_pid = board_pid; /* the board between processes is the run's: kept */
  }
}

/* The board in use grows with the threads: 64 entries each (a power of two), up to
 * --bulletin-size. A publication lives two samples of its thread, so a few entries per
 * thread hold every live one; a small program then touches a few pages of the board, not
 * the whole table (memory grows with the threads, not with a fixed size). After a growth, entries
 * published under the smaller mask are looked up at another slot and missed once; growths are at
 * most log2(size / 64). */
static void board_fit(void) {
  if (atomic_load_explicit(&board_state, memory_order_acquire) != 2) return;
  uint64_t want = 64ull * (locus_thread_count() + 1);
  uint32_t n = 64;
  while (n < want && n < board_cap) n <<= 1;
  if (n > board_cap) n = board_cap;
  uint32_t m = atomic_load(&board_mask);
  while (m < n - 1 && !atomic_compare_exchange_weak(&board_mask, &m, n - 1)) {
  }
}

void locus_comm_detect_thread_init(void) {
  board_init();
  board_fit();
  pid_t pid = getpid();
  /* After fork the fds are the parent's events: close them, never disable them. */
  if (dt.nwp > 0 && dt.pid != pid) {
    for (int i = 0; i < dt.nwp; i++) locus_fd_close(dt.fds[i]);
    if (dt.sw_fd1) locus_fd_close(dt.sw_fd1 - 1);
  }
  memset(&dt, 0, sizeof dt);
  dt.pid = pid;
  dt.rng = ((uint64_t)locus_me.tid << 32) ^ locus_ticks() ^ 0x2545f4914f6cdd1dull;
  /* Publications older than one period before the thread began are not communication to it
   * (step 1 counts those newer than t_prev): an ended thread's stores on a stack glibc gave
   * to this thread read as transfers between threads that never lived at once. */
  uint64_t now = locus_ticks();
  dt.t_prev = now > period_ticks ? now - period_ticks : 0;
  int want = locus_comm_cfg.watchpoints;
  if (want > MAX_WP) want = MAX_WP;
  if (want > 0 && locus_comm_trap_install() != 0) want = 0;
  /* The debug registers are opened when the thread first arms them: most short-lived
   * threads never do, and four perf_event_open calls per thread made programs that create
   * threads by the thousand (stress-ng --pthread) several times slower. */
  dt.want = want;
  locus_ct.st.watchpoints = (uint32_t)want;
}

/* Open the thread's watchpoints (signal handler; perf_event_open is a plain syscall). */
static void open_watchpoints(void) {
  int want = dt.want;
  dt.want = 0;
  for (int i = 0; i < want; i++) {
    struct perf_event_attr attr;
    bp_attr(&attr, (uint64_t)&wp_parking, i, 1, 0);
    int fd = locus_fd_keep_high(
        (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) break;
    dt.fds[dt.nwp++] = fd;
  }
  if (dt.on_tick && dt.nwp > 0) sw_open();
  locus_ct.st.watchpoints = (uint32_t)dt.nwp;
}

/* Tests (runtime/tests/test_comm_soft.c, "expiry"; soft.h). */
int locus_test_detect_watch(uint64_t addr, int on_tick) {
  if (dt.want > 0) open_watchpoints();
  if (dt.nwp <= 0) return -1;
  locus_comm_detect_on_tick(on_tick);
  struct bb_entry e;
  memset(&e, 0, sizeof e);
  e.line = addr & ~((uint64_t)locus_comm_cfg.line - 1);
  e.addr = addr;
  e.len = 8;
  e.tid = 1;
  e.t = locus_ticks();
  arm(&e, 0);
  return dt.armed;
}

int locus_test_detect_armed(void) { return dt.armed | (dt.sw_fd1 ? 0x100 : 0); }

void locus_comm_detect_park(int park) {
  if (park && !dt.parked) {
    disarm();
    int n = dt.nwp + dt.want;
    if (dt.pid == getpid()) {
      for (int i = 0; i < dt.nwp; i++) locus_fd_close(dt.fds[i]);
      sw_close();
    }
    dt.nwp = 0;
    dt.want = 0;
    dt.parked = n + 1;
  } else if (!park && dt.parked) {
    dt.want = dt.parked - 1; /* opened again at the next arming */
    dt.parked = 0;
  }
}

void locus_comm_detect_thread_fini(void) {
  if (dt.pid != getpid()) return;
  advance_clock(LIFETIME, locus_ticks()); /* its publications expire: it will not run again */
  for (int i = 0; i < dt.nwp; i++) locus_fd_close(dt.fds[i]);
  sw_close();
  dt.nwp = 0;
  dt.armed = 0;
}
