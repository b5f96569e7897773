/* The `soft` sampling backend of the comm lens: a per-thread CPU-time timer interrupts the
 * thread; the handler decodes the instruction at the interrupted pc with Zydis, computes
 * its effective address, size and direction from the saved registers, writes a sample and
 * hands it to the detector (detect.c). Works on any x86-64 Linux, no PMU needed.
 *
 * Skid (recipes/sampling.md): the interrupt is taken after the stalled instruction retired,
 * so the pc is usually the *next* instruction. A sample goes to the instruction before the
 * pc unless the pc is a direct-branch target or a function start, that instruction
 * transfers control, or it overwrote a register of its own address. To know the
 * instruction boundaries, the handler finds the function holding the pc in the object's
 * .eh_frame_hdr table (binary search, no allocation) and decodes it from its start; the
 * answer is cached per pc in a lock-free direct-mapped table. Code without unwind info
 * (hand-written asm without CFI) is skipped. The list of loaded objects is a snapshot taken
 * at start-up and at every thread start: the handler cannot call dl_iterate_phdr, so code
 * dlopen'ed since the last thread start is skipped until then. */
#define _GNU_SOURCE
#include "soft.h"
#include "../allocs.h"
#include "../ehframe.h"
#ifdef LOCUS_LAYOUT_PROFILE
void __gcov_reset(void);
#endif

#include <Zydis/Zydis.h>
#include <dlfcn.h>
#include <asm/prctl.h>
#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stddef.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

/* Zydis is opened when the soft backend starts, not linked: a recording without it (the
 * locks lens alone) must not carry the decoder's pages in the program's memory. */
static struct {
  ZyanStatus (*init)(ZydisDecoder *, ZydisMachineMode, ZydisStackWidth);
  ZyanStatus (*decode_full)(const ZydisDecoder *, const void *, ZyanUSize,
                            ZydisDecodedInstruction *, ZydisDecodedOperand *);
  ZyanStatus (*decode_instruction)(const ZydisDecoder *, ZydisDecoderContext *, const void *,
                                   ZyanUSize, ZydisDecodedInstruction *);
  ZydisRegister (*largest_enclosing)(ZydisMachineMode, ZydisRegister);
} zy;

/* Opened RTLD_LOCAL (a Zydis of the program's own, of another version, keeps its symbols),
 * with the loader's allocations in the runtime's private arena: on the program's heap its
 * bookkeeping (4.5 KiB before main) moved every block the program allocates after it, and
 * sysbench mutex, whose threads' blocks share lines, ran 1.6 s instead of 1.2 for that
 * shift alone. */
static int zydis_open(void) {
  if (zy.init) return 0;
  locus_alloc_private(1);
  void *h = dlopen("libZydis.so.4.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libZydis.so", RTLD_NOW | RTLD_LOCAL);
  zy.decode_full = h ? (__typeof__(zy.decode_full))dlsym(h, "ZydisDecoderDecodeFull") : NULL;
  zy.decode_instruction =
      h ? (__typeof__(zy.decode_instruction))dlsym(h, "ZydisDecoderDecodeInstruction") : NULL;
  zy.largest_enclosing =
      h ? (__typeof__(zy.largest_enclosing))dlsym(h, "ZydisRegisterGetLargestEnclosing") : NULL;
  zy.init = h ? (__typeof__(zy.init))dlsym(h, "ZydisDecoderInit") : NULL;
  locus_alloc_private(0);
  if (zy.init && zy.decode_full && zy.decode_instruction && zy.largest_enclosing) return 0;
  zy.init = NULL;
  return -1;
}
#define ZydisDecoderInit zy.init
#define ZydisDecoderDecodeFull zy.decode_full
#define ZydisDecoderDecodeInstruction zy.decode_instruction
#define ZydisRegisterGetLargestEnclosing zy.largest_enclosing

#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif

/* SRC_TICK: the task clock's thread, moved to its POSIX CPU-time timer while it switches
 * context often (see adapt()). */
enum { SRC_NONE = 0, SRC_SIGTRAP = 1, SRC_ASYNC = 2, SRC_TIMER = 3, SRC_TICK = 4 };

#define MAX_MODS 512
#define ALTSTACK_SIZE (64u << 10)
#define PERIOD_FLOOR_NS 100000u
#define CACHE_SLOTS 16384u /* pc -> skid info, lock-free (lookup()) */
#define CACHE_NEAR 512u    /* the first tier: one page */
#define CACHE_PROBES 8u
#define FN_MAX (16u << 10)    /* pcs further from their function start are skipped */
#define FN_PAST_PC (2u << 10) /* bytes decoded past the pc looking for backward branches */

/* One executable segment of a loaded object, with the address of the object's .eh_frame_hdr
 * (its search table: pairs of int32, function start and FDE address, both relative to the
 * header). The header is read only when a sample lands in the object: touching it at snapshot
 * time would fault in (with the kernel's fault-around) 64 KiB of every loaded library. Entries are
 * appended by refresh_modules() (normal context, one refresher at a time) and published by nmods;
 * handlers only read. An object that went away is marked dead, never reused. */
struct module {
  uint64_t lo, hi;
  uint64_t ro_lo, ro_hi; /* the object's read-only data after its code (.rodata), 0 none */
  uint64_t hdr;          /* address of .eh_frame_hdr, 0 when the object has none */
  _Atomic int dead;
  int sys; /* a system library (locus_system_object): its samples get the program's call into it */
};
static struct module mods[MAX_MODS];
static _Atomic int nmods;
/* One refresher at a time; a thread finding it taken skips (the other one does the work).
 * Not a pthread mutex: that would go through the locks lens' interposer. */
static _Atomic int mods_busy;
/* Cache word: bit 63 valid, bits 0-46 pc, 48-51 length of the previous instruction (0: none
 * usable), bit 52 pc is a direct-branch target or a function start, bit 53 no answer, bit 54
 * pc is a rep-prefixed string instruction (interrupted in the middle, it is not skid). With
 * bit 55 set, the word is a stack word's verdict instead (caller_of): bit 56 when the
 * address follows a call instruction and is not a function start. */
static _Atomic uint64_t *pc_cache;
static ZydisDecoder dec;
static int proc_ok;
static _Atomic int sizes_ready; /* locus_comm_decoder_open (the hw backend) */
static int forced_source;
/* The task clock opened in this process: its threads after the first start on the tick. */
static _Atomic int clock_works;
static _Atomic int warned_source, warned_budget;

struct soft_tls {
  int fd;
  int source;
  uint64_t fs_base, gs_base;
  uint64_t stack_lo, stack_hi;
  int step_left;        /* single steps left towards the next memory access (0: not stepping) */
  uint32_t jitter_n;    /* perf samples taken (jitter_period); fills padding: TLS is budgeted */
  uint64_t step_t;      /* ticks at the chain's previous signal */
  uint32_t step_weight; /* periods of the sample the chain is for */
  int async_fd;         /* the async source's event, kept after its close; -1 none */
  int ktimer;    /* the POSIX CPU-time timer (SRC_TICK, SRC_TIMER): a kernel id, -1 none yet */
  int streak;    /* checks in a row that point to the other source; -1: adapt no more */
  int wp_streak; /* checks in a row (on the tick) that point to parking, or unparking, the
                    watchpoints */
  int parked;    /* the watchpoints are parked (locus_comm_detect_park) */
  int undecided; /* started on the tick: the first check of its rate chooses the source */
  uint64_t sw_last, cpu_last; /* context switches and CPU time (ns) at the previous check */
};
static LOCUS_TLS struct soft_tls me_soft = {.fd = -1, .async_fd = -1, .ktimer = -1};
/* A sample whose instruction (and, skid-corrected, the previous one) has no usable memory
 * access: the load that stalled overwrote its own base register (`mov (%rax),%rax`, the
 * pointer chase), or the loop's branch. The thread is single-stepped (x86 trap flag, one
 * SIGTRAP TRAP_TRACE per instruction) to the next instruction with a memory operand, whose
 * address the registers give exactly, at most STEP_MAX instructions. LOCUS_SOFT_STEP=0: off. */
#define STEP_MAX 8
#define EFL_TF 0x100
static int step_on = 1;
/* A step's cost is a debug exception and a signal: ~2 us on bare metal, ~12 us in a KVM
 * guest, where every #DB exits to the hypervisor (KVM intercepts #DB unconditionally since
 * CVE-2015-8104). A chain is cut to what fits in STEP_SHARE_PCT % of the sampling period at
 * the measured cost (a process-wide moving average of the time from one of the chain's
 * signals to the next, handler included), so stepping stays a bounded share of the CPU time
 * wherever it runs: 8 steps on bare metal at the 1 ms default, 4 in such a guest (a loop's
 * load is typically 3 instructions after the sampled one). */
#define STEP_SHARE_PCT 8
static _Atomic uint64_t step_cost; /* ticks per step, moving average; 0 = not measured yet */

static int steps_allowed(void) {
  uint64_t c = atomic_load_explicit(&step_cost, memory_order_relaxed);
  if (!c) return STEP_MAX;
  double budget =
      (double)locus_comm_cfg.period_ns * locus_ticks_per_us / 1000.0 * STEP_SHARE_PCT / 100.0;
  double n = budget / (double)c;
  return n >= STEP_MAX ? STEP_MAX : n < 1 ? 1 : (int)n;
}

static void step_measured(uint64_t now) {
  uint64_t d = now - me_soft.step_t, c = atomic_load_explicit(&step_cost, memory_order_relaxed);
  /* The cost of a step is the platform's (a debug exception, a signal): the time also holds
   * any preemption of the thread (a busy host's steal, another vCPU's turn), which says
   * nothing of it. So the average follows a cheaper step at once (1/4) and a dearer one
   * slowly (1/16, at most twice the average): under steal it stays near the real cost,
   * where an even average climbed until the chains were cut to one step. */
  uint64_t cap = (uint64_t)(1000.0 * locus_ticks_per_us);
  if (d > cap) d = cap;
  if (!c)
    c = d;
  else if (d < c)
    c -= (c - d) / 4;
  else
    c += ((d > 2 * c ? 2 * c : d) - c) / 16;
  atomic_store_explicit(&step_cost, c, memory_order_relaxed);
  me_soft.step_t = now;
}

/* ---- loaded objects and their function tables ---- */
/* The object's function table (.eh_frame_hdr's, where it is mapped): 0, else -1. */
static int hdr_table(uint64_t hdr, const int32_t **table, uint32_t *nfde) {
  const uint8_t *p = (const uint8_t *)hdr;
  uint32_t off;
  /* (the header is at most 20 bytes: version, 3 encodings, 2 pointers of up to 8) */
  if (locus_eh_hdr(p, p + 20, 0, &off, nfde) != 0) return -1;
  *table = (const int32_t *)(const void *)(p + off);
  return 0;
}

static int known(uint64_t lo, uint64_t hi, int n) {
  for (int i = 0; i < n; i++)
    if (mods[i].lo == lo && mods[i].hi == hi && !atomic_load(&mods[i].dead)) return i;
  return -1;
}

struct seen {
  uint8_t mark[MAX_MODS];
  int n;
};

/* Code the program did not write: the C library and the other objects installed in the
 * system's library directories, the vDSO, the dynamic loader, and this runtime. Samples in
 * it get the program's call into it (caller_of). */
/* The span of the program's own code (objects not locus_system_object): a stack word
 * outside it is no return address into it. Only grows. */
static _Atomic uint64_t user_lo = UINT64_MAX, user_hi;

/* The pages of [lo, hi) get mappings of their own (at most two pages each), without
 * being touched: a read fault there then maps that page, not the 64 KiB around it (the
 * kernel's fault-around stops at the mapping's edge). MADV_RANDOM only changes readahead;
 * the different flags keep neighbours from merging, and the first and last pages are apart
 * from the mappings around the range. For an object's .eh_frame_hdr: function_of's binary
 * search reads a dozen entries of it, and each read had mapped 64 KiB of the object's
 * tables around them into the program (libc's: 60-80 KiB, sysbench threads). Ranges over
 * ISOLATE_MAX are left whole (each page pair is a mapping the process counts). */
#define ISOLATE_MAX (512u << 10)
static void isolate_pages(uint64_t lo, uint64_t hi) {
  const uint64_t pg = 4096;
  lo &= ~(pg - 1);
  hi = (hi + pg - 1) & ~(pg - 1);
  if (hi <= lo || hi - lo > ISOLATE_MAX) return;
  for (uint64_t a = lo; a < hi; a += 2 * pg) madvise((void *)a, pg, MADV_RANDOM);
  if (((hi - lo) / pg) % 2 == 0) madvise((void *)(hi - pg), pg, MADV_RANDOM);
}

static int add_module(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  struct seen *seen = arg;
  uint64_t hdr = 0, hdr_end = 0;
  int sys = locus_system_object(info);
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) {
      hdr = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
      hdr_end = hdr + info->dlpi_phdr[i].p_memsz;
    }
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || !(ph->p_flags & PF_R)) continue;
    if (ph->p_filesz == 0) continue;
    uint64_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_filesz;
    int n = atomic_load_explicit(&nmods, memory_order_relaxed);
    int k = known(lo, hi, seen->n);
    if (k >= 0) {
      seen->mark[k] = 1;
      continue;
    }
    if (n >= MAX_MODS) continue;
    struct module *m = &mods[n];
    m->lo = lo;
    m->hi = hi;
    m->ro_lo = m->ro_hi = 0;
    for (int j = 0; j < info->dlpi_phnum; j++) { /* (the first read-only segment after it) */
      const ElfW(Phdr) *r = &info->dlpi_phdr[j];
      if (r->p_type == PT_LOAD && !(r->p_flags & (PF_W | PF_X)) && r->p_vaddr > ph->p_vaddr &&
          (!m->ro_lo || info->dlpi_addr + r->p_vaddr < m->ro_lo)) {
        m->ro_lo = info->dlpi_addr + r->p_vaddr;
        m->ro_hi = m->ro_lo + r->p_filesz;
      }
    }
    m->hdr = hdr;
    m->sys = sys;
    if (hdr) isolate_pages(hdr, hdr_end);
    atomic_store(&m->dead, 0);
    if (!sys) {
      uint64_t v = atomic_load(&user_lo);
      while (lo < v && !atomic_compare_exchange_weak(&user_lo, &v, lo)) {
      }
      v = atomic_load(&user_hi);
      while (hi > v && !atomic_compare_exchange_weak(&user_hi, &v, hi)) {
      }
    }
    atomic_store_explicit(&nmods, n + 1, memory_order_release);
  }
  return 0;
}

/* Normal context only: snapshot the loaded objects (new ones appended, gone ones dead). */
struct dl_counts {
  unsigned long long adds, subs;
};

static int first_object_counts(struct dl_phdr_info *info, size_t size, void *arg) {
  struct dl_counts *c = arg;
  if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
  }
  return 1; /* the counters are global: one object is enough */
}

/* Loads and unloads the loader has counted when the snapshot was last taken. */
static unsigned long long mods_adds = ~0ull, mods_subs = ~0ull;

static void refresh_modules(void) {
  /* Thread starts are frequent and dlopen rare: skip the walk when nothing changed. */
  struct dl_counts c = {~0ull - 1, ~0ull - 1};
  dl_iterate_phdr(first_object_counts, &c);
  if (c.adds == __atomic_load_n(&mods_adds, __ATOMIC_ACQUIRE) &&
      c.subs == __atomic_load_n(&mods_subs, __ATOMIC_ACQUIRE))
    return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&mods_busy, &expect, 1)) return;
  struct seen seen;
  memset(&seen, 0, sizeof seen);
  seen.n = atomic_load(&nmods);
  dl_iterate_phdr(add_module, &seen);
  int gone = 0;
  for (int i = 0; i < seen.n; i++)
    if (!seen.mark[i] && !atomic_load(&mods[i].dead)) {
      atomic_store(&mods[i].dead, 1);
      gone = 1;
    }
  /* Code unloaded: cached answers may name addresses that now hold other code. */
  if (gone && pc_cache &&
      madvise((void *)pc_cache, CACHE_SLOTS * sizeof(uint64_t), MADV_DONTNEED) != 0)
    for (uint32_t i = 0; i < CACHE_SLOTS; i++)
      atomic_store_explicit(&pc_cache[i], 0, memory_order_relaxed);
  __atomic_store_n(&mods_adds, c.adds, __ATOMIC_RELEASE);
  __atomic_store_n(&mods_subs, c.subs, __ATOMIC_RELEASE);
  atomic_store(&mods_busy, 0);
}

/* Resident memory: a read fault on a file mapping maps up to 16 neighbouring cached pages
 * (the kernel's fault-around), all counted in the program's RSS. Zydis's decoder tables
 * (~420 KiB) and the runtime's own code are touched sparsely, so almost all of that is pages
 * never used. Fault-around stops at the mapping's edge: give each page of the object's read-only
 * segments its own mapping (alternate pages marked MADV_RANDOM, which only changes readahead, so
 * neighbours cannot merge). The non-executable read-only segments are also dropped from the
 * page tables (their contents come back from the file on the next read): the dynamic linker
 * read their relocations and symbols at load. Executable pages still the file's are dropped
 * too (drop_clean_pages). Writable, RELRO and text-relocated pages are left alone, and so are
 * executable pages a debugger wrote its breakpoints in. */
struct trim_arg {
  uint64_t addr;
  long page;
};

/* Executable pages of [lo, hi) that are still the file's (mapped, and not copied on write:
 * a debugger's breakpoint makes its page the process's own) are dropped from the page tables
 * (/proc/self/pagemap: bit 63 present, bit 61 file page). They were mapped by the faults
 * that ran the object's first code, before its pages had their own mappings: 16 pages each.
 * The pages the runtime runs come back one by one. Nothing is dropped if pagemap cannot be
 * read. */
#define PM_PRESENT (1ull << 63)
#define PM_FILE (1ull << 61)
static void drop_clean_pages(uint64_t lo, uint64_t hi, uint64_t pg) {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  uint64_t e[64], run = 0; /* start of a run of such pages, 0: none (one call a run) */
  uint64_t a = lo;         /* pages below a were read */
  while (a < hi) {
    uint64_t n = (hi - a) / pg < 64 ? (hi - a) / pg : 64;
    if (pread(fd, e, n * sizeof e[0], (off_t)(a / pg * sizeof e[0])) != (ssize_t)(n * sizeof e[0]))
      break;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t at = a + i * pg;
      if ((e[i] & (PM_PRESENT | PM_FILE)) == (PM_PRESENT | PM_FILE)) {
        if (!run) run = at;
      } else if (run) {
        madvise((void *)run, at - run, MADV_DONTNEED);
        run = 0;
      }
    }
    a += n * pg;
  }
  close(fd);
  if (run) madvise((void *)run, a - run, MADV_DONTNEED);
}

static int trim_object_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  const struct trim_arg *ta = arg;
  int mine = 0;
  uint64_t relro_lo = 0, relro_hi = 0;
  const ElfW(Dyn) *dyn = NULL;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uint64_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && ta->addr >= lo && ta->addr < lo + ph->p_memsz) mine = 1;
    if (ph->p_type == PT_GNU_RELRO) relro_lo = lo, relro_hi = lo + ph->p_memsz;
    if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)lo;
  }
  if (!mine) return 0;
  for (; dyn && dyn->d_tag != DT_NULL; dyn++)
    if (dyn->d_tag == DT_TEXTREL || (dyn->d_tag == DT_FLAGS && (dyn->d_un.d_val & DF_TEXTREL)))
      return 1;
  uint64_t pg = (uint64_t)ta->page;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || (ph->p_flags & PF_W) || ph->p_filesz == 0) continue;
    /* Whole pages inside the segment's file part only: a shared edge page is left alone. */
    uint64_t lo = (info->dlpi_addr + ph->p_vaddr + pg - 1) & ~(pg - 1);
    uint64_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_filesz) & ~(pg - 1);
    if (relro_hi > relro_lo && lo < relro_hi && relro_lo < hi) continue;
    if (hi <= lo) continue;
    for (uint64_t a = lo + pg; a < hi; a += 2 * pg) madvise((void *)a, pg, MADV_RANDOM);
    if (!(ph->p_flags & PF_X))
      madvise((void *)lo, hi - lo, MADV_DONTNEED);
    else
      drop_clean_pages(lo, hi, pg);
  }
  return 1;
}

static void trim_object(const void *addr) {
  /* x86-64 pages (this backend decodes x86-64 only): sysconf() would fault in its own
   * libc page for nothing. */
  struct trim_arg ta = {.addr = (uint64_t)(uintptr_t)addr, .page = 4096};
  if (ta.page > 0) dl_iterate_phdr(trim_object_cb, &ta);
}

static LOCUS_TLS int last_mod = -1;

static const struct module *module_of(uint64_t pc) {
  int n = atomic_load_explicit(&nmods, memory_order_acquire);
  int l = last_mod;
  if (l >= 0 && l < n && pc >= mods[l].lo && pc < mods[l].hi && !atomic_load(&mods[l].dead))
    return &mods[l];
  for (int i = n - 1; i >= 0; i--) /* newest first: a reused range names the live object */
    if (pc >= mods[i].lo && pc < mods[i].hi &&
        !atomic_load_explicit(&mods[i].dead, memory_order_relaxed)) {
      last_mod = i;
      return &mods[i];
    }
  return NULL;
}

/* [start, end) of the function holding pc: start from the object's .eh_frame_hdr search
 * table (the FDEs' initial locations, sorted), end the next entry's start (or the segment's
 * end); -1 when pc is before the first. The FDE itself (its exact range) is not read: each
 * read faulted in 64 KiB of .eh_frame (the kernel's fault-around) that the program never
 * uses — 68 KiB of libc's for a program that samples a few libc functions. pc in the gap
 * after a function's FDE range (alignment padding, code without CFI) is then decoded from
 * that function's start, through the padding (valid instructions), instead of by resync. */
static int table_entry(const void *table, uint32_t k, int32_t e[2]) {
  memcpy(e, (const int32_t *)table + 2 * k, 8);
  return 0;
}

static int function_of(const struct module *m, uint64_t pc, uint64_t *start, uint64_t *end) {
  const int32_t *t;
  uint32_t nfde, lo;
  int32_t e[2];
  if (!m->hdr || hdr_table(m->hdr, &t, &nfde) != 0 ||
      locus_eh_search(nfde, (int64_t)(pc - m->hdr), table_entry, t, &lo, e) != 0)
    return -1;
  *start = m->hdr + (uint64_t)(int64_t)e[0];
  *end = lo + 1 < nfde ? m->hdr + (uint64_t)(int64_t)t[2 * (lo + 1)] : m->hi;
  if (*end > m->hi) *end = m->hi;
  return pc < *end ? 0 : -1;
}

static int is_branch(const ZydisDecodedInstruction *in) {
  switch (in->meta.category) {
    case ZYDIS_CATEGORY_CALL:
    case ZYDIS_CATEGORY_RET:
    case ZYDIS_CATEGORY_COND_BR:
    case ZYDIS_CATEGORY_UNCOND_BR:
    case ZYDIS_CATEGORY_SYSCALL:
    case ZYDIS_CATEGORY_SYSRET:
    case ZYDIS_CATEGORY_INTERRUPT:
      return 1;
    default:
      return 0;
  }
}

/* Whether the instruction at ip is a direct branch (jmp, jcc, call, loop) to pc. */
static int branches_to(const ZydisDecodedInstruction *in, uint64_t ip, uint64_t pc) {
  return in->raw.imm[0].is_relative && is_branch(in) &&
         ip + in->length + (uint64_t)in->raw.imm[0].value.s == pc;
}

/* The bytes an instruction at ip may take when code may be read up to hi. */
static inline size_t avail_to(uint64_t hi, uint64_t ip) {
  return hi - ip < ZYDIS_MAX_INSTRUCTION_LENGTH ? hi - ip : ZYDIS_MAX_INSTRUCTION_LENGTH;
}

#define PC_VALID (1ull << 63)
#define PC_TARGET (1ull << 52)
#define PC_NONE (1ull << 53)
#define PC_REP (1ull << 54)
#define PC_MASK ((1ull << 47) - 1)
#define PC_CALL (1ull << 55)
#define PC_RETURN (1ull << 56)

#define RESYNC_BACK 64u /* bytes decoded before pc without a function table */

/* Whether the instruction stream from `from` (an instruction start) holds, in [from, stop),
 * a relative branch whose target is pc. The bytes are scanned for the encodings of one (rel8:
 * jmp, jcc, loop, jrcxz; rel32: jmp, call, jcc) that lands on pc, and the stream is decoded
 * only up to such a candidate, to confirm an instruction ends where it does: decoding all of
 * [pc, pc + FN_PAST_PC) for a loop's backward branch was 56 % of the bytes a compiler's
 * samples decoded (cc1plus: ~850 of ~1,500 bytes, ~32 us a sample, almost every sample a new
 * pc). A byte that does not decode ends the stream, as in walk. */
static int branch_back(const uint8_t *code, uint64_t lo, uint64_t hi, uint64_t from, uint64_t pc,
                       uint64_t stop) {
  ZydisDecoderContext ctx;
  ZydisDecodedInstruction in;
  uint64_t ip = from;
  for (uint64_t q = from; q < stop && q + 2 <= hi; q++) {
    const uint8_t *b = code + (q - lo);
    uint64_t end = 0;
    int32_t d;
    if (b[0] == 0xeb || (b[0] >= 0x70 && b[0] <= 0x7f) || (b[0] >= 0xe0 && b[0] <= 0xe3)) {
      if (q + 2 + (uint64_t)(int64_t)(int8_t)b[1] == pc) end = q + 2;
    } else if ((b[0] == 0xe9 || b[0] == 0xe8) && q + 5 <= hi) {
      memcpy(&d, b + 1, sizeof d);
      if (q + 5 + (uint64_t)(int64_t)d == pc) end = q + 5;
    } else if (b[0] == 0x0f && b[1] >= 0x80 && b[1] <= 0x8f && q + 6 <= hi) {
      memcpy(&d, b + 2, sizeof d);
      if (q + 6 + (uint64_t)(int64_t)d == pc) end = q + 6;
    }
    while (end && ip < end) {
      if (!ZYAN_SUCCESS(
              ZydisDecoderDecodeInstruction(&dec, &ctx, code + (ip - lo), avail_to(hi, ip), &in)))
        return 0;
      if (ip + in.length == end && branches_to(&in, ip, pc)) return 1;
      ip += in.length;
    }
  }
  return 0;
}

/* Decodes the code at `code` (the byte at lo; bytes up to hi may be read) from `from` to pc
 * as one instruction stream: the length of the instruction before pc when it falls through
 * to pc (bits 48-51), whether pc is a direct-branch target in the stream up to `stop`
 * (PC_TARGET: decoded up to pc, found after it by branch_back) or a rep string instruction
 * (PC_REP); PC_NONE when the stream passes over pc or loses its way before it. at
 * (resync_info's stream A): marks each instruction start before pc at at[ip - from], and a
 * byte that does not decode before pc restarts the stream after it instead of failing. */
static uint64_t walk(const uint8_t *code, uint64_t lo, uint64_t hi, uint64_t from, uint64_t pc,
                     uint64_t stop, uint8_t *at) {
  ZydisDecoderContext ctx;
  ZydisDecodedInstruction in;
  uint64_t ip = from, prev = 0, info = 0;
  while (ip < stop && ip <= pc) {
    if (!ZYAN_SUCCESS(
            ZydisDecoderDecodeInstruction(&dec, &ctx, code + (ip - lo), avail_to(hi, ip), &in))) {
      if (ip >= pc) return info | (prev << 48); /* the stream ends at pc */
      if (!at) return PC_NONE;                  /* lost the instruction stream before pc */
      memset(at, 0, RESYNC_BACK);               /* not code, or not in step: start again after it */
      prev = 0;
      ip++;
      continue;
    }
    if (ip < pc) {
      if (at) at[ip - from] = 1;
      if (ip + in.length > pc) return PC_NONE; /* passes over pc: pc inside an instruction */
      prev = ip + in.length == pc && !is_branch(&in) ? in.length : 0;
    } else if (in.attributes &
               (ZYDIS_ATTRIB_HAS_REP | ZYDIS_ATTRIB_HAS_REPE | ZYDIS_ATTRIB_HAS_REPNE)) {
      info |= PC_REP; /* (ip == pc) */
    }
    if (branches_to(&in, ip, pc)) info |= PC_TARGET;
    ip += in.length;
  }
  if (ip > pc && ip < stop && !(info & PC_TARGET) && branch_back(code, lo, hi, ip, pc, stop))
    info |= PC_TARGET;
  return info | (prev << 48);
}

/* Skid information of pc from the code around it, where no function table leads to pc:
 * code without unwind entries (Go, hand-written assembly kernels) and code compiled at run
 * time. Bytes [lo, hi) are at code (code[0] is the byte at lo); lo <= pc < hi.
 *
 * x86 code decoded from an arbitrary byte falls into the real instruction stream within a
 * few instructions (it is self-synchronising). Stream A is decoded from RESYNC_BACK bytes
 * before pc (restarting after a byte that does not decode); it must reach pc exactly. Up
 * to sixteen more streams start at the next offsets where A has no instruction start; each
 * joins one of A's instruction starts before pc (it agrees with A from there on), stops
 * decoding or passes over pc (it says nothing), or reaches pc without joining A: it would
 * put another instruction before pc, and then there is no answer. After three joins and no
 * disagreement, or with no disagreement when every start was tried (in int3 padding every
 * byte is one of A's), A's instruction before pc is taken. Branch targets: direct branches
 * decoded in [lo, hi) only (a function table sees the whole function). */
#define RESYNC_TRIES 16
#define RESYNC_JOINS 3

static uint64_t resync_info(const uint8_t *code, uint64_t lo, uint64_t hi, uint64_t pc) {
  if (pc - lo < 16) return PC_NONE; /* too little before pc to tell */
  uint64_t start = pc - lo > RESYNC_BACK ? pc - RESYNC_BACK : lo;
  uint8_t at[RESYNC_BACK] = {0}; /* at[ip - start]: A has an instruction start at ip */
  uint64_t info = walk(code, lo, hi, start, pc, hi - pc > FN_PAST_PC ? pc + FN_PAST_PC : hi, at);
  if (info & PC_NONE) return info;
  ZydisDecoderContext ctx;
  ZydisDecodedInstruction in;
  uint64_t ip;
  /* Checks start where A has no instruction (one that starts on A's proves nothing). One
   * that stops decoding, or passes over pc, says nothing. */
  int tries = 0, joins = 0;
  for (uint64_t s = start + 1; tries < RESYNC_TRIES && joins < RESYNC_JOINS && s + 16 < pc; s++) {
    if (at[s - start]) continue;
    tries++;
    for (ip = s; ip < pc;) {
      if (!ZYAN_SUCCESS(
              ZydisDecoderDecodeInstruction(&dec, &ctx, code + (ip - lo), avail_to(hi, ip), &in)))
        break;
      ip += in.length;
      if (ip < pc && at[ip - start]) {
        joins++;
        break;
      }
      if (ip == pc) return PC_NONE; /* another instruction ends at pc: no answer */
    }
  }
  /* Fewer joins than asked for are enough when every start was tried: then no other
   * stream through these bytes reaches pc (A's own starts are A). */
  if (joins < RESYNC_JOINS && tries == RESYNC_TRIES) return PC_NONE;
  return info;
}

/* Decode the function holding pc from its start: the instruction before pc (when it falls
 * through to pc) and whether pc is a direct-branch target inside the function or its
 * start. Calls land at function starts, so targets from outside are rare. Where no function
 * table leads to pc, the code around pc is decoded instead (resync_info). */
static uint64_t skid_info(const struct module *m, uint64_t pc) {
  uint64_t start, end;
  if (function_of(m, pc, &start, &end) != 0 || pc - start > FN_MAX) {
    uint64_t lo = pc - m->lo > RESYNC_BACK ? pc - RESYNC_BACK : m->lo;
    uint64_t hi = m->hi - pc > FN_PAST_PC ? pc + FN_PAST_PC : m->hi;
    return resync_info((const uint8_t *)lo, lo, hi, pc);
  }
  uint64_t stop = end - pc > FN_PAST_PC ? pc + FN_PAST_PC : end;
  return walk((const uint8_t *)start, start, end, start, pc, stop, NULL) |
         (pc == start ? PC_TARGET : 0);
}

/* The cache: one word per key (bit 63 valid, the key: a pc, or an address | PC_CALL, and
 * its answer), lock-free, never emptied but all at once (refresh_modules, code unloaded).
 * Open addressing in two tiers: the first CACHE_NEAR slots (one page), then the others,
 * CACHE_PROBES slots each; a key whose probes all hold other keys replaces the last one.
 * Direct-mapped on the pc's low bits (nearby pcs sharing pages), a program's few dozen
 * sampled pcs still fell on 6-9 of the table's 32 pages, all resident in the program: now on
 * one. cache_find returns the key's word, or 0 with the slot to give cache_put. */
struct cache_slot {
  uint32_t k;
  int empty;
};

static uint64_t cache_find(uint64_t key, struct cache_slot *at) {
  uint64_t h = key * 0x9e3779b97f4a7c15ull;
  uint32_t near = (uint32_t)(h >> 40), far = (uint32_t)(h >> 16);
  at->k = 0;
  at->empty = 0;
  for (uint32_t i = 0; i < 2 * CACHE_PROBES && !at->empty; i++) {
    at->k = locus_tiered_slot(near, far, i, CACHE_NEAR, CACHE_PROBES, CACHE_SLOTS);
    uint64_t w = atomic_load_explicit(&pc_cache[at->k], memory_order_relaxed);
    if ((w & PC_VALID) && (w & (PC_MASK | PC_CALL)) == key) return w;
    at->empty = !(w & PC_VALID); /* never emptied one by one: key is not further on */
  }
  return 0;
}

static void cache_put(const struct cache_slot *at, uint64_t w) {
  uint64_t was = 0;
  if (!at->empty) /* all probes taken: replace the last one */
    atomic_store_explicit(&pc_cache[at->k], w, memory_order_relaxed);
  else /* unless another thread took the slot meanwhile */
    atomic_compare_exchange_strong_explicit(&pc_cache[at->k], &was, w, memory_order_relaxed,
                                            memory_order_relaxed);
}

static uint64_t lookup(const struct module *m, uint64_t pc) {
  struct cache_slot at;
  uint64_t w = cache_find(pc, &at);
  if (!w) {
    w = skid_info(m, pc) | PC_VALID | pc;
    cache_put(&at, w);
  }
  return w;
}

/* ---- decoding ---- */
static const int8_t gpr_slot[] = {
    [ZYDIS_REGISTER_RAX] = REG_RAX, [ZYDIS_REGISTER_RCX] = REG_RCX, [ZYDIS_REGISTER_RDX] = REG_RDX,
    [ZYDIS_REGISTER_RBX] = REG_RBX, [ZYDIS_REGISTER_RSP] = REG_RSP, [ZYDIS_REGISTER_RBP] = REG_RBP,
    [ZYDIS_REGISTER_RSI] = REG_RSI, [ZYDIS_REGISTER_RDI] = REG_RDI, [ZYDIS_REGISTER_R8] = REG_R8,
    [ZYDIS_REGISTER_R9] = REG_R9,   [ZYDIS_REGISTER_R10] = REG_R10, [ZYDIS_REGISTER_R11] = REG_R11,
    [ZYDIS_REGISTER_R12] = REG_R12, [ZYDIS_REGISTER_R13] = REG_R13, [ZYDIS_REGISTER_R14] = REG_R14,
    [ZYDIS_REGISTER_R15] = REG_R15,
};

static ZydisRegister wide(ZydisRegister r) {
  return r == ZYDIS_REGISTER_NONE ? r
                                  : ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r);
}

/* Value of a general-purpose register; -1 for anything else. */
static int reg_value(ZydisRegister r, const greg_t *g, uint64_t *v) {
  r = wide(r);
  if (r < ZYDIS_REGISTER_RAX || r > ZYDIS_REGISTER_R15) return -1;
  *v = (uint64_t)g[gpr_slot[r]];
  return 0;
}

enum { DEC_OK = 0, DEC_NOMEM = 1, DEC_UNDECODED = 2, DEC_CLOBBERED = 3, DEC_SYSCALL = 4 };

/* A prefetch: a hint, no access the report counts; the run ahead passes over it. */
static int is_prefetch(ZydisMnemonic m) {
  switch (m) {
    case ZYDIS_MNEMONIC_PREFETCH:
    case ZYDIS_MNEMONIC_PREFETCHNTA:
    case ZYDIS_MNEMONIC_PREFETCHT0:
    case ZYDIS_MNEMONIC_PREFETCHT1:
    case ZYDIS_MNEMONIC_PREFETCHT2:
    case ZYDIS_MNEMONIC_PREFETCHW:
    case ZYDIS_MNEMONIC_PREFETCHWT1:
      return 1;
    default:
      return 0;
  }
}

static uint64_t size_mask(uint32_t bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }

/* The low `bits` of v, sign-extended. */
static int64_t sext(uint64_t v, uint32_t bits) {
  v &= size_mask(bits);
  return (int64_t)(bits < 64 && (v >> (bits - 1) & 1) ? v | ~size_mask(bits) : v);
}

/* The memory access of the decoded instruction `in` (operands ops) at ip. `executed`: the
 * registers g (a ucontext's gregs) are those after it ran (skid), else before. */
static int access_decoded(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
                          uint64_t ip, const greg_t *g, int executed, struct locus_comm_access *a) {
  if (is_prefetch(in->mnemonic)) return DEC_NOMEM;
  switch (in->mnemonic) {
    case ZYDIS_MNEMONIC_CLFLUSH:
    case ZYDIS_MNEMONIC_CLFLUSHOPT:
    case ZYDIS_MNEMONIC_CLWB:
    case ZYDIS_MNEMONIC_CLDEMOTE:
    case ZYDIS_MNEMONIC_NOP:
    case ZYDIS_MNEMONIC_LEA:
      return DEC_NOMEM;
    default:
      break;
  }
  const ZydisDecodedOperand *mem = NULL;
  for (int i = 0; i < in->operand_count; i++) {
    const ZydisDecodedOperand *o = &ops[i];
    if (o->type != ZYDIS_OPERAND_TYPE_MEMORY) continue;
    if (o->mem.type == ZYDIS_MEMOP_TYPE_VSIB) return DEC_UNDECODED; /* gather/scatter */
    if (o->mem.type != ZYDIS_MEMOP_TYPE_MEM) continue;
    if (!(o->actions & (ZYDIS_OPERAND_ACTION_MASK_READ | ZYDIS_OPERAND_ACTION_MASK_WRITE)))
      continue;
    /* movs/cmps have two: the write is the one that matters for communication. */
    if (!mem || (o->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE)) mem = o;
  }
  if (!mem) return DEC_NOMEM;
  ZydisRegister base = wide(mem->mem.base), index = wide(mem->mem.index);
  int push = in->mnemonic == ZYDIS_MNEMONIC_PUSH || in->mnemonic == ZYDIS_MNEMONIC_PUSHFQ ||
             in->mnemonic == ZYDIS_MNEMONIC_CALL;
  int pop = in->mnemonic == ZYDIS_MNEMONIC_POP || in->mnemonic == ZYDIS_MNEMONIC_POPFQ;
  if (executed && !push && !pop) {
    for (int i = 0; i < in->operand_count; i++) {
      const ZydisDecodedOperand *o = &ops[i];
      if (o->type != ZYDIS_OPERAND_TYPE_REGISTER || !(o->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
        continue;
      ZydisRegister w = wide(o->reg.value);
      if ((base != ZYDIS_REGISTER_NONE && w == base) ||
          (index != ZYDIS_REGISTER_NONE && w == index))
        return DEC_CLOBBERED;
    }
  }
  uint64_t addr = (uint64_t)mem->mem.disp.value, v;
  if (mem->mem.base == ZYDIS_REGISTER_RIP || mem->mem.base == ZYDIS_REGISTER_EIP) {
    addr += ip + in->length;
  } else if (base != ZYDIS_REGISTER_NONE) {
    if (reg_value(base, g, &v) != 0) return DEC_UNDECODED;
    addr += v;
  }
  if (index != ZYDIS_REGISTER_NONE) {
    if (reg_value(index, g, &v) != 0) return DEC_UNDECODED;
    addr += v * (mem->mem.scale ? mem->mem.scale : 1);
  }
  /* bt, bts, btr, btc on memory with the bit offset in a register address a bit string:
   * the word they access is the operand-sized one holding that bit, anywhere from the
   * operand (a shared bitmap's `lock bts`), not the operand's own address. */
  if ((in->mnemonic == ZYDIS_MNEMONIC_BT || in->mnemonic == ZYDIS_MNEMONIC_BTS ||
       in->mnemonic == ZYDIS_MNEMONIC_BTR || in->mnemonic == ZYDIS_MNEMONIC_BTC) &&
      in->operand_count_visible == 2 && mem == &ops[0] &&
      ops[1].type == ZYDIS_OPERAND_TYPE_REGISTER &&
      (mem->size == 16 || mem->size == 32 || mem->size == 64)) {
    if (reg_value(ops[1].reg.value, g, &v) != 0) return DEC_UNDECODED;
    uint32_t shift = mem->size == 16 ? 4 : mem->size == 32 ? 5 : 6;
    addr += (uint64_t)((sext(v, ops[1].size) >> shift) * (int64_t)(mem->size / 8));
  }
  if (in->address_width == 32) addr &= 0xffffffffu;
  if (mem->mem.segment == ZYDIS_REGISTER_FS) addr += me_soft.fs_base;
  if (mem->mem.segment == ZYDIS_REGISTER_GS) addr += me_soft.gs_base;
  uint32_t len = mem->size / 8;
  if (len == 0) return DEC_NOMEM;
  if (len > 64) len = 64;
  /* Zydis reports [rsp] for push/call, which write below it; pop reads [rsp] and then
   * moves rsp up. */
  if (push && !executed) addr -= len;
  if (pop && executed) addr -= len;
  uint32_t flags = 0;
  if (mem->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) flags |= LOCUS_AC_STORE;
  if ((in->attributes & ZYDIS_ATTRIB_HAS_LOCK) || in->mnemonic == ZYDIS_MNEMONIC_XCHG)
    flags |= LOCUS_AC_ATOMIC;
  if (addr >= me_soft.stack_lo && addr < me_soft.stack_hi) flags |= LOCUS_AC_STACK;
  a->addr = addr;
  a->len = len;
  a->ip = ip;
  a->flags = flags;
  return DEC_OK;
}

/* The same of the instruction in the bytes at code. */
static int access_of(const void *code, size_t avail, uint64_t ip, const greg_t *g, int executed,
                     struct locus_comm_access *a) {
  ZydisDecodedInstruction in;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, code, avail, &in, ops))) return DEC_UNDECODED;
  return access_decoded(&in, ops, ip, g, executed, a);
}

static inline size_t avail_in(const struct module *m, uint64_t ip) { return avail_to(m->hi, ip); }

/* The code bytes at pc: in a loaded object, the object's own (p = pc); outside every
 * object (code compiled at run time: the JVM, V8, Julia, LuaJIT), a copy made with
 * process_vm_readv, which fails cleanly where a plain read could fault (an instruction may
 * end on an unmapped page, the code may be unmapped meanwhile). avail: the bytes there
 * (0: none); m: the object or NULL. Fetched once per signal and shared by its users. */
struct code {
  const struct module *m;
  const void *p;
  size_t avail;
  uint8_t buf[16];
};

/* [a, a + n) (n at most two pages) copied into buf with process_vm_readv, one element per
 * page, so that a partial copy stops at the first page that cannot be read; the bytes
 * copied. */
static size_t copy_self(long pid, uint64_t a, void *buf, size_t n) {
  struct iovec local = {buf, n}, remote[3];
  unsigned long nr = 0;
  for (uint64_t p = a, end = a + n; p < end && nr < 3;) {
    uint64_t next = (p | 4095u) + 1;
    if (next > end) next = end;
    remote[nr++] = (struct iovec){(void *)p, (size_t)(next - p)};
    p = next;
  }
  long r = syscall(SYS_process_vm_readv, pid, &local, 1UL, remote, nr, 0UL);
  return r > 0 ? (size_t)r : 0;
}

static void code_at(uint64_t pc, struct code *c) {
  c->m = pc < 0x800000000000ull ? module_of(pc) : NULL;
  c->p = c->buf;
  c->avail = 0;
  if (c->m) {
    c->p = (const void *)pc;
    c->avail = avail_in(c->m, pc);
    return;
  }
  if (pc >= 0x800000000000ull || pc < 4096) return;
  c->avail = copy_self(syscall(SYS_getpid), pc, c->buf, ZYDIS_MAX_INSTRUCTION_LENGTH);
}

/* Code bytes around pc outside every loaded object, copied (process_vm_readv, as in
 * code_at) into buf: from RESYNC_BACK bytes before pc (from pc's page when the page before
 * it is not mapped) to up to JIT_AFTER bytes after it. *lo: the address of buf[0]; returns
 * the bytes copied (0: none). */
#define JIT_AFTER 64u
static size_t jit_code(uint64_t pc, uint8_t *buf, uint64_t *lo) {
  uint64_t page = pc & ~4095ull;
  long pid = syscall(SYS_getpid);
  for (int pass = 0; pass < 2; pass++) {
    /* A failing element ends the copy: the page before pc's is its own element, first. */
    *lo = pass == 0 ? pc - RESYNC_BACK : page;
    size_t n = copy_self(pid, *lo, buf, (size_t)(pc + JIT_AFTER - *lo));
    if (n > pc - *lo) return n;
    if (*lo >= page) break; /* already from pc's page */
  }
  return 0;
}

/* The code before pc: its skid information, from the function table (lookup, cached) in a
 * loaded object m, else from the code around pc (resync_info; for run-time compiled code
 * from a fresh copy in b each time, as such code is replaced in place). */
struct around {
  uint8_t buf[RESYNC_BACK + JIT_AFTER];
  uint64_t lo; /* address of buf[0] */
  size_t n;    /* bytes copied */
};

static uint64_t skid_at(const struct module *m, uint64_t pc, struct around *b) {
  if (m) return lookup(m, pc);
  b->n = jit_code(pc, b->buf, &b->lo);
  return b->n > pc - b->lo ? resync_info(b->buf, b->lo, b->lo + b->n, pc) : PC_NONE;
}

/* The access of the instruction of prevlen bytes before pc, which ran (see skid_at). */
static int access_before(const struct module *m, const struct around *b, uint64_t pc,
                         uint64_t prevlen, const ucontext_t *uc, struct locus_comm_access *a) {
  uint64_t prev = pc - prevlen;
  const void *code = m ? (const void *)prev : b->buf + (prev - b->lo);
  size_t avail = m ? avail_in(m, prev) : b->lo + b->n - prev;
  if (avail > ZYDIS_MAX_INSTRUCTION_LENGTH) avail = ZYDIS_MAX_INSTRUCTION_LENGTH;
  return access_of(code, avail, prev, uc->uc_mcontext.gregs, 1, a);
}

/* ---- a load that overwrote its own address register ----
 * `lea counter(%rip),%rax; mov (%rdx,%rax,1),%rax`, an array of globals at -O0: once the
 * load ran, its address register holds what it loaded, and its address cannot be computed
 * from the registers at pc. When straight-line code just before the load set that register
 * to a constant (a rip-relative lea, a mov of an immediate), the constant was its value at
 * the load, and the address is computed with it. In an object's own code only (its function
 * table says which instruction falls through to which). The instruction between the load
 * and pc in a skid of two must not write the load's other address register.
 * A pointer reloaded from the thread's own frame (`mov -0x10(%rbp),%rax; mov (%rax),%rax`:
 * -O0's `p->n++` through a pointer local, whose load lost its samples to the reload after
 * it) is read again from its slot, when no instruction since wrote memory or the slot's base
 * register (rbp, rsp): only this thread writes its frame. Not a pointer loaded from
 * anywhere else: another thread may have changed it since (a spin on `*p` for a global p,
 * see access_ahead). */
#define RECOVER_BACK 4 /* instructions looked back at from the load */
static uint32_t written_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);
static uint32_t addr_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);
static int writes_rip(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);
static int writes_memory(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);
static uint32_t reg_bit(ZydisRegister r);

/* The instruction at ip (its bytes by code_at); 0 when it decodes. */
static int decode_at(uint64_t ip, ZydisDecodedInstruction *in, ZydisDecodedOperand *ops) {
  struct code c;
  code_at(ip, &c);
  return c.avail && ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, c.p, c.avail, in, ops)) ? 0 : -1;
}

/* The registers the straight-line instructions in [from, pc) wrote (added to *since), and
 * whether one wrote memory (*stored); -1 when one does not decode or branches. */
static int ran_since(uint64_t from, uint64_t pc, uint32_t *since, int *stored) {
  ZydisDecodedInstruction p;
  ZydisDecodedOperand pops[ZYDIS_MAX_OPERAND_COUNT];
  for (uint64_t ip = from; ip < pc; ip += p.length) {
    if (decode_at(ip, &p, pops) != 0 || writes_rip(&p, pops)) return -1;
    *since |= written_regs(&p, pops);
    *stored |= writes_memory(&p, pops);
  }
  return 0;
}

static int recover_clobbered(const struct module *m, uint64_t at, uint64_t pc, const greg_t *g,
                             struct locus_comm_access *a) {
  ZydisDecodedInstruction in, p;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT], pops[ZYDIS_MAX_OPERAND_COUNT];
  if (!m || decode_at(at, &in, ops) != 0) return DEC_CLOBBERED;
  uint32_t lost = written_regs(&in, ops), used = addr_regs(&in, ops), since = lost;
  int stored = 0; /* memory written after the register was set (the frame reload's check) */
  if (ran_since(at + in.length, pc, &since, &stored) != 0) return DEC_CLOBBERED;
  /* One register lost, the load's destination, and none of its others written since. */
  if (!(lost & used) || (lost & (lost - 1)) || (since & used & ~lost)) return DEC_CLOBBERED;
  uint64_t cur = at;
  for (int k = 0; k < RECOVER_BACK; k++) {
    uint64_t w = lookup(m, cur), len = (w >> 48) & 0xf;
    if ((w & (PC_NONE | PC_TARGET)) || !len) return DEC_CLOBBERED; /* not straight-line */
    cur -= len;
    if (decode_at(cur, &p, pops) != 0 || writes_rip(&p, pops)) return DEC_CLOBBERED;
    if (!(written_regs(&p, pops) & lost)) {
      since |= written_regs(&p, pops);
      stored |= writes_memory(&p, pops);
      continue;
    }
    if (p.operand_count_visible != 2 || pops[0].type != ZYDIS_OPERAND_TYPE_REGISTER ||
        pops[0].size < 32)
      return DEC_CLOBBERED;
    uint64_t v;
    const ZydisDecodedOperand *src = &pops[1];
    if (p.mnemonic == ZYDIS_MNEMONIC_LEA && src->mem.base == ZYDIS_REGISTER_RIP &&
        src->mem.index == ZYDIS_REGISTER_NONE)
      v = cur + p.length + (uint64_t)src->mem.disp.value;
    else if (p.mnemonic == ZYDIS_MNEMONIC_MOV && src->type == ZYDIS_OPERAND_TYPE_IMMEDIATE)
      v = src->imm.is_signed ? (uint64_t)src->imm.value.s : src->imm.value.u;
    else if (p.mnemonic == ZYDIS_MNEMONIC_MOV && src->type == ZYDIS_OPERAND_TYPE_MEMORY &&
             pops[0].size == 64 && src->size == 64 && !stored &&
             (src->mem.base == ZYDIS_REGISTER_RBP || src->mem.base == ZYDIS_REGISTER_RSP) &&
             src->mem.index == ZYDIS_REGISTER_NONE && !(since & reg_bit(src->mem.base)) &&
             src->mem.segment != ZYDIS_REGISTER_FS && src->mem.segment != ZYDIS_REGISTER_GS) {
      uint64_t base;
      if (reg_value(src->mem.base, g, &base) != 0 ||
          copy_self(syscall(SYS_getpid), base + (uint64_t)src->mem.disp.value, &v, 8) != 8)
        return DEC_CLOBBERED;
    } else
      return DEC_CLOBBERED; /* set from something else: not known */
    greg_t regs[NGREG];
    memcpy(regs, g, sizeof regs);
    regs[gpr_slot[ZYDIS_REGISTER_RAX + __builtin_ctz(lost)]] =
        (greg_t)(v & size_mask(pops[0].size));
    return access_decoded(&in, ops, at, regs, 0, a); /* as before the load ran */
  }
  return DEC_CLOBBERED;
}

/* ---- past the thread's own frame ----
 * A skid-corrected sample that lands on an access to the thread's own frame (rbp- or
 * rsp-based, no index: a local reloaded, a spilled register, -O0's loop counter) was rarely
 * the instruction the thread waited on: the frame is the thread's own and stays in its L1.
 * The timer lands a few instructions after a load that missed: at -O0, `p->n++` through a
 * pointer local is `mov -0x10(%rbp),%rax; mov (%rax),%rax; lea 1(%rax),%rdx; mov
 * -0x10(%rbp),%rax; mov %rdx,(%rax)`, and its samples fell on the second reload of p, 367
 * of 1152, beside 209 on the load of p->n itself. The sample is then the nearest access
 * before it, up to FRAME_BACK instructions back in straight-line code, that is not on the
 * frame, when its address can still be computed: its address registers unchanged since, or
 * its own destination, recovered as recover_clobbered does. Frame accesses in between are
 * passed over; a merge point or a branch ends the search (what ran before it is not
 * known), and the frame access stays the sample. */
#define FRAME_BACK 3
/* Whether every memory operand of the instruction is on the frame: rbp- or rsp-based, no
 * index, not fs/gs-relative (callers ask of an instruction with an access). */
static int frame_based(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  for (int i = 0; i < in->operand_count; i++) {
    const ZydisDecodedOperand *o = &ops[i];
    if (o->type != ZYDIS_OPERAND_TYPE_MEMORY || o->mem.type != ZYDIS_MEMOP_TYPE_MEM) continue;
    ZydisRegister b = wide(o->mem.base);
    if ((b != ZYDIS_REGISTER_RBP && b != ZYDIS_REGISTER_RSP) ||
        o->mem.index != ZYDIS_REGISTER_NONE || o->mem.segment == ZYDIS_REGISTER_FS ||
        o->mem.segment == ZYDIS_REGISTER_GS)
      return 0;
  }
  return 1;
}

/* Whether addr is in the read-only code or data (its constants) of m, the object of the
 * code that accesses it: a rip-relative constant is its own object's. No scan of the
 * objects: this is asked at most samples. */
static int read_only(const struct module *m, uint64_t addr) {
  return m && ((addr >= m->lo && addr < m->hi) || (addr >= m->ro_lo && addr < m->ro_hi));
}

/* Whether access a of the instruction is one the thread does not wait on: its own frame
 * (frame_based), or a constant it loads rip-relative from an object's read-only data (a
 * literal of floating-point code: `movsd .LC0(%rip),%xmm0`), which no thread writes and
 * which stays cached. A table indexed by a register is not one: it may miss. */
static int quiet(const struct module *m, const ZydisDecodedInstruction *in,
                 const ZydisDecodedOperand *ops, const struct locus_comm_access *a) {
  if (a->flags & LOCUS_AC_STACK) return frame_based(in, ops);
  if (a->flags & LOCUS_AC_STORE) return 0;
  for (int i = 0; i < in->operand_count; i++)
    if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY && ops[i].mem.type == ZYDIS_MEMOP_TYPE_MEM &&
        ops[i].mem.base != ZYDIS_REGISTER_RIP)
      return 0;
  return read_only(m, a->addr);
}

/* Whether a sample's access may be a quiet one (quiet: its instruction not decoded yet) on
 * a line no other thread writes: the moves off it are tried. */
static int maybe_quiet(const struct module *m, const struct locus_comm_access *a) {
  return (a->flags & LOCUS_AC_STACK || read_only(m, a->addr)) && !locus_comm_line_foreign(a->addr);
}

static int past_frame(const struct module *m, uint64_t at, uint64_t pc, const greg_t *g,
                      struct locus_comm_access *a) {
  ZydisDecodedInstruction in;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (!m || decode_at(at, &in, ops) != 0 || !quiet(m, &in, ops, a)) return -1;
  uint64_t cur = at;
  for (int k = 0; k < FRAME_BACK; k++) {
    uint64_t w = lookup(m, cur), len = (w >> 48) & 0xf;
    if ((w & (PC_NONE | PC_TARGET)) || !len) return -1; /* not straight-line */
    cur -= len;
    struct locus_comm_access t;
    if (decode_at(cur, &in, ops) != 0) return -1;
    int rc = access_decoded(&in, ops, cur, g, 1, &t);
    int q = rc == DEC_OK && quiet(m, &in, ops, &t);
    if (q && locus_comm_line_foreign(t.addr)) return -1;
    if (rc == DEC_NOMEM || q) continue;
    if (rc == DEC_CLOBBERED) return recover_clobbered(m, cur, pc, g, a) == DEC_OK ? 0 : -1;
    uint32_t since = 0;
    int stored = 0;
    if (rc != DEC_OK || ran_since(cur + in.length, pc, &since, &stored) != 0 ||
        (since & addr_regs(&in, ops)))
      return -1;
    *a = t;
    return 0;
  }
  return -1;
}

/* The sampled access at pc, skid-corrected: the instruction before pc (skid_at). *clobbered:
 * that instruction's address when it was a load that overwrote its own address register
 * (`mov (%rax),%rax`), whose access cannot be computed any more, or the one before it when
 * it has no memory operand (`mov (%rax),%rax; cmp %rdi,%rax` and the timer lands on the
 * branch after: a skid of two in a VM); else 0. */
static int sampled_access(uint64_t pc, const struct code *c, const ucontext_t *uc,
                          struct locus_comm_access *a, uint64_t *clobbered) {
  *clobbered = 0;
  if (!c->avail) return DEC_UNDECODED;
  struct around b;
  uint64_t w = skid_at(c->m, pc, &b);
  /* No previous instruction known (a function longer than FN_MAX; code the linear decode
   * loses; code around pc that does not decode in step): pc itself is always an
   * instruction boundary, and its access is exact. */
  if (w & PC_NONE) return access_of(c->p, c->avail, pc, uc->uc_mcontext.gregs, 0, a);
  uint64_t prevlen = (w >> 48) & 0xf;
  /* A rep string instruction (memset, memcpy) with iterations left was interrupted in its
   * middle: the access is its own, not the previous instruction's. */
  int mid_rep = (w & PC_REP) && uc->uc_mcontext.gregs[REG_RCX] != 0;
  if (!(w & PC_TARGET) && prevlen && !mid_rep) {
    int rc = access_before(c->m, &b, pc, prevlen, uc, a);
    if (rc == DEC_NOMEM) {
      struct around b2;
      struct locus_comm_access t;
      uint64_t prev = pc - prevlen, w2 = skid_at(c->m, prev, &b2), len2 = (w2 >> 48) & 0xf;
      if (!(w2 & (PC_NONE | PC_TARGET)) && len2 &&
          access_before(c->m, &b2, prev, len2, uc, &t) == DEC_CLOBBERED) {
        if (recover_clobbered(c->m, prev - len2, pc, uc->uc_mcontext.gregs, a) == DEC_OK)
          rc = DEC_OK;
        else
          *clobbered = prev - len2;
      }
    }
    if (rc == DEC_CLOBBERED &&
        recover_clobbered(c->m, pc - prevlen, pc, uc->uc_mcontext.gregs, a) == DEC_OK)
      rc = DEC_OK;
    if (rc == DEC_OK && maybe_quiet(c->m, a)) past_frame(c->m, a->ip, pc, uc->uc_mcontext.gregs, a);
    if (rc != DEC_CLOBBERED) {
      a->flags |= LOCUS_AC_SKID;
      return rc;
    }
    *clobbered = pc - prevlen;
  }
  return access_of(c->p, c->avail, pc, uc->uc_mcontext.gregs, 0, a);
}

/* ---- running ahead without stepping ----
 * Where the sampled instruction (and, skid-corrected, the one before it) has no usable
 * memory access, the next instruction with one is the sample (as the single steps below
 * find it). Most of the instructions in between only move registers and flags: a loop's
 * compare and branch, an index update. They are interpreted here on a copy of the
 * registers, from pc, following direct branches, until the first instruction with a memory
 * operand, whose access is then computed from the interpreted registers, exactly as a step
 * that reached it would; no trap, a few decodes. Anything not interpreted (a call, a
 * return, an indirect branch, a system call, an instruction reading flags this code has
 * not computed, SIMD) ends the run ahead and the thread is single-stepped from pc as
 * before. A merge point (a loop's head, reached by a jump or by falling through: its
 * previous instruction is not known to have run) is the common case: `if (id == 0)
 * s.a++; else ...` compiled with the store before the loop's test. */
#define AHEAD_MAX 32
#define FRAME_STORES 4   /* frame stores off_frame's run keeps aside */
static int ahead_on = 1; /* LOCUS_SOFT_AHEAD=0: off (step only) */
#define EF_CF 0x1ull
#define EF_PF 0x4ull
#define EF_ZF 0x40ull
#define EF_SF 0x80ull
#define EF_OF 0x800ull
#define EF_ARITH (EF_CF | EF_PF | EF_ZF | EF_SF | EF_OF)

struct ahead {
  greg_t g[NGREG];
  uint64_t known;   /* the EFL bits that are those the code would see */
  uint64_t mem;     /* the value of the instruction's memory operand, read (frame reads) */
  int mem_ok;       /* 1: mem holds it; 0: memory operands are not interpreted */
  int mem_written;  /* the instruction wrote its memory operand: mem_out */
  uint64_t mem_out; /* ... this value (of the operand's size) */
  struct {          /* the frame's bytes the run wrote, not written in memory (off_frame) */
    uint64_t addr, v;
    uint32_t len;
  } fs[FRAME_STORES];
  int nfs;
};

/* A general-purpose register operand's value (bits of its size); -1: not one we track
 * (AH-DH, segment, vector, flags). */
static int ahead_reg(const struct ahead *s, const ZydisDecodedOperand *o, uint64_t *v) {
  ZydisRegister r = o->reg.value;
  if (r == ZYDIS_REGISTER_AH || r == ZYDIS_REGISTER_BH || r == ZYDIS_REGISTER_CH ||
      r == ZYDIS_REGISTER_DH)
    return -1;
  if (reg_value(r, s->g, v) != 0) return -1;
  *v &= size_mask(o->size);
  return 0;
}

static int ahead_read(const struct ahead *s, const ZydisDecodedOperand *o, uint32_t bits,
                      uint64_t *v) {
  if (o->type == ZYDIS_OPERAND_TYPE_REGISTER) return ahead_reg(s, o, v);
  if (o->type == ZYDIS_OPERAND_TYPE_MEMORY && o->mem.type == ZYDIS_MEMOP_TYPE_MEM && s->mem_ok) {
    *v = s->mem & size_mask(o->size);
    return 0;
  }
  if (o->type != ZYDIS_OPERAND_TYPE_IMMEDIATE) return -1;
  *v = (o->imm.is_signed ? (uint64_t)o->imm.value.s : o->imm.value.u) & size_mask(bits);
  return 0;
}

/* Writes a register operand as the CPU does: a 32-bit write clears the upper half, an 8- or
 * 16-bit write keeps the other bits. */
static int ahead_write(struct ahead *s, const ZydisDecodedOperand *o, uint64_t v) {
  uint64_t old;
  if (o->type == ZYDIS_OPERAND_TYPE_MEMORY && o->mem.type == ZYDIS_MEMOP_TYPE_MEM && s->mem_ok) {
    s->mem_out = v & size_mask(o->size); /* (kept by the caller: off_frame's frame stores) */
    s->mem_written = 1;
    return 0;
  }
  if (o->type != ZYDIS_OPERAND_TYPE_REGISTER || ahead_reg(s, o, &old) != 0) return -1;
  greg_t *slot = &s->g[gpr_slot[wide(o->reg.value)]];
  if (o->size == 64)
    *slot = (greg_t)v;
  else if (o->size == 32)
    *slot = (greg_t)(v & 0xffffffffu);
  else
    *slot = (greg_t)(((uint64_t)*slot & ~size_mask(o->size)) | (v & size_mask(o->size)));
  return 0;
}

static void ahead_flags(struct ahead *s, uint64_t r, uint32_t bits, uint64_t cf, uint64_t of) {
  uint64_t f = (uint64_t)s->g[REG_EFL] & ~EF_ARITH;
  r &= size_mask(bits);
  if (cf) f |= EF_CF;
  if (of) f |= EF_OF;
  if (r == 0) f |= EF_ZF;
  if (r >> (bits - 1) & 1) f |= EF_SF;
  if (!__builtin_parity((unsigned)(r & 0xff))) f |= EF_PF; /* inline, no libgcc call */
  s->g[REG_EFL] = (greg_t)f;
  s->known |= EF_ARITH;
}

/* The flags condition code cc (the low 4 bits of the jcc/setcc/cmovcc opcode) reads. */
static const uint64_t cond_reads[8] = {EF_OF, EF_CF, EF_ZF,         EF_CF | EF_ZF,
                                       EF_SF, EF_PF, EF_SF | EF_OF, EF_ZF | EF_SF | EF_OF};

/* Condition code cc on the flags. */
static int ahead_cond(uint64_t f, int cc) {
  int cf = !!(f & EF_CF), zf = !!(f & EF_ZF), sf = !!(f & EF_SF), of = !!(f & EF_OF);
  int pf = !!(f & EF_PF), r;
  switch (cc >> 1) {
    case 0:
      r = of;
      break;
    case 1:
      r = cf;
      break;
    case 2:
      r = zf;
      break;
    case 3:
      r = cf || zf;
      break;
    case 4:
      r = sf;
      break;
    case 5:
      r = pf;
      break;
    case 6:
      r = sf != of;
      break;
    default:
      r = zf || sf != of;
      break;
  }
  return (cc & 1) ? !r : r;
}

static int ahead_cc(ZydisMnemonic m) {
  static const ZydisMnemonic jcc[16] = {
      ZYDIS_MNEMONIC_JO, ZYDIS_MNEMONIC_JNO, ZYDIS_MNEMONIC_JB,  ZYDIS_MNEMONIC_JNB,
      ZYDIS_MNEMONIC_JZ, ZYDIS_MNEMONIC_JNZ, ZYDIS_MNEMONIC_JBE, ZYDIS_MNEMONIC_JNBE,
      ZYDIS_MNEMONIC_JS, ZYDIS_MNEMONIC_JNS, ZYDIS_MNEMONIC_JP,  ZYDIS_MNEMONIC_JNP,
      ZYDIS_MNEMONIC_JL, ZYDIS_MNEMONIC_JNL, ZYDIS_MNEMONIC_JLE, ZYDIS_MNEMONIC_JNLE};
  static const ZydisMnemonic setcc[16] = {
      ZYDIS_MNEMONIC_SETO, ZYDIS_MNEMONIC_SETNO, ZYDIS_MNEMONIC_SETB,  ZYDIS_MNEMONIC_SETNB,
      ZYDIS_MNEMONIC_SETZ, ZYDIS_MNEMONIC_SETNZ, ZYDIS_MNEMONIC_SETBE, ZYDIS_MNEMONIC_SETNBE,
      ZYDIS_MNEMONIC_SETS, ZYDIS_MNEMONIC_SETNS, ZYDIS_MNEMONIC_SETP,  ZYDIS_MNEMONIC_SETNP,
      ZYDIS_MNEMONIC_SETL, ZYDIS_MNEMONIC_SETNL, ZYDIS_MNEMONIC_SETLE, ZYDIS_MNEMONIC_SETNLE};
  static const ZydisMnemonic cmovcc[16] = {
      ZYDIS_MNEMONIC_CMOVO, ZYDIS_MNEMONIC_CMOVNO, ZYDIS_MNEMONIC_CMOVB,  ZYDIS_MNEMONIC_CMOVNB,
      ZYDIS_MNEMONIC_CMOVZ, ZYDIS_MNEMONIC_CMOVNZ, ZYDIS_MNEMONIC_CMOVBE, ZYDIS_MNEMONIC_CMOVNBE,
      ZYDIS_MNEMONIC_CMOVS, ZYDIS_MNEMONIC_CMOVNS, ZYDIS_MNEMONIC_CMOVP,  ZYDIS_MNEMONIC_CMOVNP,
      ZYDIS_MNEMONIC_CMOVL, ZYDIS_MNEMONIC_CMOVNL, ZYDIS_MNEMONIC_CMOVLE, ZYDIS_MNEMONIC_CMOVNLE};
  for (int i = 0; i < 16; i++) {
    if (m == jcc[i]) return i;
    if (m == setcc[i]) return 16 + i;
    if (m == cmovcc[i]) return 32 + i;
  }
  return -1;
}

/* An instruction that writes vector, mask, MMX or x87 registers only (besides the flags and
 * the FPU's control and status): none of the registers the run ahead follows, nor rip. A
 * loop's `movq %rdx,%xmm0; punpcklqdq %xmm0,%xmm0` before its SIMD stores ended the run
 * ahead, and the sample went to single steps (~12 us each in a VM). */
static int vector_only(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  if (in->meta.branch_type != ZYDIS_BRANCH_TYPE_NONE) return 0;
  int vec = 0;
  for (int i = 0; i < in->operand_count; i++) {
    const ZydisDecodedOperand *o = &ops[i];
    if (o->type == ZYDIS_OPERAND_TYPE_MEMORY) return 0;
    if (o->type != ZYDIS_OPERAND_TYPE_REGISTER || !(o->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
      continue;
    ZydisRegister r = o->reg.value;
    if ((r >= ZYDIS_REGISTER_XMM0 && r <= ZYDIS_REGISTER_XMM31) ||
        (r >= ZYDIS_REGISTER_YMM0 && r <= ZYDIS_REGISTER_YMM31) ||
        (r >= ZYDIS_REGISTER_ZMM0 && r <= ZYDIS_REGISTER_ZMM31) ||
        (r >= ZYDIS_REGISTER_K0 && r <= ZYDIS_REGISTER_K7) ||
        (r >= ZYDIS_REGISTER_MM0 && r <= ZYDIS_REGISTER_MM7) ||
        (r >= ZYDIS_REGISTER_ST0 && r <= ZYDIS_REGISTER_ST7)) {
      vec = 1;
      continue;
    }
    if (r == ZYDIS_REGISTER_FLAGS || r == ZYDIS_REGISTER_EFLAGS || r == ZYDIS_REGISTER_RFLAGS ||
        r == ZYDIS_REGISTER_MXCSR || r == ZYDIS_REGISTER_X87CONTROL ||
        r == ZYDIS_REGISTER_X87STATUS || r == ZYDIS_REGISTER_X87TAG)
      continue;
    return 0;
  }
  return vec;
}

/* Sets CF and ZF as given; the `undefined` flags become unknown (what lzcnt, tzcnt, bsf,
 * bsr and imul leave undefined). */
static void ahead_cz(struct ahead *s, int cf, int zf, uint64_t undefined) {
  uint64_t f = (uint64_t)s->g[REG_EFL] & ~(EF_CF | EF_ZF);
  s->g[REG_EFL] = (greg_t)(f | (cf ? EF_CF : 0) | (zf ? EF_ZF : 0));
  s->known = (s->known | EF_CF | EF_ZF) & ~undefined;
}

/* Sets the flags `f` (set when on, else clear), known from here on. */
static void ahead_flag(struct ahead *s, uint64_t f, int on) {
  s->g[REG_EFL] = (greg_t)(((uint64_t)s->g[REG_EFL] & ~f) | (on ? f : 0));
  s->known |= f;
}

/* Bit manipulation of hashing and compression loops (zstd's run ahead stopped at lzcnt,
 * shrx and shlx in 189 of 191 samples): lzcnt, tzcnt, popcnt, bsf, bsr, shlx, shrx, sarx,
 * rorx, andn, bswap, imul of two or three operands; register operands only (a memory one
 * is an access, the answer before this is asked). 0 when interpreted. */
static int ahead_bits(struct ahead *s, const ZydisDecodedInstruction *in,
                      const ZydisDecodedOperand *ops) {
  int n = in->operand_count_visible;
  uint32_t bits = n ? ops[0].size : 0;
  if (bits != 16 && bits != 32 && bits != 64) return -1;
  uint64_t a = 0, b = 0, c = 0, mask = size_mask(bits), r;
  ZydisMnemonic m = in->mnemonic;
  if (m == ZYDIS_MNEMONIC_BSWAP) {
    if (n != 1 || bits < 32 || ahead_reg(s, &ops[0], &a) != 0) return -1;
    r = bits == 64 ? __builtin_bswap64(a) : __builtin_bswap32((uint32_t)a);
    return ahead_write(s, &ops[0], r);
  }
  if (n < 2 || ahead_read(s, &ops[1], bits, &a) != 0) return -1;
  if (n == 3 && ahead_read(s, &ops[2], bits, &b) != 0) return -1; /* an imm8 sign-extended */
  switch (m) {
    case ZYDIS_MNEMONIC_LZCNT:
    case ZYDIS_MNEMONIC_TZCNT:
      if (n != 2) return -1;
      r = a == 0                      ? bits
          : m == ZYDIS_MNEMONIC_LZCNT ? (uint64_t)(__builtin_clzll(a) - (64 - (int)bits))
                                      : (uint64_t)__builtin_ctzll(a);
      ahead_cz(s, a == 0, r == 0, EF_OF | EF_SF | EF_PF);
      break;
    case ZYDIS_MNEMONIC_BSF:
    case ZYDIS_MNEMONIC_BSR:
      if (n != 2 || a == 0) return -1; /* the destination is undefined */
      r = m == ZYDIS_MNEMONIC_BSF ? (uint64_t)__builtin_ctzll(a)
                                  : (uint64_t)(63 - __builtin_clzll(a));
      ahead_cz(s, 0, 0, EF_CF | EF_OF | EF_SF | EF_PF);
      break;
    case ZYDIS_MNEMONIC_POPCNT:
      if (n != 2) return -1;
      r = (uint64_t)__builtin_popcountll(a);
      ahead_cz(s, 0, a == 0, 0);
      ahead_flag(s, EF_OF | EF_SF | EF_PF, 0);
      break;
    case ZYDIS_MNEMONIC_SHLX:
    case ZYDIS_MNEMONIC_SHRX:
    case ZYDIS_MNEMONIC_SARX:
      if (n != 3) return -1;
      c = b & (bits == 64 ? 63 : 31);
      if (m == ZYDIS_MNEMONIC_SHLX)
        r = a << c;
      else if (m == ZYDIS_MNEMONIC_SHRX)
        r = a >> c;
      else
        r = (uint64_t)(sext(a, bits) >> c);
      break;
    case ZYDIS_MNEMONIC_RORX:
      if (n != 3) return -1;
      c = b & (bits == 64 ? 63 : 31);
      r = c ? (a >> c) | (a << (bits - c)) : a;
      break;
    case ZYDIS_MNEMONIC_ANDN:
      if (n != 3) return -1;
      r = ~a & b & mask;
      ahead_flags(s, r, bits, 0, 0);
      s->known &= ~EF_PF;
      break;
    case ZYDIS_MNEMONIC_IMUL: {
      /* imul r, r/m: r * r/m; imul r, r/m, imm: r/m * imm (a is ops[1], b ops[2]) */
      uint64_t x = a, y = b;
      if (n == 2 && ahead_reg(s, &ops[0], &x) == 0)
        y = a;
      else if (n != 3)
        return -1;
      int64_t sx = sext(x, bits), sy = sext(y, bits);
      __int128 full = (__int128)sx * sy;
      r = (uint64_t)full & mask;
      int64_t back = sext(r, bits);
      int of = (__int128)back != full;
      ahead_cz(s, of, 0, EF_SF | EF_ZF | EF_PF);
      ahead_flag(s, EF_OF, of);
      break;
    }
    default:
      return -1;
  }
  return ahead_write(s, &ops[0], r & mask);
}

/* Bits of a register slot written as the CPU does: 64 all, 32 zero-extended, 16 and 8 the
 * low bits with the others kept. */
static void ahead_set(struct ahead *s, int slot, uint32_t bits, uint64_t v) {
  uint64_t keep = bits >= 32 ? 0 : (uint64_t)s->g[slot] & ~size_mask(bits);
  s->g[slot] = (greg_t)(keep | (v & size_mask(bits)));
}

/* The one-operand multiply and divide (rdx:rax, or ax for 8 bits), sign extensions into rdx
 * (cwd, cdq, cqo) and rax (cbw, cwde), exchanges of two registers, adc and sbb (with the carry
 * known), bt, bts, btr, btc and shld, shrd on registers, fences and clc, stc, cmc: what time
 * reading (the vDSO's clock_gettime: `rdtscp; shl; or; btr`), hashing, random numbers and
 * index arithmetic put between two accesses, where the run ahead stopped and the sample took
 * single steps (~12 us each in a VM). A divide that would fault is not interpreted. 0 when
 * interpreted. */
static int ahead_wide(struct ahead *s, const ZydisDecodedInstruction *in,
                      const ZydisDecodedOperand *ops) {
  int n = in->operand_count_visible;
  ZydisMnemonic m = in->mnemonic;
  switch (m) {
    case ZYDIS_MNEMONIC_LFENCE:
    case ZYDIS_MNEMONIC_MFENCE:
    case ZYDIS_MNEMONIC_SFENCE:
      return 0;
    case ZYDIS_MNEMONIC_CLC:
    case ZYDIS_MNEMONIC_STC:
      ahead_flag(s, EF_CF, m == ZYDIS_MNEMONIC_STC);
      return 0;
    case ZYDIS_MNEMONIC_CMC:
      s->g[REG_EFL] ^= EF_CF; /* an unknown carry stays unknown */
      return 0;
    default:
      break;
  }
  uint32_t bits = n ? ops[0].size : in->operand_width;
  if (bits != 8 && bits != 16 && bits != 32 && bits != 64) return -1;
  uint64_t mask = size_mask(bits), sign = 1ull << (bits - 1), a = 0, b = 0, c = 0, r;
  uint64_t ax = (uint64_t)s->g[REG_RAX], dx = (uint64_t)s->g[REG_RDX];
  switch (m) {
    case ZYDIS_MNEMONIC_CWD:
    case ZYDIS_MNEMONIC_CDQ:
    case ZYDIS_MNEMONIC_CQO:
      ahead_set(s, REG_RDX, bits, sext(ax, bits) < 0 ? ~0ull : 0);
      return 0;
    case ZYDIS_MNEMONIC_CBW:
    case ZYDIS_MNEMONIC_CWDE:
      ahead_set(s, REG_RAX, bits, (uint64_t)sext(ax, bits / 2));
      return 0;
    case ZYDIS_MNEMONIC_XCHG:
      if (n != 2 || ahead_reg(s, &ops[0], &a) != 0 || ahead_reg(s, &ops[1], &b) != 0) return -1;
      if (ahead_write(s, &ops[0], b) != 0) return -1;
      return ahead_write(s, &ops[1], a);
    case ZYDIS_MNEMONIC_MUL:
    case ZYDIS_MNEMONIC_IMUL: {
      if (n != 1 || ahead_reg(s, &ops[0], &b) != 0) return -1;
      int of;
      if (m == ZYDIS_MNEMONIC_MUL) {
        unsigned __int128 p = (unsigned __int128)(ax & mask) * b;
        r = (uint64_t)p & mask;
        c = bits == 64 ? (uint64_t)(p >> 64) : (uint64_t)(p >> bits) & mask;
        of = c != 0;
      } else {
        __int128 p = (__int128)sext(ax, bits) * sext(b, bits);
        r = (uint64_t)p & mask;
        c = bits == 64 ? (uint64_t)((unsigned __int128)p >> 64) : (uint64_t)(p >> bits) & mask;
        of = (__int128)sext(r, bits) != p;
      }
      if (bits == 8)
        ahead_set(s, REG_RAX, 16, r | c << 8); /* ax = al * r/m8 */
      else {
        ahead_set(s, REG_RAX, bits, r);
        ahead_set(s, REG_RDX, bits, c);
      }
      ahead_cz(s, of, 0, EF_SF | EF_ZF | EF_PF);
      ahead_flag(s, EF_OF, of);
      return 0;
    }
    case ZYDIS_MNEMONIC_DIV:
    case ZYDIS_MNEMONIC_IDIV: {
      if (n != 1 || ahead_reg(s, &ops[0], &b) != 0 || (b & mask) == 0) return -1;
      /* The dividend: ax for 8 bits, else rdx:rax of the operand's size. */
      unsigned __int128 num =
          bits == 8 ? (unsigned __int128)(ax & 0xffff)
                    : ((unsigned __int128)(dx & mask) << bits) | (unsigned __int128)(ax & mask);
      uint64_t q, rem;
      if (m == ZYDIS_MNEMONIC_DIV) {
        unsigned __int128 qq = num / (b & mask);
        if (qq > mask) return -1; /* #DE */
        q = (uint64_t)qq;
        rem = (uint64_t)(num % (b & mask));
      } else {
        uint32_t nbits = bits == 8 ? 16 : 2 * bits;
        __int128 sn =
            nbits == 128 ? (__int128)num : (__int128)(num << (128 - nbits)) >> (128 - nbits);
        __int128 d = sext(b, bits), qq = sn / d;
        if (qq > (__int128)(int64_t)(sign - 1) || qq < -(__int128)sign) return -1; /* #DE */
        q = (uint64_t)qq & mask;
        rem = (uint64_t)(sn % d) & mask;
      }
      if (bits == 8)
        ahead_set(s, REG_RAX, 16, q | rem << 8); /* al = quotient, ah = remainder */
      else {
        ahead_set(s, REG_RAX, bits, q);
        ahead_set(s, REG_RDX, bits, rem);
      }
      s->known &= ~EF_ARITH; /* all undefined */
      return 0;
    }
    case ZYDIS_MNEMONIC_ADC:
    case ZYDIS_MNEMONIC_SBB: {
      if (n != 2 || !(s->known & EF_CF) || ahead_reg(s, &ops[0], &a) != 0 ||
          ahead_read(s, &ops[1], bits, &b) != 0)
        return -1;
      uint64_t cf = (uint64_t)s->g[REG_EFL] & EF_CF ? 1 : 0;
      unsigned __int128 wa = a & mask, wb = b & mask;
      if (m == ZYDIS_MNEMONIC_ADC) {
        r = (uint64_t)(wa + wb + cf) & mask;
        ahead_flags(s, r, bits, (wa + wb + cf) > mask, (a ^ r) & (b ^ r) & sign);
      } else {
        r = (uint64_t)(wa - wb - cf) & mask;
        ahead_flags(s, r, bits, wa < wb + cf, (a ^ b) & (a ^ r) & sign);
      }
      return ahead_write(s, &ops[0], r);
    }
    case ZYDIS_MNEMONIC_BT:
    case ZYDIS_MNEMONIC_BTS:
    case ZYDIS_MNEMONIC_BTR:
    case ZYDIS_MNEMONIC_BTC: {
      if (n != 2 || bits < 16 || ahead_reg(s, &ops[0], &a) != 0 ||
          ahead_read(s, &ops[1], bits, &b) != 0)
        return -1;
      uint64_t bit = 1ull << (b & (bits - 1));
      ahead_cz(s, (a & bit) != 0, 0, EF_OF | EF_SF | EF_PF | EF_ZF);
      if (m == ZYDIS_MNEMONIC_BT) return 0;
      r = m == ZYDIS_MNEMONIC_BTS ? a | bit : m == ZYDIS_MNEMONIC_BTR ? a & ~bit : a ^ bit;
      return ahead_write(s, &ops[0], r);
    }
    case ZYDIS_MNEMONIC_SHLD:
    case ZYDIS_MNEMONIC_SHRD: {
      if (n != 3 || bits < 16 || ahead_reg(s, &ops[0], &a) != 0 || ahead_reg(s, &ops[1], &b) != 0 ||
          ahead_read(s, &ops[2], 8, &c) != 0)
        return -1;
      c &= bits == 64 ? 63 : 31;
      if (c == 0) return 0;    /* no change, flags kept */
      if (c > bits) return -1; /* a 16-bit one past 16: undefined */
      if (c == bits)           /* (16 bits by 16: the source) */
        r = b;
      else
        r = m == ZYDIS_MNEMONIC_SHLD ? a << c | b >> (bits - c) : a >> c | b << (bits - c);
      ahead_flags(s, r, bits, 0, 0);
      s->known &= ~(EF_CF | EF_OF); /* the carry shifted out and the overflow: not followed */
      return ahead_write(s, &ops[0], r & mask);
    }
    default:
      return -1;
  }
}

/* One instruction without a memory access, interpreted: 0 done (s->g[REG_RIP] is the next
 * pc), -1 not interpreted. */
static int ahead_step(struct ahead *s, const ZydisDecodedInstruction *in,
                      const ZydisDecodedOperand *ops) {
  uint64_t pc = (uint64_t)s->g[REG_RIP], next = pc + in->length;
  int n = in->operand_count_visible;
  uint32_t bits = n ? ops[0].size : 0;
  uint64_t a = 0, b = 0, r, sign = bits ? 1ull << (bits - 1) : 0;
  ZydisMnemonic m = in->mnemonic;
  s->g[REG_RIP] = (greg_t)next;
  if (is_prefetch(m)) return 0;
  switch (m) {
    case ZYDIS_MNEMONIC_NOP:
    case ZYDIS_MNEMONIC_ENDBR64:
    case ZYDIS_MNEMONIC_PAUSE: /* a spin loop's */
      return 0;
    case ZYDIS_MNEMONIC_JMP:
      /* A register's: a switch's jump table, computed goto (xz's run ahead stopped there in
       * 322 of 359 samples of six programs); its value is followed like any other. */
      if (n == 1 && ops[0].type == ZYDIS_OPERAND_TYPE_REGISTER && bits == 64) {
        if (ahead_reg(s, &ops[0], &a) != 0) return -1;
        s->g[REG_RIP] = (greg_t)a;
        return 0;
      }
      if (n != 1 || ops[0].type != ZYDIS_OPERAND_TYPE_IMMEDIATE || !ops[0].imm.is_relative)
        return -1;
      s->g[REG_RIP] = (greg_t)(next + (uint64_t)ops[0].imm.value.s);
      return 0;
    case ZYDIS_MNEMONIC_MOV:
      if (n != 2 || ahead_read(s, &ops[1], bits, &b) != 0) return -1;
      return ahead_write(s, &ops[0], b);
    case ZYDIS_MNEMONIC_MOVZX:
    case ZYDIS_MNEMONIC_MOVSX:
    case ZYDIS_MNEMONIC_MOVSXD: {
      if (n != 2 || ahead_read(s, &ops[1], ops[1].size, &b) != 0) return -1;
      uint32_t sb = ops[1].size;
      if (m != ZYDIS_MNEMONIC_MOVZX) b = (uint64_t)sext(b, sb);
      return ahead_write(s, &ops[0], b & size_mask(bits));
    }
    case ZYDIS_MNEMONIC_LEA: {
      const ZydisDecodedOperand *o = &ops[1];
      if (n != 2 || o->type != ZYDIS_OPERAND_TYPE_MEMORY || o->mem.segment == ZYDIS_REGISTER_FS ||
          o->mem.segment == ZYDIS_REGISTER_GS)
        return -1;
      uint64_t ea = (uint64_t)o->mem.disp.value, v;
      if (o->mem.base == ZYDIS_REGISTER_RIP)
        ea += next;
      else if (o->mem.base != ZYDIS_REGISTER_NONE) {
        if (reg_value(o->mem.base, s->g, &v) != 0) return -1;
        ea += v;
      }
      if (o->mem.index != ZYDIS_REGISTER_NONE) {
        if (reg_value(o->mem.index, s->g, &v) != 0) return -1;
        ea += v * (o->mem.scale ? o->mem.scale : 1);
      }
      if (in->address_width == 32) ea &= 0xffffffffu;
      return ahead_write(s, &ops[0], ea & size_mask(bits));
    }
    case ZYDIS_MNEMONIC_ADD:
    case ZYDIS_MNEMONIC_SUB:
    case ZYDIS_MNEMONIC_CMP:
    case ZYDIS_MNEMONIC_AND:
    case ZYDIS_MNEMONIC_OR:
    case ZYDIS_MNEMONIC_XOR:
    case ZYDIS_MNEMONIC_TEST:
      if (n != 2 || ahead_read(s, &ops[0], bits, &a) != 0 || ahead_read(s, &ops[1], bits, &b) != 0)
        return -1;
      if (m == ZYDIS_MNEMONIC_ADD) {
        r = (a + b) & size_mask(bits);
        ahead_flags(s, r, bits, r < a, (a ^ r) & (b ^ r) & sign);
      } else if (m == ZYDIS_MNEMONIC_SUB || m == ZYDIS_MNEMONIC_CMP) {
        r = (a - b) & size_mask(bits);
        ahead_flags(s, r, bits, a < b, (a ^ b) & (a ^ r) & sign);
      } else {
        r = m == ZYDIS_MNEMONIC_OR ? a | b : m == ZYDIS_MNEMONIC_XOR ? a ^ b : a & b;
        ahead_flags(s, r, bits, 0, 0);
      }
      return m == ZYDIS_MNEMONIC_CMP || m == ZYDIS_MNEMONIC_TEST ? 0 : ahead_write(s, &ops[0], r);
    case ZYDIS_MNEMONIC_INC:
    case ZYDIS_MNEMONIC_DEC: {
      if (n != 1 || ahead_reg(s, &ops[0], &a) != 0) return -1;
      uint64_t cf = (uint64_t)s->g[REG_EFL] & EF_CF, cf_known = s->known & EF_CF; /* kept */
      r = (m == ZYDIS_MNEMONIC_INC ? a + 1 : a - 1) & size_mask(bits);
      ahead_flags(s, r, bits, cf, m == ZYDIS_MNEMONIC_INC ? r == sign : a == sign);
      s->known = (s->known & ~EF_CF) | cf_known;
      return ahead_write(s, &ops[0], r);
    }
    case ZYDIS_MNEMONIC_NEG:
      if (n != 1 || ahead_reg(s, &ops[0], &a) != 0) return -1;
      r = (0 - a) & size_mask(bits);
      ahead_flags(s, r, bits, a != 0, a == sign);
      return ahead_write(s, &ops[0], r);
    case ZYDIS_MNEMONIC_NOT:
      if (n != 1 || ahead_reg(s, &ops[0], &a) != 0) return -1;
      return ahead_write(s, &ops[0], ~a & size_mask(bits));
    case ZYDIS_MNEMONIC_SHL:
    case ZYDIS_MNEMONIC_SHR:
    case ZYDIS_MNEMONIC_SAR: {
      if (n != 2 || ahead_reg(s, &ops[0], &a) != 0 || ahead_read(s, &ops[1], 8, &b) != 0) return -1;
      b &= bits == 64 ? 63 : 31;
      if (b == 0) return 0; /* no change, flags kept */
      if (m == ZYDIS_MNEMONIC_SHL)
        r = b >= bits ? 0 : a << b;
      else if (m == ZYDIS_MNEMONIC_SHR)
        r = b >= bits ? 0 : a >> b;
      else {
        r = (uint64_t)(sext(a, bits) >> (b >= 64 ? 63 : b));
      }
      ahead_flags(s, r, bits, 0, 0);
      s->known &= ~(EF_CF | EF_OF); /* the carry shifted out and the overflow: not followed */
      return ahead_write(s, &ops[0], r & size_mask(bits));
    }
    case ZYDIS_MNEMONIC_ROL:
    case ZYDIS_MNEMONIC_ROR: {
      /* Only CF and OF change (not followed); SF, ZF, PF stay. */
      if (n != 2 || ahead_reg(s, &ops[0], &a) != 0 || ahead_read(s, &ops[1], 8, &b) != 0) return -1;
      b &= bits == 64 ? 63 : 31;
      if (!b) return 0;             /* no change, flags kept */
      s->known &= ~(EF_CF | EF_OF); /* (a 16-bit rotate by 16 sets CF too) */
      b %= bits;
      if (!b) return 0;
      uint64_t left = m == ZYDIS_MNEMONIC_ROL ? b : bits - b;
      r = ((a << left) | (a >> (bits - left))) & size_mask(bits);
      return ahead_write(s, &ops[0], r);
    }
    case ZYDIS_MNEMONIC_CDQE:
      s->g[REG_RAX] = (greg_t)(int64_t)(int32_t)s->g[REG_RAX];
      return 0;
    default:
      if (ahead_bits(s, in, ops) == 0 || ahead_wide(s, in, ops) == 0) return 0;
      break;
  }
  if (vector_only(in, ops)) { /* passed over; the flags it sets (ucomisd, ptest) are unknown */
    const ZydisAccessedFlags *f = in->cpu_flags;
    s->known &= f ? ~(uint64_t)(f->modified | f->set_0 | f->set_1 | f->undefined) : ~EF_ARITH;
    return 0;
  }
  int cc = ahead_cc(m);
  if (cc < 0 || (s->known & cond_reads[(cc & 15) >> 1]) != cond_reads[(cc & 15) >> 1]) return -1;
  int yes = ahead_cond((uint64_t)s->g[REG_EFL], cc & 15);
  if (cc < 16) {
    if (n != 1 || ops[0].type != ZYDIS_OPERAND_TYPE_IMMEDIATE || !ops[0].imm.is_relative) return -1;
    if (yes) s->g[REG_RIP] = (greg_t)(next + (uint64_t)ops[0].imm.value.s);
    return 0;
  }
  if (cc < 32) return n == 1 ? ahead_write(s, &ops[0], (uint64_t)yes) : -1;
  if (n != 2 || ahead_reg(s, &ops[1], &b) != 0 || ahead_reg(s, &ops[0], &a) != 0) return -1;
  return ahead_write(s, &ops[0], yes ? b : a); /* a 32-bit cmov clears the upper half */
}

static uint32_t written_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);
static uint32_t addr_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops);

/* A plain load into a general-purpose register (mov, movzx, movsx, movsxd from memory
 * other than fs/gs), interpreted: the value is read from the process's memory with
 * process_vm_readv (an address the interpretation got wrong fails cleanly), and rip moves
 * past it. 0 when done. *pid: the process's, asked for at the first load (0: not yet). */
#define AHEAD_LOADS 4 /* loads interpreted per run ahead: a system call each */
static int ahead_load(struct ahead *s, const ZydisDecodedInstruction *in,
                      const ZydisDecodedOperand *ops, const struct locus_comm_access *m,
                      long *pid) {
  ZydisMnemonic mn = in->mnemonic;
  if ((mn != ZYDIS_MNEMONIC_MOV && mn != ZYDIS_MNEMONIC_MOVZX && mn != ZYDIS_MNEMONIC_MOVSX &&
       mn != ZYDIS_MNEMONIC_MOVSXD) ||
      in->operand_count_visible != 2 || ops[0].type != ZYDIS_OPERAND_TYPE_REGISTER ||
      ops[1].type != ZYDIS_OPERAND_TYPE_MEMORY || ops[1].mem.segment == ZYDIS_REGISTER_FS ||
      ops[1].mem.segment == ZYDIS_REGISTER_GS || m->len == 0 || m->len > 8 ||
      (m->flags & LOCUS_AC_STORE))
    return -1;
  uint64_t v = 0;
  if (!*pid) *pid = syscall(SYS_getpid);
  if (copy_self(*pid, m->addr, &v, m->len) != m->len) return -1;
  uint32_t bits = 8u * m->len;
  if (mn == ZYDIS_MNEMONIC_MOVSX || mn == ZYDIS_MNEMONIC_MOVSXD) v = (uint64_t)sext(v, bits);
  if (ahead_write(s, &ops[0], v) != 0) return -1;
  s->g[REG_RIP] += in->length;
  return 0;
}

/* The next access from pc (code c, registers g), interpreted as above: DEC_OK with *a,
 * DEC_NOMEM when the run ahead ended without one (step instead).
 * `target`: 0, or the sampled load that overwrote its own address register (sampled_access's
 * clobbered): the sample's time went to that load, not to the next access, which in a loop
 * is mostly the reload of its pointer (a spin on `*p`: `mov p(%rip),%rax; mov (%rax),%rax`
 * read as accesses to the pointer variable, and the flag's line was never seen). The run
 * ahead then goes on past plain loads (interpreted, ahead_load) until the target runs again,
 * whose access is the answer: the same load one iteration on (the same word for a spin, the
 * next node for a list walk). When the target does not run again, the first access made
 * through a register one of those loads set is the answer: the stalled load was the spin's
 * last, and the store that follows it through the reloaded pointer (the token passed on) is
 * on the line it waited for. Otherwise the first access is, as without a target. */
/* The value of the frame bytes m accesses, for off_frame's run: what the run stored there,
 * else memory's (process_vm_readv, counted in *loads); -1 when a store of the run covers
 * them in part, or past AHEAD_LOADS reads. */
static int frame_value(const struct ahead *s, const struct locus_comm_access *m, uint64_t *v,
                       long *pid, int *loads) {
  for (int i = 0; i < s->nfs; i++) {
    if (m->addr >= s->fs[i].addr + s->fs[i].len || s->fs[i].addr >= m->addr + m->len) continue;
    if (s->fs[i].addr != m->addr || s->fs[i].len < m->len) return -1;
    *v = s->fs[i].v & size_mask(8 * m->len);
    return 0;
  }
  if (!*pid) *pid = syscall(SYS_getpid);
  return (*loads)++ < AHEAD_LOADS && copy_self(*pid, m->addr, v, m->len) == m->len ? 0 : -1;
}

/* Keeps what the run stored to the frame bytes m accesses; -1 when it overlaps another of its
 * stores in part, or there are FRAME_STORES already. */
static int frame_store(struct ahead *s, const struct locus_comm_access *m, uint64_t v) {
  for (int i = 0; i < s->nfs; i++) {
    if (m->addr >= s->fs[i].addr + s->fs[i].len || s->fs[i].addr >= m->addr + m->len) continue;
    if (s->fs[i].addr != m->addr || s->fs[i].len != m->len) return -1;
    s->fs[i].v = v;
    return 0;
  }
  if (s->nfs >= FRAME_STORES) return -1;
  s->fs[s->nfs].addr = m->addr;
  s->fs[s->nfs].len = m->len;
  s->fs[s->nfs++].v = v;
  return 0;
}

static int access_ahead(uint64_t pc, const struct code *c, const greg_t *g,
                        struct locus_comm_access *a, greg_t *regs_at, uint64_t target, int frames) {
  struct ahead s;
  memcpy(s.g, g, sizeof s.g);
  s.mem_ok = 0;
  s.nfs = 0;
  s.g[REG_RIP] = (greg_t)pc;
  s.known = EF_ARITH; /* the interrupted context's own */
  struct code here = *c;
  if (here.p == c->buf) here.p = here.buf; /* a copy keeps pointing at its own bytes */
  struct locus_comm_access first;
  greg_t first_regs[NGREG];
  int found = 0, loads = 0;
  long pid = 0;
  uint32_t reloaded = 0; /* registers the interpreted loads set */
  for (int k = 0; k < AHEAD_MAX; k++) {
    uint64_t at = (uint64_t)s.g[REG_RIP];
    if (k > 0) code_at(at, &here);
    if (!here.avail) break;
    ZydisDecodedInstruction in;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, here.p, here.avail, &in, ops))) break;
    if (in.meta.category == ZYDIS_CATEGORY_SYSCALL || in.meta.category == ZYDIS_CATEGORY_INTERRUPT)
      break;
    /* The first instruction with an access (explicit or hidden: push, call, string
     * instructions) is the answer, with the registers before it runs (at pc itself too:
     * after a skid-corrected instruction without an access, pc's is the next one). */
    struct locus_comm_access m;
    memset(&m, 0, sizeof m);
    int rc = access_decoded(&in, ops, at, s.g, 0, &m);
    if (frames && rc == DEC_OK && quiet(c->m, &in, ops, &m)) {
      /* (off_frame's run: an access to the frame is interpreted, with the value read, or
       * the one the run stored there; what it stores is kept aside, never written; a line
       * another thread writes, or what is not interpreted, ends it without an answer) */
      uint64_t v = 0;
      if (m.len > 8 || locus_comm_line_foreign(m.addr) || frame_value(&s, &m, &v, &pid, &loads))
        return DEC_NOMEM;
      s.mem = v;
      s.mem_ok = 1;
      s.mem_written = 0;
      int bad = ahead_step(&s, &in, ops);
      s.mem_ok = 0;
      if (bad ||
          (s.mem_written ? frame_store(&s, &m, s.mem_out) != 0 : (m.flags & LOCUS_AC_STORE) != 0))
        return DEC_NOMEM;
      continue;
    }
    if (rc == DEC_OK && (at == target || !target)) {
      *a = m;
      if (regs_at) memcpy(regs_at, s.g, sizeof s.g);
      return DEC_OK;
    }
    if (rc != DEC_NOMEM && rc != DEC_OK) break;
    if (rc == DEC_OK) {
      /* The first access, and the first made through a register a load set since. */
      int through = found < 2 && (addr_regs(&in, ops) & reloaded) && !(m.flags & LOCUS_AC_STACK);
      if (!found || through) {
        first = m;
        memcpy(first_regs, s.g, sizeof s.g);
        found = through ? 2 : 1;
      }
      if (loads++ >= AHEAD_LOADS || ahead_load(&s, &in, ops, &m, &pid) != 0) break;
      reloaded |= written_regs(&in, ops);
      continue;
    }
    reloaded &= ~written_regs(&in, ops);
    if (ahead_step(&s, &in, ops) != 0) break;
  }
  if (!found) return DEC_NOMEM;
  *a = first;
  if (regs_at) memcpy(regs_at, first_regs, sizeof first_regs);
  return DEC_OK;
}

/* A sample still on the thread's own frame (a skid-corrected one past_frame found nothing
 * before, or pc's own access: a loop's head, a merge point, where gcc -O0 compares its
 * counter in the frame) is the next access off the frame, run ahead from pc past reads of
 * the frame, interpreted with the values read (a store to the frame, or a line another
 * thread writes, ends the run and the frame access stays the sample). 1 when *a was
 * replaced, its registers in regs_at. In a loaded object's code only, as past_frame. */
static int off_frame(uint64_t pc, const struct code *c, const greg_t *g,
                     struct locus_comm_access *a, greg_t *regs_at) {
  struct locus_comm_access t;
  if (!ahead_on || !c->m || !maybe_quiet(c->m, a) ||
      access_ahead(pc, c, g, &t, regs_at, 0, 1) != DEC_OK)
    return 0;
  *a = t;
  a->flags |= LOCUS_AC_STEP;
  return 1;
}

/* The sample's access at pc (take_sample's, before any single step): sampled_access, the
 * run ahead where that found none, then off_frame. *regs: the registers at the access
 * (ahead_regs, or the context's); DEC_NOMEM: none found (the caller single-steps). */
static int sample_access(uint64_t pc, const struct code *c, const ucontext_t *uc,
                         struct locus_comm_access *a, greg_t *ahead_regs, const greg_t **regs) {
  uint64_t clobbered = 0;
  const greg_t *g = uc->uc_mcontext.gregs;
  int rc = sampled_access(pc, c, uc, a, &clobbered);
  if (rc == DEC_NOMEM && ahead_on) {
    rc = access_ahead(pc, c, g, a, ahead_regs, clobbered, 0);
    if (rc == DEC_OK) a->flags |= LOCUS_AC_STEP;
    *regs = ahead_regs;
  }
  /* (the run ahead's answer too: pc and the instruction before it had no access, the next
   * one is on the frame: -O0 reloads its locals after the arithmetic) */
  if (rc == DEC_OK && off_frame(pc, c, g, a, ahead_regs)) *regs = ahead_regs;
  return rc;
}

/* ---- split read-modify-writes ----
 * `x++` on a volatile or at -O0, `p->n = p->n * 2 + k`: a load, some arithmetic, and a
 * store to the same bytes. A timer lands where the time goes, on the load (its data comes
 * from the other core, or from the store before it), and next to never on the store, which
 * retires at once into the store buffer: on a 2023 Xeon all 208 samples of two threads
 * incrementing neighbouring volatile counters were the load, nothing was published, and no
 * false sharing was found. So a sampled load is followed, on a copy of the registers, for
 * RMW_MAX instructions of straight-line code (no branch but a direct jmp, no call): when
 * one stores to bytes the load read, with an address from registers whose values are
 * known, the sample is that store too (LOCUS_AC_STORE | LOCUS_AC_RMW), as `addq $1,(%rcx)`
 * is. A register loaded from memory meanwhile is read as the load will (ahead_load, up to
 * RMW_LOADS of them) from memory no store on the way writes: unoptimised code reloads the
 * store's pointer and index from the frame (`mov -0x28(%rbp),%rax; mov (%rax),%rax; mov
 * -0x1c(%rbp),%ecx; movsd %xmm0,(%rax,%rcx,8)`: the textbook OpenMP `sum[id] += x` at -O0,
 * 12 instructions after its load). A register computed from a value not known is unknown; an
 * address made of one ends the search. `executed`: the pc at which g holds the registers,
 * after the load ran (skid-corrected), the search starting there; 0: g holds them before
 * the load, the search starting after it. */
#define RMW_MAX 16
#define RMW_LOADS 3  /* loads read on the way: a system call each */
#define RMW_STORES 4 /* stores on the way whose bytes a later load must not read */

static uint32_t reg_bit(ZydisRegister r) {
  r = wide(r);
  return r >= ZYDIS_REGISTER_RAX && r <= ZYDIS_REGISTER_R15 ? 1u << (r - ZYDIS_REGISTER_RAX) : 0;
}

/* The registers an instruction writes (hidden operands too: rdx of mul, rsp of push); ~0
 * for one writing a register we do not track by bit. */
static uint32_t written_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  uint32_t w = 0;
  for (int i = 0; i < in->operand_count; i++)
    if (ops[i].type == ZYDIS_OPERAND_TYPE_REGISTER &&
        (ops[i].actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
      w |= reg_bit(ops[i].reg.value);
  return w;
}

static uint32_t read_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  uint32_t r = 0;
  for (int i = 0; i < in->operand_count; i++) {
    const ZydisDecodedOperand *o = &ops[i];
    if (o->type == ZYDIS_OPERAND_TYPE_REGISTER && (o->actions & ZYDIS_OPERAND_ACTION_MASK_READ))
      r |= reg_bit(o->reg.value);
    if (o->type == ZYDIS_OPERAND_TYPE_MEMORY) r |= reg_bit(o->mem.base) | reg_bit(o->mem.index);
  }
  return r;
}

/* The registers an instruction's memory operands address with (base, index). */
static uint32_t addr_regs(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  uint32_t r = 0;
  for (int i = 0; i < in->operand_count; i++)
    if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY)
      r |= reg_bit(ops[i].mem.base) | reg_bit(ops[i].mem.index);
  return r;
}

/* Any branch, call, return, iret: an operand that writes rip. */
static int writes_rip(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  if (in->meta.branch_type != ZYDIS_BRANCH_TYPE_NONE) return 1;
  for (int i = 0; i < in->operand_count; i++)
    if (ops[i].type == ZYDIS_OPERAND_TYPE_REGISTER && ops[i].reg.value == ZYDIS_REGISTER_RIP &&
        (ops[i].actions & ZYDIS_OPERAND_ACTION_MASK_WRITE))
      return 1;
  return 0;
}

/* Whether a memory operand (not an lea's address, ZYDIS_MEMOP_TYPE_AGEN) has one of `actions`. */
static int memory_with(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops,
                       unsigned actions) {
  for (int i = 0; i < in->operand_count; i++)
    if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY && ops[i].mem.type == ZYDIS_MEMOP_TYPE_MEM &&
        (ops[i].actions & actions))
      return 1;
  return 0;
}

/* Any memory operand written (a store, push, a read-modify-write, a string store). */
static int writes_memory(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  return memory_with(in, ops, ZYDIS_OPERAND_ACTION_MASK_WRITE);
}

static int has_memory(const ZydisDecodedInstruction *in, const ZydisDecodedOperand *ops) {
  return memory_with(in, ops, ZYDIS_OPERAND_ACTION_MASK_READ | ZYDIS_OPERAND_ACTION_MASK_WRITE);
}

static void split_rmw(const greg_t *g, uint64_t executed, struct locus_comm_access *a) {
  struct ahead s;
  memcpy(s.g, g, sizeof s.g);
  s.known = 0; /* no conditional branch is followed */
  uint32_t unknown = 0;
  ZydisDecodedInstruction in;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (decode_at(a->ip, &in, ops) != 0) return;
  if (!executed) unknown = written_regs(&in, ops);
  /* (g are the registers at pc = executed: past the instructions that ran after the load,
   * where a skid of more than one (recover_clobbered, past_frame) put it; they are not
   * interpreted again on them) */
  s.g[REG_RIP] = (greg_t)(executed ? executed : a->ip + in.length);
  struct {
    uint64_t lo, hi;
  } stored[RMW_STORES];
  int nstored = 0, loads = 0;
  long pid = 0;
  for (int k = 0; k < RMW_MAX; k++) {
    uint64_t at = (uint64_t)s.g[REG_RIP];
    if (decode_at(at, &in, ops) != 0) return;
    if (writes_rip(&in, ops) &&
        !(in.mnemonic == ZYDIS_MNEMONIC_JMP && ops[0].type == ZYDIS_OPERAND_TYPE_IMMEDIATE &&
          ops[0].imm.is_relative))
      return;
    if (in.meta.category == ZYDIS_CATEGORY_SYSCALL || in.meta.category == ZYDIS_CATEGORY_INTERRUPT)
      return;
    uint32_t reads = read_regs(&in, ops), writes = written_regs(&in, ops);
    if (has_memory(&in, ops)) {
      struct locus_comm_access b;
      memset(&b, 0, sizeof b);
      for (int i = 0; i < in.operand_count; i++) /* the address must be of known registers */
        if (ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY &&
            (unknown & (reg_bit(ops[i].mem.base) | reg_bit(ops[i].mem.index))))
          return;
      if (access_decoded(&in, ops, at, s.g, 0, &b) != DEC_OK) return;
      if ((b.flags & LOCUS_AC_STORE) && a->addr < b.addr + b.len && b.addr < a->addr + a->len) {
        a->flags |= LOCUS_AC_STORE | LOCUS_AC_RMW;
        return;
      }
      int fresh = loads < RMW_LOADS && !(b.flags & LOCUS_AC_STORE); /* no store wrote it yet */
      for (int j = 0; fresh && j < nstored; j++)
        fresh = !(b.addr < stored[j].hi && stored[j].lo < b.addr + b.len);
      if (b.flags & LOCUS_AC_STORE) {
        if (nstored < RMW_STORES)
          stored[nstored++] = (__typeof__(stored[0])){b.addr, b.addr + b.len};
        else
          loads = RMW_LOADS; /* too many to check a load against */
      }
      if (fresh && ahead_load(&s, &in, ops, &b, &pid) == 0) { /* (moves rip on) */
        loads++;
        if (ops[0].size >= 32) unknown &= ~writes; /* (a narrower one merges its old bits) */
        continue;
      }
      unknown |= writes; /* a load's value, or a push's rsp: not followed */
      s.known = 0;       /* nor the flags it may set */
      s.g[REG_RIP] = (greg_t)(at + in.length);
      continue;
    }
    if (reads & unknown) { /* computed from an unknown value */
      unknown |= writes;
      s.known = 0;
      s.g[REG_RIP] = (greg_t)(at + in.length);
      continue;
    }
    if (ahead_step(&s, &in, ops) != 0) return;
  }
}

/* ---- the program's call into a system library ----
 * A sample in the C library (a lock word's cmpxchg in pthread_mutex_lock, memcpy's stores)
 * names a line of glibc, whoever called it. Its caller in the program is found as Breakpad
 * does without unwind information: the nearest word above the stack pointer that points into
 * the program's own code right after a call instruction (decoded: the call ends there) and
 * is not a function start (a function placed after a call that never returns, `call abort`,
 * is not a return address). A function pointer or a stale return address kept in a library
 * frame can be taken for it: the report names it "called from", as the nearest call found.
 * Bounded: SCAN_BYTES of the thread's own stack (none when the stack pointer is elsewhere,
 * e.g. on a signal stack). Unwinding with the libraries' CFI (libunwind) would be exact, but
 * it is not async-signal-safe: it walks the loader's list under its lock.
 * Every stack word and code byte is copied with process_vm_readv, which fails cleanly where
 * a plain read faults: a stale return address into a library dlclose'd since the last
 * snapshot of the loaded objects (its code unmapped, the object still listed) crashed the
 * program in the handler, and so would a page of its stack or code it protected. */
#define SCAN_BYTES 4096u
#define SCAN_CHUNK 1024u /* words copied at a time: the handler's stack may be small */

static int after_call(const struct module *m, uint64_t v, long pid) {
  if (v - m->lo < 2) return 0;
  uint8_t code[7];
  uint64_t n = v - m->lo < sizeof code ? v - m->lo : sizeof code;
  if (copy_self(pid, v - n, code + sizeof code - n, n) != n) return 0;
  ZydisDecoderContext ctx;
  ZydisDecodedInstruction in;
  int call = 0;
  for (uint64_t k = 2; k <= n && !call; k++)
    call =
        ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&dec, &ctx, code + sizeof code - k, k, &in)) &&
        in.length == k && in.mnemonic == ZYDIS_MNEMONIC_CALL;
  /* The object's function table is read in place: its code was just readable. */
  uint64_t start, end;
  return call && !(function_of(m, v, &start, &end) == 0 && start == v);
}

/* after_call, remembered in the cache: a program's stack holds the same few return addresses
 * sample after sample (its calls into the library), and each verdict was a system call and
 * up to six decodes (~3.7 us a sample of pigz, all of whose samples are in libz). */
static int is_return(const struct module *m, uint64_t v, long pid) {
  if (!pc_cache) return after_call(m, v, pid);
  struct cache_slot at;
  uint64_t key = (v & PC_MASK) | PC_CALL, w = cache_find(key, &at);
  if (!w) {
    w = key | PC_VALID | (after_call(m, v, pid) ? PC_RETURN : 0);
    cache_put(&at, w);
  }
  return (w & PC_RETURN) != 0;
}

/* The return address into the program above the stack pointer regs[REG_RSP], when ip is in
 * a system library; 0 otherwise or when none is found. */
static uint64_t caller_of(uint64_t ip, const greg_t *regs) {
  const struct module *m = module_of(ip);
  if (!m || !m->sys) return 0;
  uint64_t sp = (uint64_t)regs[REG_RSP], lo = atomic_load_explicit(&user_lo, memory_order_relaxed),
           hi = atomic_load_explicit(&user_hi, memory_order_relaxed);
  if (sp < me_soft.stack_lo || sp >= me_soft.stack_hi || lo >= hi) return 0;
  uint64_t end = me_soft.stack_hi - sp > SCAN_BYTES ? sp + SCAN_BYTES : me_soft.stack_hi;
  long pid = syscall(SYS_getpid);
  uint64_t w[SCAN_CHUNK / 8];
  for (uint64_t p = (sp + 7) & ~7ull; p + 8 <= end;) {
    size_t want = end - p < SCAN_CHUNK ? (size_t)((end - p) & ~7ull) : SCAN_CHUNK;
    size_t got = copy_self(pid, p, w, want) / 8;
    for (size_t i = 0; i < got; i++) {
      uint64_t v = w[i];
      if (v <= lo || v >= hi) continue;
      const struct module *c = module_of(v);
      if (c && !c->sys && is_return(c, v, pid)) return v;
    }
    if (got * 8 < want) break; /* a page that cannot be read */
    p += want;
  }
  return 0;
}

void locus_soft_objects_changed(void) {
  if (proc_ok || atomic_load(&sizes_ready)) refresh_modules();
}

uint64_t locus_soft_caller(uint64_t ip, const void *uc) {
  return caller_of(ip, ((const ucontext_t *)uc)->uc_mcontext.gregs);
}

/* A PMU sample's ip comes with no registers: the stack scanned is the one of the signal that
 * delivers the sample (uc), a few instructions later. Its return address is the sample's
 * only while the thread is still in the sampled function (the same frame); otherwise none
 * is given rather than a caller's caller. */
uint64_t locus_comm_sample_caller(uint64_t ip, const void *uc) {
  const greg_t *g = ((const ucontext_t *)uc)->uc_mcontext.gregs;
  const struct module *m = module_of(ip);
  uint64_t pc = (uint64_t)g[REG_RIP], s0, e0, s1, e1;
  if (!m || !m->sys || module_of(pc) != m || function_of(m, ip, &s0, &e0) != 0 ||
      function_of(m, pc, &s1, &e1) != 0 || s0 != s1)
    return 0;
  return caller_of(ip, g);
}

void locus_comm_soft_thread_stack(void) {
  uintptr_t lo, hi;
  if (locus_thread_stack(&lo, &hi) == 0) {
    me_soft.stack_lo = lo;
    me_soft.stack_hi = hi;
  }
}

/* A watchpoint trap's pc follows the access that ran (a branch target or not). */
/* A rep string instruction at pc (glibc's memset and memcpy on large sizes: rep stosb, rep
 * movsb) that a watchpoint on [chunk, chunk + n) stopped with iterations left (rcx not 0,
 * pc still on it): the access was its own, on the chunk, behind the pointer that has moved
 * past it. By how much is not fixed: with fast strings (ERMS) the CPU stores whole lines
 * and takes the trap some iterations later, so the pointer is up to REP_AHEAD bytes on.
 * movs reads at rsi and writes at rdi: the one behind which the chunk lies is the access.
 * Decoded here, at pc, whatever the function's walk (skid_at) found. (The instruction
 * before pc, decoded as for any trap, made a memset's stores read as loads.) */
#define REP_AHEAD 4096u
static int passed(uint64_t p, uint64_t chunk, uint64_t n, int down) {
  return down ? p < chunk + n && chunk + n - p <= REP_AHEAD : p > chunk && p - chunk <= REP_AHEAD;
}

static int rep_string_at(uint64_t pc, const greg_t *g, uint64_t chunk, uint64_t n,
                         struct locus_comm_access *a) {
  ZydisDecodedInstruction in;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (decode_at(pc, &in, ops) != 0 ||
      !(in.attributes & (ZYDIS_ATTRIB_HAS_REP | ZYDIS_ATTRIB_HAS_REPE | ZYDIS_ATTRIB_HAS_REPNE)))
    return DEC_NOMEM;
  int rc = access_decoded(&in, ops, pc, g, 0, a); /* (movs: the write, at rdi) */
  if (rc != DEC_OK) return rc;
  int down = (g[REG_EFL] & 0x400) != 0; /* the direction flag */
  if (!passed(a->addr, chunk, n, down)) {
    int two = in.mnemonic == ZYDIS_MNEMONIC_MOVSB || in.mnemonic == ZYDIS_MNEMONIC_MOVSW ||
              in.mnemonic == ZYDIS_MNEMONIC_MOVSD || in.mnemonic == ZYDIS_MNEMONIC_MOVSQ;
    if (!two || !passed((uint64_t)g[REG_RSI], chunk, n, down)) return DEC_NOMEM;
    a->flags &= ~LOCUS_AC_STORE; /* movs's read */
  }
  a->addr = chunk;
  a->len = (uint32_t)n;
  return DEC_OK;
}

int locus_comm_soft_access_before(uint64_t pc, void *uc, uint64_t chunk, uint64_t n,
                                  struct locus_comm_access *a) {
  if (pc >= 0x800000000000ull || pc < 4096) return -1;
  const greg_t *g = ((ucontext_t *)uc)->uc_mcontext.gregs;
  const struct module *m = module_of(pc);
  struct around b;
  uint64_t w = skid_at(m, pc, &b);
  uint64_t prevlen = (w >> 48) & 0xf;
  /* The instruction before pc, when its access is on the chunk (a store just before a
   * memset's rep stosb is its own, though pc is on the rep); else the rep string at pc. */
  if ((!(w & PC_NONE) && prevlen && access_before(m, &b, pc, prevlen, uc, a) == DEC_OK &&
       a->addr < chunk + n && chunk < a->addr + a->len) ||
      (g[REG_RCX] != 0 && rep_string_at(pc, g, chunk, n, a) == DEC_OK)) {
    a->caller = caller_of(a->ip, g);
    return 0;
  }
  return -1;
}

/* ---- sizes of hardware address samples ---- */

int locus_comm_decoder_open(void) {
  if (atomic_load(&sizes_ready)) return 0;
  if (zydis_open() != 0 ||
      !ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)))
    return -1;
  /* The objects loaded now: their code is read in place, not copied by a system call per
   * sample (later ones are copied). */
  refresh_modules();
  atomic_store(&sizes_ready, 1);
  return 0;
}

int locus_comm_access_size(uint64_t ip, int store, uint32_t *len, uint32_t *flags) {
  if (!atomic_load_explicit(&sizes_ready, memory_order_acquire)) return -1;
  if (ip >= 0x800000000000ull || ip < 4096) return -1;
  ZydisDecodedInstruction in;
  ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
  if (decode_at(ip, &in, ops) != 0) return -1;
  const ZydisDecodedOperand *mem = NULL;
  for (int i = 0; i < in.operand_count; i++) {
    const ZydisDecodedOperand *o = &ops[i];
    if (o->type != ZYDIS_OPERAND_TYPE_MEMORY || o->mem.type != ZYDIS_MEMOP_TYPE_MEM) continue;
    int r = (o->actions & ZYDIS_OPERAND_ACTION_MASK_READ) != 0;
    int w = (o->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) != 0;
    if ((store == 1 && !w) || (store == 0 && !r) || (!r && !w)) continue;
    if (!mem || w) mem = o; /* as in access_of: the written one of two */
  }
  if (!mem || mem->size < 8) return 1;
  *len = mem->size / 8 > 64 ? 64 : mem->size / 8;
  *flags = 0;
  if (mem->actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) *flags |= LOCUS_AC_STORE;
  if ((in.attributes & ZYDIS_ATTRIB_HAS_LOCK) || in.mnemonic == ZYDIS_MNEMONIC_XCHG)
    *flags |= LOCUS_AC_ATOMIC;
  return 0;
}

int locus_test_soft_access_before(uint64_t pc, void *uc, uint64_t chunk, uint64_t n,
                                  struct locus_comm_access *a) {
  if (locus_comm_decoder_open() != 0) return -2;
  return locus_comm_soft_access_before(pc, uc, chunk, n, a);
}

int locus_test_soft_resync(const uint8_t *code, uint64_t n, uint64_t at, int *target) {
  if (locus_comm_decoder_open() != 0) return -2;
  uint64_t lo = (uint64_t)(uintptr_t)code;
  uint64_t w = resync_info(code, lo, lo + n, lo + at);
  *target = (w & PC_TARGET) != 0;
  return (w & PC_NONE) ? -1 : (int)((w >> 48) & 0xf);
}

int locus_test_soft_decode(uint64_t ip, void *uc, uint64_t *addr, uint32_t *len, uint32_t *flags) {
  if (locus_comm_decoder_open() != 0) return DEC_UNDECODED;
  struct locus_comm_access a;
  memset(&a, 0, sizeof a);
  int rc = access_of((const void *)ip, ZYDIS_MAX_INSTRUCTION_LENGTH, ip,
                     ((ucontext_t *)uc)->uc_mcontext.gregs, 0, &a);
  if (rc == DEC_OK && !(a.flags & (LOCUS_AC_STORE | LOCUS_AC_STACK)))
    split_rmw(((ucontext_t *)uc)->uc_mcontext.gregs, 0, &a);
  *addr = a.addr;
  *len = a.len;
  *flags = a.flags;
  return rc;
}

int locus_test_soft_sampled(uint64_t pc, void *uc, struct locus_comm_access *a,
                            uint64_t *clobbered) {
  if (locus_comm_decoder_open() != 0) return -2;
  struct code c;
  code_at(pc, &c);
  memset(a, 0, sizeof *a);
  return sampled_access(pc, &c, (const ucontext_t *)uc, a, clobbered);
}

int locus_test_soft_sample(uint64_t pc, void *uc, struct locus_comm_access *a) {
  if (locus_comm_decoder_open() != 0) return -2;
  struct code c;
  code_at(pc, &c);
  memset(a, 0, sizeof *a);
  greg_t regs[NGREG];
  const greg_t *at;
  return sample_access(pc, &c, (const ucontext_t *)uc, a, regs, &at);
}

static int test_ahead(uint64_t ip, void *uc, uint64_t *at, uint64_t *addr, uint32_t *len,
                      uint32_t *flags, int frames) {
  if (locus_comm_decoder_open() != 0) return -1;
  struct code c;
  code_at(ip, &c);
  struct locus_comm_access a;
  memset(&a, 0, sizeof a);
  if (access_ahead(ip, &c, ((ucontext_t *)uc)->uc_mcontext.gregs, &a, NULL, 0, frames) != DEC_OK)
    return -1;
  *at = a.ip;
  *addr = a.addr;
  *len = a.len;
  *flags = a.flags;
  return 0;
}

int locus_test_soft_ahead(uint64_t ip, void *uc, uint64_t *at, uint64_t *addr, uint32_t *len,
                          uint32_t *flags) {
  return test_ahead(ip, uc, at, addr, len, flags, 0);
}

int locus_test_soft_ahead_frames(uint64_t ip, void *uc, uint64_t *at, uint64_t *addr, uint32_t *len,
                                 uint32_t *flags) {
  return test_ahead(ip, uc, at, addr, len, flags, 1);
}

/* Whether the instruction at pc (not run yet) enters the kernel. Stepping stops before one:
 * a system call may block SIGTRAP (sigprocmask, pthread_sigmask, glibc blocking every
 * signal around clone), and the kernel kills a thread whose trap-flag SIGTRAP is blocked.
 * With no system call in between, the mask stays the one the sample was delivered under. */
static int enters_kernel(const struct code *c) {
  ZydisDecoderContext ctx;
  ZydisDecodedInstruction in;
  if (!c->avail || !ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&dec, &ctx, c->p, c->avail, &in)))
    return 1;
  return in.meta.category == ZYDIS_CATEGORY_SYSCALL || in.meta.category == ZYDIS_CATEGORY_INTERRUPT;
}

/* ---- threads that switch context often ----
 * perf's task clock costs at every context switch of the thread it samples (the kernel
 * stops and restarts its hrtimer, which reprograms the CPU's timer): 10-14 us a switch in
 * this KVM guest, where writing the timer exits to the hypervisor (two threads handing a
 * futex back and forth on one CPU: 4.1 -> 13.7 us a hand-off). sysbench threads
 * (sched_yield under mutexes, 1.2 M switches a second) ran 12x slower for it, and each
 * open breakpoint event (the watchpoints) adds ~0.05 us a switch. A thread that switches
 * more than switch_high times a second of its CPU time, at two measurements in a row (each
 * over at least RATE_WINDOW_NS of it; one far past it, see DECISIVE_SWITCHES, is enough), is
 * therefore moved to a POSIX CPU-time timer, which
 * the kernel checks at the scheduler's tick (no cost at a switch; at most HZ samples a
 * second, each standing for the periods that elapsed: 1 + the timer's overruns); under a
 * quarter of that rate, at two measurements in a row, it goes back to the task clock.
 * switch_high bounds the task clock's cost to ~3 % of the thread's time: 2,000 a second in
 * a VM (at 10,000, the futex hand-off with 100 us of work between switches, 9,500 a
 * second, stayed on the task clock and ran 13 % slower; sysbench mutex's threads switch
 * 8-9,000 times a second in most runs). On the tick, above wp_park_high its watchpoints
 * are closed too (sysbench threads: 1.6x slower with them open; at once when the task
 * clock's rate already was), and opened again under a quarter of that.
 * LOCUS_COMM_SWITCH_RATE sets switch_high (0: never move), and wp_park_high to 8x it. */
static uint64_t switch_high, wp_park_high;
#define RATE_WINDOW_NS 10000000u /* the least CPU time a rate is measured over */
static uint64_t period_ns(void);
static int open_clock(int sigtrap);

static int tick_arm(uint64_t p) {
  struct itimerspec its = {{(time_t)(p / 1000000000u), (long)(p % 1000000000u)},
                           {(time_t)(p / 1000000000u), (long)(p % 1000000000u)}};
  return (int)syscall(SYS_timer_settime, me_soft.ktimer, 0, &its, NULL);
}

/* Every thread's POSIX timer (kernel id + 1; 0: a free slot), for soft_sandbox: the other
 * threads' TLS cannot be reached. A timer past the table is still deleted by its thread. */
#define TIMER_SLOTS 1024u
static _Atomic int timer_ids[TIMER_SLOTS];

static void timer_kept(int id, int on) {
  int want = on ? 0 : id + 1, put = on ? id + 1 : 0;
  for (uint32_t k = 0; k < TIMER_SLOTS; k++) {
    _Atomic int *e = &timer_ids[((uint32_t)id + k) % TIMER_SLOTS];
    int v = want;
    if (atomic_load_explicit(e, memory_order_relaxed) == want &&
        atomic_compare_exchange_strong(e, &v, put))
      return;
  }
}

static void timer_delete_kept(int id) {
  timer_kept(id, 0);
  syscall(SYS_timer_delete, id);
}

/* This thread's POSIX CPU-time timer (made at its first use; raw system calls, the kernel's
 * timer id), signalling SIGTRAP with our cookie every p ns of its CPU time: 0, or -1. */
static int tick_start(uint64_t p) {
  if (me_soft.ktimer < 0) {
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGTRAP;
    sev.sigev_value.sival_ptr = (void *)LOCUS_TRAP_COOKIE;
    sev._sigev_un._tid = (pid_t)locus_me.tid;
    int id = -1;
    if (syscall(SYS_timer_create, CLOCK_THREAD_CPUTIME_ID, &sev, &id) != 0) return -1;
    me_soft.ktimer = id;
    timer_kept(id, 1);
  }
  return tick_arm(p);
}

/* A rate measured over at least DECISIVE_SWITCHES switches and DECISIVE_FACTOR times past
 * its threshold is far outside its noise (a count of 100 is +-10 %): it decides at once,
 * without the second check in a row. The task clock's signals come only when its period
 * ends in user mode (exclude_kernel: the kernel drops the others), so a thread that spends
 * its time switching (sysbench threads: sched_yield, ~5 % in user mode once the task clock
 * makes each switch 10x dearer) took one every 30-100 ms of its CPU time, and the three it
 * needed to be moved (the first only began the measurement) kept it that long at 10x its
 * cost: 0.1-0.3 s of CPU per thread. The measurement now begins when the thread's sampler
 * starts, and one signal over such a rate moves it. */
#define DECISIVE_SWITCHES 100u
#define DECISIVE_FACTOR 4u

/* A rate far past `high` (the decisive rule above). */
static int far_past(uint64_t rate, uint64_t dsw, uint64_t high) {
  return dsw >= DECISIVE_SWITCHES && rate > DECISIVE_FACTOR * high;
}

/* One check of a measured rate against a threshold `high`, for the thread's sampling source
 * (away: on the tick, else on the task clock) and, on the tick, for its watchpoints (away:
 * parked): whether it changes side now. Past `high` moves away, under a quarter of it comes
 * back, each at two checks in a row (*streak counts them); a rate past DECISIVE_FACTOR x
 * `high` over DECISIVE_SWITCHES moves away at once. */
static int switch_check(int away, uint64_t rate, uint64_t dsw, uint64_t high, int *streak) {
  if (away ? rate < high / 4 : rate > high)
    ++*streak;
  else
    *streak = 0;
  int decisive = !away && far_past(rate, dsw, high);
  if (*streak < 2 && !decisive) return 0;
  *streak = 0;
  return 1;
}

int locus_test_soft_switch_check(int tick, uint64_t rate, uint64_t dsw, uint64_t high,
                                 int *streak) {
  return switch_check(tick, rate, dsw, high, streak);
}

static void park(int parked) {
  me_soft.parked = parked;
  locus_comm_detect_park(parked);
}

/* rate: the switches a second measured on the task clock. It is a floor of the rate on the
 * tick (the clock's cost at each switch only slows them): above wp_park_high the
 * watchpoints are parked at once, not two checks on the tick later (their cost at a switch,
 * armed, is ~1.2 us here). */
static void go_tick(uint64_t rate) {
  if (tick_start(period_ns()) != 0) {
    me_soft.streak = -1;
    return;
  }
  /* Closed, not disabled: a disabled event still costs at every switch. */
  ioctl(me_soft.fd, PERF_EVENT_IOC_DISABLE, 0);
  locus_fd_close(me_soft.fd);
  me_soft.fd = -1;
  me_soft.source = SRC_TICK;
  locus_comm_detect_on_tick(1);
  me_soft.wp_streak = 0;
  locus_ct.st.flags |= LOCUS_CT_TICKED;
  if (rate > wp_park_high && !me_soft.parked) park(1);
}

static int go_clock(void) {
  int fd = open_clock(1);
  if (fd < 0) return -1; /* stays on the tick */
  /* Deleted, not disarmed: each timer holds a unit of the user's RLIMIT_SIGPENDING. */
  timer_delete_kept(me_soft.ktimer);
  me_soft.ktimer = -1;
  /* A tick already queued arrives under SRC_SIGTRAP and is dropped (on_sampler_signal). */
  me_soft.fd = fd;
  me_soft.source = SRC_SIGTRAP;
  locus_comm_detect_on_tick(0);
  if (me_soft.parked) park(0);
  return 0;
}

static void warn_budget(void) {
  if (!atomic_load(&warned_budget) && !atomic_exchange(&warned_budget, 1))
    locus_warn(
        "comm: the runtime's file descriptors (the top quarter of RLIMIT_NOFILE) are all in "
        "use: threads from here on are sampled by a POSIX CPU-time timer (at most HZ samples "
        "per second) without watchpoints, and the program keeps the rest of its descriptors; "
        "raise the limit (ulimit -n) to sample every thread fully");
}

/* A thread that started on the tick (start_undecided), at its first signal: a rate far past
 * switch_high (the decisive rule: DECISIVE_FACTOR times, over DECISIVE_SWITCHES switches)
 * keeps it on the tick, as one moved there, with its watchpoints opened only under
 * wp_park_high; any other goes to the task clock with its watchpoints, where it would have
 * started before, and adapt() moves it as it always did (two checks in a row past the
 * threshold). Staying on the tick for any rate past switch_high could catch a compute thread
 * preempted a few thousand times a second of its CPU time on a loaded machine, and on the
 * tick it comes back only under a quarter of that (the likely reason a test of two counting
 * threads once got 460 samples where it asks 600, under a load average of 30). */
int locus_test_soft_stays_on_tick(uint64_t rate, uint64_t dsw, uint64_t high) {
  return far_past(rate, dsw, high);
}

static void decide(uint64_t rate, uint64_t dsw) {
  me_soft.undecided = 0;
  me_soft.streak = me_soft.wp_streak = 0;
  if (!far_past(rate, dsw, switch_high)) {
    if (go_clock() == 0) return;
    /* No task clock (the runtime's descriptors all in use): on the tick for good. */
    me_soft.streak = -1;
    if (errno == EMFILE) {
      warn_budget();
      return;
    }
    park(0);
    return;
  }
  locus_ct.st.flags |= LOCUS_CT_TICKED;
  locus_comm_detect_on_tick(1);
  if (rate <= wp_park_high) park(0);
}

/* The context switches of this thread so far, -1 when unknown. */
static int64_t switches(void) {
  struct rusage ru;
  if (syscall(SYS_getrusage, RUSAGE_THREAD, &ru) != 0) return -1;
  return (int64_t)ru.ru_nvcsw + (int64_t)ru.ru_nivcsw;
}

/* The measurement's start: at the sampler's start, and after each check. cpu: the thread's
 * CPU time (ns) now. */
static void adapt_mark(uint64_t cpu) {
  int64_t sw = switches();
  me_soft.sw_last = sw < 0 ? 0 : (uint64_t)sw;
  me_soft.cpu_last = sw < 0 ? 0 : cpu;
}

/* After a sample of the task clock or the tick: count the switches since the last check.
 * cpu: the thread's CPU time at the signal (ns; 0 unknown), read by the handler already.
 * getrusage's CPU time moves at ticks and switches only: the thread's clock, exactly. */
static void adapt(uint64_t cpu) {
  if (!switch_high || me_soft.streak < 0 ||
      (me_soft.source != SRC_SIGTRAP && me_soft.source != SRC_TICK) || !cpu)
    return;
  if (!me_soft.cpu_last || cpu < me_soft.cpu_last) {
    adapt_mark(cpu);
    return;
  }
  uint64_t dcpu = cpu - me_soft.cpu_last;
  /* Too short to tell: measured over the next ones. Over a single 1 ms period a compute
   * thread preempted 1,000 times a second (beside a 1 ms sleep loop, on a loaded machine)
   * showed 2-3 switches often enough, twice in a row, to be moved for most of its run;
   * over 10 ms its count is 10 +- 3, far from 20. The switches are read only then. */
  uint64_t window = period_ns() / 2 > RATE_WINDOW_NS ? period_ns() / 2 : RATE_WINDOW_NS;
  /* A thread that started on the tick chooses at its first signal: only a rate the noise
   * cannot give keeps it there (far_past), and the task clock is the default. */
  if (!dcpu || (dcpu < window && !me_soft.undecided)) return;
  int64_t sw = switches();
  if (sw < 0) return;
  uint64_t dsw = (uint64_t)sw - me_soft.sw_last;
  me_soft.sw_last = (uint64_t)sw;
  me_soft.cpu_last = cpu;
  uint64_t rate = dsw * 1000000000u / dcpu;
  if (me_soft.undecided) {
    decide(rate, dsw);
    return;
  }
  int tick = me_soft.source == SRC_TICK;
  if (tick && switch_check(me_soft.parked, rate, dsw, wp_park_high, &me_soft.wp_streak))
    park(!me_soft.parked);
  if (!switch_check(tick, rate, dsw, switch_high, &me_soft.streak)) return;
  if (tick)
    go_clock();
  else
    go_tick(rate);
}

static int in_vm(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c >> 31) & 1; /* the hypervisor bit */
}

/* ---- the handler ---- */
/* A POSIX CPU-time timer's signal that fired while the thread was in a system call is
 * delivered as the call returns, at the instruction after `syscall`: the time was the
 * kernel's, and the next access is not what the thread was doing (perf's task clock,
 * exclude_kernel, drops such samples itself). Read in loaded objects only. */
static int after_syscall(const struct code *c, uint64_t pc) {
  if (!c->m || pc < c->m->lo + 2) return 0;
  const uint8_t *p = (const uint8_t *)pc;
  if (p[-2] != 0x0f || p[-1] != 0x05) return 0;
  /* The instruction before pc, when the function table says (0: a branch or a syscall ends
   * there, which the skid correction does not take). */
  uint64_t w = lookup(c->m, pc), len = (w >> 48) & 0xf;
  return (w & PC_NONE) || len == 2 || len == 0;
}

/* Every JITTER_EVERY perf samples, the thread's period is redrawn uniformly in [3/4, 5/4] of
 * the configured one (mean unchanged; PERF_EVENT_IOC_PERIOD restarts the count with it).
 * Our sigtrap events and a program's own share SIGTRAP, and the kernel keeps one pending
 * SIGTRAP: two task clocks that expire in the same interrupt deliver one signal. With a
 * fixed period, a program sampling itself every 10 ms in step with our 1 ms got none of its
 * signals in 1 run of 6 (test_the_programs_own_perf_signals_reach_it); a period that keeps
 * changing cannot stay in step with one (nor alias with a periodic program). */
#define JITTER_EVERY 16u
static void jitter_period(uint64_t t0) {
  if ((me_soft.source != SRC_SIGTRAP && me_soft.source != SRC_ASYNC) || me_soft.fd < 0 ||
      ++me_soft.jitter_n % JITTER_EVERY)
    return;
  uint64_t h = (t0 ^ ((uint64_t)locus_me.tid << 32)) * 0x9e3779b97f4a7c15ull;
  uint64_t p = period_ns() * 3 / 4 + (h >> 32) % (period_ns() / 2 + 1);
  ioctl(me_soft.fd, PERF_EVENT_IOC_PERIOD, &p);
}

static void take_sample(ucontext_t *uc, uint32_t weight, int timer) {
  struct locus_comm_thread *st = &locus_ct.st;
  if (!locus_ct.started) return;
  uint64_t t0 = locus_ticks();
  /* A thread that started on the tick chooses its source at its first signal (adapt()). */
  struct locus_handler_cost c0 = locus_comm_self_begin(me_soft.undecided, t0);
  jitter_period(t0);
  st->signals++;
  locus_comm_checkpoint(t0);
  if (locus_me.guard || locus_me.state != 1 || !locus_enabled) {
    st->skipped++;
    locus_comm_self_end(c0); /* the checkpoint and the signal were ours all the same */
    return;
  }
  locus_me.guard++;
  uint64_t pc = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
  uint16_t cs = (uint16_t)(uc->uc_mcontext.gregs[REG_CSGSFS] & 0xffff);
  struct locus_comm_access a;
  memset(&a, 0, sizeof a);
  if ((cs & 3) != 3 || pc >= 0x800000000000ull) {
    st->skipped++;
    st->kernel++;
  } else {
    struct code c;
    code_at(pc, &c);
    const greg_t *regs = uc->uc_mcontext.gregs; /* at the sampled access (split_rmw) */
    greg_t ahead_regs[NGREG];
    int rc = timer && after_syscall(&c, pc) ? DEC_SYSCALL
                                            : sample_access(pc, &c, uc, &a, ahead_regs, &regs);
    /* Never with SIGTRAP blocked in the context we return to: the kernel delivers a sample
     * to a thread that blocks it (asynchronously), but a blocked trap-flag SIGTRAP kills. */
    if (rc == DEC_NOMEM && step_on && !sigismember(&uc->uc_sigmask, SIGTRAP) &&
        !enters_kernel(&c)) {
      me_soft.step_left = steps_allowed(); /* counted when the stepping ends */
      me_soft.step_weight = weight;
      me_soft.step_t = t0;
      uc->uc_mcontext.gregs[REG_EFL] |= EFL_TF;
    } else if (rc != DEC_OK) {
      st->skipped++;
      if (rc == DEC_UNDECODED) st->undecoded++;
      if (rc == DEC_SYSCALL) st->kernel++;
    } else {
      if (!(a.flags & (LOCUS_AC_STORE | LOCUS_AC_STACK)))
        split_rmw(regs, (a.flags & LOCUS_AC_SKID) ? pc : 0, &a);
      a.t = t0;
      a.cpu = sched_getcpu();
      a.weight = weight;
      a.caller = caller_of(a.ip, regs);
      locus_comm_take(&a);
    }
  }
  adapt(c0.cpu);
  locus_comm_self_end(c0);
  locus_me.guard--;
}

/* One single step of a sample (see STEP_MAX): the instruction at pc has not run yet, so its
 * address comes from the registers as they are. */
static void on_step(ucontext_t *uc) {
  struct locus_comm_thread *st = &locus_ct.st;
  uint64_t t0 = locus_ticks();
  struct locus_handler_cost c0 = locus_comm_self_begin(0, t0);
  step_measured(t0);
  uint64_t pc = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
  int rc = DEC_UNDECODED;
  struct locus_comm_access a;
  memset(&a, 0, sizeof a);
  struct code c;
  int live = locus_ct.started && !locus_me.guard && locus_me.state == 1 && locus_enabled;
  if (live) {
    locus_me.guard++;
    code_at(pc, &c);
    if (c.avail) rc = access_of(c.p, c.avail, pc, uc->uc_mcontext.gregs, 0, &a);
    greg_t regs[NGREG];
    memcpy(regs, uc->uc_mcontext.gregs, sizeof regs);
    if (rc == DEC_NOMEM && ahead_on)
      rc = access_ahead(pc, &c, uc->uc_mcontext.gregs, &a, regs, 0, 0);
    if (rc == DEC_OK) {
      if (!(a.flags & (LOCUS_AC_STORE | LOCUS_AC_STACK))) split_rmw(regs, 0, &a);
      a.t = t0;
      a.cpu = sched_getcpu();
      a.flags |= LOCUS_AC_STEP;
      a.weight = me_soft.step_weight;
      a.caller = caller_of(a.ip, regs);
      locus_comm_take(&a);
    }
    locus_me.guard--;
  }
  if (!(rc == DEC_NOMEM && live && --me_soft.step_left > 0 && !enters_kernel(&c))) {
    me_soft.step_left = 0;
    uc->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)EFL_TF;
    if (rc != DEC_OK && locus_ct.started) {
      st->skipped++;
      if (rc == DEC_UNDECODED) st->undecoded++;
    }
  }
  locus_comm_self_end(c0);
}

/* Sampler signals: TRAP_PERF with our cookie (the dispatcher checked it), the timer's
 * SI_TIMER with our cookie, the async fallback's POLL_* naming our fd, or a single step of
 * a sample. */
static int on_sampler_signal(siginfo_t *si, void *uc) {
  int ours = 0;
  if (si->si_code == TRAP_TRACE && me_soft.step_left > 0) {
    if (LOCUS_UNLIKELY(locus_quiet)) { /* a chain cut by a seccomp filter: no more steps */
      me_soft.step_left = 0;
      ((ucontext_t *)uc)->uc_mcontext.gregs[REG_EFL] &= ~(greg_t)EFL_TF;
      return 1;
    }
    on_step(uc);
    return 1;
  }
  uint32_t weight = 1;
  int timer = 0;
  if (si->si_code == TRAP_PERF) {
    /* The dispatcher passes on every SIGTRAP it does not know: a perf event of the
     * program's own (sigtrap with its own sig_data) is the program's. */
    const struct locus_perf_siginfo *p = (const void *)si;
    ours = (p->perf_data & LOCUS_TRAP_COOKIE_MASK) == LOCUS_TRAP_COOKIE;
  } else if (si->si_code == SI_TIMER) {
    /* One of our timers; one queued before its thread left SRC_TICK is dropped. */
    ours = (uint64_t)si->si_value.sival_ptr == LOCUS_TRAP_COOKIE;
    if (me_soft.source != SRC_TIMER && me_soft.source != SRC_TICK) return ours;
    weight = 1u + (uint32_t)(si->si_overrun > 0 ? si->si_overrun : 0);
    timer = 1;
  }
  /* F_SETSIG with a signal that has codes of its own (SIGTRAP) arrives as SI_SIGIO. */
  else if (si->si_code == SI_SIGIO || (si->si_code >= POLL_IN && si->si_code <= POLL_HUP)) {
    /* Still ours when queued before the event was closed (stop_sampler). */
    ours = me_soft.async_fd > 2 && si->si_fd == me_soft.async_fd;
    if (me_soft.source != SRC_ASYNC) return ours;
  }
  /* Queued before a seccomp filter (locus_before_sandbox): ours, dropped with no system call. */
  if (ours && !locus_quiet) take_sample(uc, weight, timer);
  return ours;
}

/* ---- per-thread set-up ---- */
static uint64_t period_ns(void) {
  uint64_t p = locus_comm_cfg.period_ns;
  return p < PERIOD_FLOOR_NS ? PERIOD_FLOOR_NS : p;
}

/* Whether a seccomp filter is on (`Seccomp: 2` in /proc/self/status): only asked to word
 * a warning, once. */
static int seccomp_filtered(void) {
  char b[4096];
  if (locus_read_small("/proc/self/status", b, sizeof b) <= 0) return 0;
  const char *p = strstr(b, "\nSeccomp:");
  if (!p) return 0;
  for (p += 9; *p == ' ' || *p == '\t'; p++) {
  }
  return *p == '2';
}

static void warn_source(const char *msg) {
  int expect = 0;
  if (atomic_compare_exchange_strong(&warned_source, &expect, 1)) locus_warn(msg);
}

static int open_clock(int sigtrap) {
  struct perf_event_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.size = sizeof attr;
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  attr.sample_period = period_ns();
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  if (sigtrap) {
    attr.sigtrap = 1;
    attr.remove_on_exec = 1;
    attr.sig_data = LOCUS_TRAP_COOKIE | LOCUS_TRAP_SAMPLER;
  } else {
    attr.wakeup_events = 1;
    attr.disabled = 1; /* enabled once the signal is routed to this thread */
  }
  return locus_fd_keep_high(
      (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
}

static int start_async(void) {
  int fd = open_clock(0);
  if (fd < 0) return -1;
  /* Known before the first signal can come. */
  me_soft.fd = me_soft.async_fd = fd;
  me_soft.source = SRC_ASYNC;
  struct f_owner_ex owner = {F_OWNER_TID, (pid_t)locus_me.tid};
  if (fcntl(fd, F_SETSIG, SIGTRAP) != 0 || fcntl(fd, F_SETOWN_EX, &owner) != 0 ||
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC) != 0 ||
      ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) != 0) {
    me_soft.fd = -1;
    me_soft.source = SRC_NONE;
    locus_fd_close(fd);
    return -1;
  }
  return 0;
}

static int start_timer(void) {
  if (tick_start(period_ns()) != 0) return -1;
  me_soft.source = SRC_TIMER;
  return 0;
}

/* A thread after the process's first starts on the tick, its watchpoints parked, until the
 * check of its switch rate at its first tick signal (adapt) chooses (decide). A perf event, even
 * closed, leaves the thread a perf context that the kernel visits at each of its switches (~45 ns
 * here, two locks), and the task clock's first signals are slow to come to a thread that switches
 * often (see DECISIVE_SWITCHES): sysbench threads' workers, which the first check keeps on the tick
 * with their watchpoints parked, now never open one (CPU time 4.1 s plain, 4.8 s when they started
 * on the task clock). A compute thread takes its first sample on the tick (1-4 ms of its CPU time:
 * the timer's first period, seen at the next tick; one sample standing for those periods) before
 * its task clock. The process's first thread starts on the task clock: it tells whether perf works
 * here, and the warnings are its. */
static int start_undecided(void) {
  if (tick_start(period_ns()) != 0) return -1;
  me_soft.source = SRC_TICK;
  me_soft.undecided = 1;
  park(1);
  return 0;
}

static void start_sampler(void) {
  int full = 0; /* the runtime's descriptors are all in use */
  if (forced_source <= SRC_SIGTRAP && switch_high && atomic_load(&clock_works) &&
      start_undecided() == 0)
    return;
  if (forced_source <= SRC_SIGTRAP) {
    int fd = open_clock(1);
    if (fd >= 0) {
      me_soft.fd = fd;
      me_soft.source = SRC_SIGTRAP;
      atomic_store(&clock_works, 1);
      return;
    }
    full = errno == EMFILE;
  }
  if (full && start_timer() == 0) {
    warn_budget();
    return;
  }
  if (forced_source <= SRC_ASYNC && start_async() == 0) {
    warn_source(
        "comm: perf sigtrap unavailable (Linux < 5.13?): soft sampling uses perf task-clock "
        "with O_ASYNC signals");
    return;
  }
  if (start_timer() == 0) {
    if (!atomic_load(&warned_source))
      warn_source(
          seccomp_filtered()
              ? "comm: perf_event_open is blocked by a seccomp filter (a container's default "
                "profile): soft sampling uses a POSIX CPU-time timer, at most HZ samples per "
                "second, and no watchpoints (docker run --cap-add PERFMON, Docker 23+, or a "
                "seccomp profile permitting perf_event_open enables perf)"
              : "comm: perf_event_open unavailable: soft sampling uses a POSIX CPU-time timer, at "
                "most HZ samples per second (sysctl kernel.perf_event_paranoid=2 or CAP_PERFMON "
                "enables perf)");
    return;
  }
  warn_source("comm: no sampling source works here; this thread is not sampled");
}

static void stop_sampler(void) {
  int fd = me_soft.fd, timer = me_soft.ktimer;
  me_soft.source = SRC_NONE; /* first: a sample meanwhile switches nothing (adapt) */
  me_soft.fd = me_soft.ktimer = -1;
  atomic_signal_fence(memory_order_seq_cst);
  if (timer >= 0) timer_delete_kept(timer);
  if (fd >= 0) {
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    locus_fd_close(fd);
  }
}

/* Ended threads' alternate stacks, kept for the next threads: an munmap per ended thread
 * is a TLB shootdown on every CPU that runs another thread of the program (as the record
 * chunks' were, bench/threads.py). Slots taken and given with one atomic exchange each. */
#define ALTSTACK_POOL 64
static void *_Atomic altstack_pool[ALTSTACK_POOL];

static void *altstack_get(void) {
  for (int i = 0; i < ALTSTACK_POOL; i++)
    if (atomic_load_explicit(&altstack_pool[i], memory_order_relaxed)) {
      void *p = atomic_exchange(&altstack_pool[i], NULL);
      if (p) return p;
    }
  void *p = mmap(NULL, ALTSTACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void altstack_put(void *p) {
  for (int i = 0; i < ALTSTACK_POOL; i++) {
    void *none = NULL;
    if (!atomic_load_explicit(&altstack_pool[i], memory_order_relaxed) &&
        atomic_compare_exchange_strong(&altstack_pool[i], &none, p))
      return;
  }
  munmap(p, ALTSTACK_SIZE);
}

/* The thread's alternate signal stack (raw system calls: the sigaltstack interposer keeps
 * a smaller one the program sets later virtual, see locus_alt). */
static void setup_altstack(void) {
  stack_t cur;
  if (syscall(SYS_sigaltstack, NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE))
    return; /* the program's */
  void *p = altstack_get();
  if (!p) return;
  stack_t ss = {.ss_sp = p, .ss_flags = 0, .ss_size = ALTSTACK_SIZE};
  if (syscall(SYS_sigaltstack, &ss, NULL) != 0) {
    altstack_put(p);
    return;
  }
  locus_alt = (struct locus_altstack){
      .sp = p, .size = ALTSTACK_SIZE, .prog_sp = NULL, .prog_size = 0, .prog_flags = SS_DISABLE};
}

static void free_altstack(void) {
  if (!locus_alt.sp) return;
  stack_t cur;
  if (syscall(SYS_sigaltstack, NULL, &cur) == 0 && cur.ss_sp == locus_alt.sp &&
      !(cur.ss_flags & SS_ONSTACK)) {
    stack_t off = {.ss_sp = NULL, .ss_flags = SS_DISABLE, .ss_size = 0};
    if (syscall(SYS_sigaltstack, &off, NULL) == 0) altstack_put(locus_alt.sp);
  }
  locus_alt.sp = NULL;
}

static void thread_context(void) {
  unsigned long v = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_FS, &v) == 0) me_soft.fs_base = v;
  v = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_GS, &v) == 0) me_soft.gs_base = v;
  locus_comm_soft_thread_stack();
}

/* The thread's sampler, and the start of its switch rate's measurement (adapt). */
static void start_sampling(void) {
  start_sampler();
  if (switch_high && (me_soft.source == SRC_SIGTRAP || me_soft.undecided))
    adapt_mark(locus_thread_cpu_ns());
}

/* No source, fd or timer (a new thread's, or a fork child's: neither is inherited). */
static void sampler_reset(void) {
  me_soft.fd = me_soft.ktimer = me_soft.async_fd = -1;
  me_soft.source = SRC_NONE;
  me_soft.streak = me_soft.wp_streak = me_soft.parked = me_soft.undecided = 0;
  me_soft.sw_last = me_soft.cpu_last = 0;
}

static void soft_thread_init(void) {
  if (!proc_ok) return;
  sampler_reset();
  setup_altstack();
  thread_context();
  /* Objects dlopen'ed since the last snapshot (the handler cannot call dl_iterate_phdr). */
  refresh_modules();
  locus_comm_detect_thread_init();
  start_sampling();
}

static void soft_thread_fini(void) {
  if (!proc_ok) return;
  /* Signals already queued are delivered when close() returns, on the still-present
   * alternate stack; none can come after. */
  stop_sampler();
  locus_comm_detect_thread_fini();
  free_altstack();
}

static void soft_proc_fini(void) {
  if (!proc_ok) return;
  stop_sampler();
  locus_comm_detect_thread_fini();
  /* The alternate stack stays: other threads' signals may still run until exit. */
}

/* Before a seccomp filter: every thread's timer deleted (their perf events are disabled by
 * locus_fds_disable_perf); a signal already queued finds locus_quiet set. */
static void soft_sandbox(void) {
  if (!proc_ok) return;
  for (uint32_t i = 0; i < TIMER_SLOTS; i++) {
    int v = atomic_exchange(&timer_ids[i], 0);
    if (v) syscall(SYS_timer_delete, v - 1);
  }
}

static void soft_after_fork(void) {
  if (!proc_ok) return;
  /* The parent's timers are not the child's (none is inherited). */
  for (uint32_t i = 0; i < TIMER_SLOTS; i++) atomic_store(&timer_ids[i], 0);
  /* The fds are the parent's events: close, never disable. Timers are not inherited. */
  locus_fd_close(me_soft.fd);
  /* Another thread may have held it at fork: the child has only this thread. */
  atomic_store(&mods_busy, 0);
  sampler_reset();
  locus_comm_detect_thread_init();
  start_sampling();
}

static int soft_proc_init(void) {
  if (zydis_open() != 0) {
    locus_warn(
        "comm: libZydis.so.4.0 not found (apt-get install libzydis4.0); the comm lens is off");
    return -1;
  }
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    locus_warn("comm: the Zydis decoder cannot start; the comm lens is off");
    return -1;
  }
  const char *step = getenv("LOCUS_SOFT_STEP");
  step_on = !(step && *step == '0');
  const char *ahead = getenv("LOCUS_SOFT_AHEAD");
  ahead_on = !(ahead && *ahead == '0');
  const char *src = getenv("LOCUS_COMM_SOFT_SOURCE");
  if (src && !strcmp(src, "async")) forced_source = SRC_ASYNC;
  if (src && !strcmp(src, "timer")) forced_source = SRC_TIMER;
  const char *rate = getenv("LOCUS_COMM_SWITCH_RATE");
  if (rate && *rate) {
    switch_high = strtoull(rate, NULL, 10);
    wp_park_high = 8 * switch_high;
  } else {
    /* Bare metal: hrtimer reprogramming is a register write, ~0.5 us a switch all told. The
     * watchpoints' thresholds are where they were with the task clock's at 10,000 (VM) and
     * 50,000: their cost at a switch did not change. */
    int vm = in_vm();
    switch_high = vm ? 2000u : 50000u;
    wp_park_high = vm ? 80000u : 400000u;
  }
  void *cache = mmap(NULL, CACHE_SLOTS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (cache == MAP_FAILED) {
    locus_warn("comm: cannot allocate the decoder cache; the comm lens is off");
    return -1;
  }
  pc_cache = cache;
#ifdef LOCUS_LAYOUT_PROFILE
  /* scripts/hot-functions: count only the code that runs from here on (the pages trimmed
   * below and never run again are not resident at the program's peak). */
  __gcov_reset();
#endif
  trim_object((const void *)zy.decode_full);
  trim_object((const void *)soft_proc_init);
  atomic_store(&nmods, 0);
  refresh_modules();
  locus_comm_trap_sampler = on_sampler_signal;
  if (locus_comm_trap_install() != 0) {
    locus_warn("comm: cannot install the SIGTRAP handler; the comm lens is off");
    return -1;
  }
  proc_ok = 1;
  return 0;
}

struct locus_comm_backend_ops locus_comm_soft = {
    .name = "soft",
    .proc_init = soft_proc_init,
    .thread_init = soft_thread_init,
    .thread_fini = soft_thread_fini,
    .proc_fini = soft_proc_fini,
    .after_fork = soft_after_fork,
    .sandbox = soft_sandbox,
};
