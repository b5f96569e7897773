/* On-disk format of a locus run directory (docs/format.md is the prose version).
 *
 * Every binary file is an array of fixed-size little-endian records, readable with
 * numpy.memmap. Files are written through MAP_SHARED mappings of chunks claimed by each
 * thread, so records reach the page cache the moment they are stored: a program killed
 * with SIGKILL still leaves every record it wrote. A record whose `kind` is 0 is unused
 * space (the tail of a chunk a thread never filled) and readers skip it.
 *
 * Layout:
 *   RUN/meta.json                     launcher: command, host, lenses, clock, sampler
 *   RUN/sched.bin                     launcher: struct locus_sched_sample per task per tick
 *   RUN/monitor.jsonl                 launcher: monitor lens, JSON lines (docs/monitor.md)
 *   RUN/procs/<pid>/proc.bin          one struct locus_proc (updated in place)
 *   RUN/procs/<pid>/threads.bin       struct locus_thread, one per thread
 *   RUN/procs/<pid>/locks.events.bin  struct locus_lock_event
 *   RUN/procs/<pid>/locks.counts.bin  struct locus_lock_count (per-thread hash tables)
 *   RUN/procs/<pid>/locks.objects.bin struct locus_lock_object (init/destroy of locks)
 *   RUN/procs/<pid>/stacks.bin        struct locus_stack (only with --call-stack)
 *   RUN/procs/<pid>/comm.samples.bin  struct locus_comm_sample (comm lens)
 *   RUN/procs/<pid>/comm.events.bin   struct locus_comm_event (comm lens)
 *   RUN/procs/<pid>/comm.threads.bin  struct locus_comm_thread (comm lens, one per thread)
 *   RUN/procs/<pid>/allocs.bin        struct locus_alloc (comm, numa: mappings, stacks, and
 *                                     heap blocks with a call stack)
 *   RUN/procs/<pid>/heap.bin          struct locus_heap (comm, numa: heap blocks)
 *   RUN/procs/<pid>/frees.bin         struct locus_free (comm, numa: blocks freed)
 *   RUN/procs/<pid>/numa.touch.bin    struct locus_numa_touch (numa lens: first touches)
 *   RUN/procs/<pid>/numa.pins.bin     struct locus_numa_pin (numa lens: binding changes)
 *   RUN/procs/<pid>/numa.counts.bin   struct locus_numa_count (numa lens, exact backend)
 *   RUN/procs/<pid>/maps, maps.exit   copies of /proc/self/maps at start and at exit
 */
#ifndef LOCUS_FORMAT_H
#define LOCUS_FORMAT_H

#include <stdint.h>

/* 2: struct locus_comm_event is 128 bytes (src_caller, dst_caller); struct
 * locus_comm_sample's caller (was reserved). Readers take version 1 runs too. */
#define LOCUS_FORMAT_VERSION 2
#define LOCUS_PROC_MAGIC 0x31434f5355434f4cULL /* "LOCUSCO1" little-endian */

/* Timestamps: raw ticks of the clock named in struct locus_proc.clock. Convert with the
 * calibration pairs (tsc0, ns0) and (tsc1, ns1) of the same process:
 * ns = ns0 + (ticks - tsc0) * (ns1 - ns0) / (tsc1 - tsc0); ns is CLOCK_MONOTONIC. */
enum locus_clock { LOCUS_CLOCK_TSC = 1, LOCUS_CLOCK_MONOTONIC = 2 };

struct locus_proc { /* 256 bytes, written at start, updated at exit */
  uint64_t magic;
  uint32_t format_version;
  uint32_t pid;
  uint32_t ppid;
  uint32_t clock;      /* enum locus_clock */
  uint64_t tsc0, ns0;  /* calibration pair taken at process start */
  uint64_t tsc1, ns1;  /* latest calibration pair (refreshed at every chunk claim and exit) */
  uint64_t start_ns;   /* CLOCK_MONOTONIC at runtime init */
  uint64_t end_ns;     /* CLOCK_MONOTONIC at exit, 0 while running or if killed */
  int32_t exit_status; /* exit()/_exit() status, or -signal for a fatal signal */
  uint32_t flags;      /* LOCUS_PROC_* */
  uint64_t self_ns;    /* estimated time spent inside the runtime, all threads */
  uint64_t records;    /* records written, all kinds */
  uint64_t dropped;    /* records lost (out of space, full tables) */
  uint64_t threads;    /* threads seen */
  uint64_t fastpath_ns_per_call_x1000; /* calibrated untimed interposer cost (ps) */
  uint64_t untimed_calls;              /* interposer calls that took the untimed path */
  uint64_t exec_ns; /* CLOCK_MONOTONIC when the process called exec, 0 otherwise */
  /* heap blocks dropped with their free because no record named an address in their life
   * (comm/allocs.c; added per thread in batches of 4096 and at its end: a thread still
   * running at exit leaves out its last batch). 0 in runs before it (was reserved). */
  uint64_t heap_dropped;
  /* CLOCK_MONOTONIC when the process installed a seccomp filter (LOCUS_PROC_SANDBOXED), 0
   * otherwise. 0 in runs before it (was reserved). */
  uint64_t sandbox_ns;
  uint64_t reserved[13];
};

#define LOCUS_PROC_EXITED 1u   /* end_ns/exit_status valid */
#define LOCUS_PROC_SIGNALED 2u /* ended by a fatal signal the runtime saw */
#define LOCUS_PROC_EXECED 4u   /* replaced itself with exec (new image is a new proc) */
#define LOCUS_PROC_FORKED 8u   /* created by fork() of a recorded parent */
/* installed a seccomp filter (sandbox_ns): its records end there, the process goes on */
#define LOCUS_PROC_SANDBOXED 16u

struct locus_thread { /* 64 bytes, one slot per thread, claimed at first sight */
  uint32_t tid;
  uint32_t serial;        /* 1-based order of appearance in the process; 0 = unused slot */
  uint32_t parent_tid;    /* thread that called pthread_create, 0 if adopted/main */
  uint32_t flags;         /* LOCUS_THREAD_* */
  uint64_t start;         /* ticks: thread start (or first sight, if adopted) */
  uint64_t end;           /* ticks: thread exit, 0 if it never exited cleanly */
  uint64_t start_routine; /* address of the start routine, 0 for main/adopted */
  uint64_t self_ticks;    /* ticks measured inside the runtime's slow paths */
  uint64_t records;
  uint64_t dropped;
};

#define LOCUS_THREAD_MAIN 1u
#define LOCUS_THREAD_ADOPTED 2u /* existed before the runtime initialised */
#define LOCUS_THREAD_EXITED 4u
#define LOCUS_THREAD_JOINED 8u /* `end` of a join event: see LOCUS_LK_JOIN */

/* Kinds of lock events. One event is one critical section (acquire..release) or one
 * wait (cond, barrier, semaphore, join), written when it ends. */
enum locus_lock_kind {
  LOCUS_LK_NONE = 0,
  LOCUS_LK_MUTEX = 1,
  LOCUS_LK_RWLOCK_RD = 2,
  LOCUS_LK_RWLOCK_WR = 3,
  LOCUS_LK_SPIN = 4,
  LOCUS_LK_COND_WAIT = 5, /* lock=cond, obj=mutex; t_req=call, t_acq=return; t_rel=t_acq */
  LOCUS_LK_BARRIER = 6,   /* lock=barrier; t_req=arrival, t_acq=departure */
  LOCUS_LK_SEM_WAIT = 7,  /* lock=sem; t_req=call, t_acq=return */
  LOCUS_LK_OMP_LOCK = 8,
  LOCUS_LK_OMP_NEST_LOCK = 9,
  LOCUS_LK_OMP_CRITICAL = 10, /* lock = address of the critical's name pointer or 0 */
  LOCUS_LK_OMP_BARRIER = 11,  /* GOMP_barrier; lock = 0 */
  LOCUS_LK_COND_SIGNAL = 12,  /* lock=cond; t_req=t_acq=t_rel=time of the call */
  LOCUS_LK_SEM_POST = 13,     /* lock=sem; t_req=t_acq=t_rel=time of the call */
  LOCUS_LK_JOIN = 14,         /* lock=0, obj=joined tid; t_req=call, t_acq=return */
  LOCUS_LK_CREATE = 15,       /* obj=new tid; t_req=t_acq=t_rel=time of the call */
  LOCUS_LK_KIND_MAX = 16
};

#define LOCUS_EV_CONTENDED 1u  /* the thread had to wait for the lock */
#define LOCUS_EV_TRY 2u        /* a trylock call (never waits) */
#define LOCUS_EV_FAILED 4u     /* trylock failed or timed wait timed out: not acquired */
#define LOCUS_EV_UNRELEASED 8u /* still held when the thread/process ended; t_rel = end */
#define LOCUS_EV_SAMPLED 16u   /* timed because of sampling: stands for `weight` sections */
#define LOCUS_EV_BROADCAST 32u /* LOCUS_LK_COND_SIGNAL was a broadcast */

struct locus_lock_event { /* 64 bytes */
  uint64_t lock;          /* address of the lock object (pthread_mutex_t *, ...) */
  uint64_t site;          /* return address of the interposed call */
  uint64_t obj;           /* second object: mutex of a cond wait, joined/created tid */
  uint64_t t_req;         /* ticks: call entered */
  uint64_t t_acq;         /* ticks: lock acquired / wait returned */
  uint64_t t_rel;         /* ticks: lock released (== t_acq for pure waits) */
  uint32_t tid;
  uint32_t weight; /* number of same-kind critical sections this event stands for (>= 1) */
  uint32_t stack;  /* id in stacks.bin, 0 = none */
  uint16_t kind;   /* enum locus_lock_kind; 0 = unused record */
  uint16_t flags;  /* LOCUS_EV_* */
};

/* Exact per-thread counts, kept in an open-addressing hash table that lives in a chunk
 * of locks.counts.bin. Record 0 of each table is a header (kind = LOCUS_LC_HEADER). When a
 * table fills, the thread copies it into a larger chunk with generation+1; readers keep,
 * per (thread serial), only the table with the highest generation. */
#define LOCUS_LC_HEADER 0xffffu
struct locus_lock_count { /* 64 bytes */
  uint64_t lock;          /* header: number of slots in this table (including header) */
  uint64_t site;          /* header: generation */
  uint64_t acquisitions;  /* successful acquisitions (incl. successful trylocks) */
  uint64_t contended;     /* acquisitions that had to wait */
  uint64_t failed;        /* failed trylocks / timed out waits */
  uint64_t timed;         /* how many of them were timed (written as events) */
  uint32_t tid;
  uint32_t serial; /* thread serial (locus_thread.serial) */
  uint32_t hint;   /* runtime's own: the thread's last acquisition here was contended */
  uint16_t kind;   /* enum locus_lock_kind, or LOCUS_LC_HEADER */
  uint16_t flags;
};

/* Lock objects seen through init/destroy calls: gives heap locks a name (the site that
 * initialised them). */
struct locus_lock_object { /* 64 bytes */
  uint64_t lock;
  uint64_t site; /* return address of pthread_*_init / omp_init_lock / destroy */
  uint64_t t;    /* ticks */
  uint64_t attr; /* mutex type (PTHREAD_MUTEX_*) or barrier count, when known */
  uint64_t reserved[2];
  uint32_t tid;
  uint32_t stack;
  uint16_t kind;  /* enum locus_lock_kind */
  uint16_t flags; /* 1 = init, 2 = destroy */
  uint32_t pad;
};

#define LOCUS_STACK_DEPTH 30
struct locus_stack { /* 256 bytes */
  uint32_t id;       /* >= 1, unique within the process */
  uint32_t depth;    /* number of valid pcs, innermost first */
  uint64_t pc[LOCUS_STACK_DEPTH];
  uint64_t reserved;
};

/* ---- comm lens ----
 * One sample is one memory access a thread's sampler caught (soft: the instruction at the
 * interrupted pc, decoded; hw: a PEBS/IBS record; exact: every instrumented access is not
 * written as a sample, see locus_comm_event). One event is one detected communication:
 * a cache line that thread `dst` accessed after thread `src` had written it. */
enum locus_comm_backend {
  LOCUS_BK_NONE = 0,
  LOCUS_BK_HW = 1,
  LOCUS_BK_SOFT = 2,
  LOCUS_BK_EXACT = 3
};

#define LOCUS_AC_STORE 1u  /* the access writes (a read-modify-write is a store) */
#define LOCUS_AC_SKID 2u   /* attributed to the instruction before the sampled pc */
#define LOCUS_AC_ATOMIC 4u /* lock-prefixed or xchg */
#define LOCUS_AC_STACK 8u  /* the address is in the sampling thread's own stack */
/* soft backend: no access at the sampled pc (nor, skid-corrected, before it); the thread was
 * single-stepped (trap flag) to the next instruction with a memory operand, this one */
#define LOCUS_AC_STEP 16u
/* soft backend: a load whose bytes one of the next few instructions stores to (a split
 * read-modify-write, `mov (%rcx),%rax; add $1,%rax; mov %rax,(%rcx)`): a store too */
#define LOCUS_AC_RMW 32u

struct locus_comm_sample { /* 64 bytes */
  uint64_t t;              /* ticks */
  uint64_t addr;           /* effective address of the access */
  uint64_t ip;             /* address of the accessing instruction (after skid correction) */
  int32_t node;            /* numa lens: memory node of the page (move_pages), -1 unknown or
                              not asked, -2 page not present, -3 stack (not asked) */
  uint32_t periods;        /* sampling periods the sample stands for (soft: 1, or a POSIX CPU-time
                              timer's 1 + overruns); 0 = 1 */
  uint64_t caller;         /* ip in a system library (soft): the program's call into it, the
                              return address found by a stack scan (docs/lenses/comm.md);
                              0 = none found, or ip is not in a system library */
  uint32_t tid;
  int32_t cpu;    /* sched_getcpu() when sampled, -1 unknown */
  uint32_t flags; /* LOCUS_AC_* */
  uint16_t len;   /* access size in bytes (1..64) */
  uint16_t kind;  /* 1 = sample; 0 = unused record */
  /* The record is the one written of `thin` samples of its thread (0 or 1: every sample is
   * written): a thread writes every one of its first LOCUS_COMM_KEEP samples, then one in 2
   * of its next 2 x LOCUS_COMM_KEEP, one in 4 of the next 4 x, and so on, chosen at random;
   * `periods` counts the ones left out (it is multiplied by `thin`). Every sample is still
   * looked up and published on the bulletin board; the detections a thread makes are thinned
   * on the same clock, its samples taken (struct locus_comm_event's reserved[5]). */
  uint32_t thin;
  uint32_t pad;
};

#define LOCUS_CE_TRUE 1u  /* the byte ranges overlap: true sharing (else false sharing) */
#define LOCUS_CE_TRAP 2u  /* detected by a watchpoint trap (else by a sample's lookup) */
#define LOCUS_CE_EXACT 4u /* counted by the exact backend (volume = number of transfers) */
/* a trap on a store to a line another thread was sampled loading (soft, --watch-loads): the
 * src is the storing thread, the dst the thread whose copy the store invalidated */
#define LOCUS_CE_LOADED 8u
/* The source thread is of another process of the run (src_tid is its thread): a line of
 * memory both processes map shared (detect.c's board between processes). The event's line
 * and offsets are at the destination process's addresses; reserved[0] is the shared
 * object's inode, reserved[1] the line's offset in it, reserved[2] its device (low 32 bits):
 * the line's name in every process. */
#define LOCUS_CE_PROCS 16u
/* A trap whose access could not be decoded (soft: no instruction before the trap's pc with
 * an access on the watched bytes, nor a rep string instruction at pc): the trapping side is
 * the 8 watched bytes, taken as a load, at the trap's pc. */
#define LOCUS_CE_GUESSED 32u

struct locus_comm_event { /* 128 bytes (64 in format version 1: no callers, no reserved) */
  uint64_t t;             /* ticks of the detection */
  uint64_t line;          /* address of the cache line (addr & ~(line size - 1)) */
  uint64_t src_ip;        /* instruction of the publishing (writing) access, 0 if unknown */
  uint64_t dst_ip;        /* instruction of the detecting access */
  double volume;          /* cache lines this detection stands for (ComDetective scaling) */
  uint32_t src_tid;       /* thread that wrote the line */
  uint32_t dst_tid;       /* thread that then accessed it */
  int16_t src_cpu;        /* CPUs of the two accesses, -1 unknown */
  int16_t dst_cpu;
  uint8_t src_off, src_len; /* byte range within the line of the write */
  uint8_t dst_off, dst_len; /* byte range within the line of the detecting access */
  uint64_t src_caller;      /* the callers of src_ip and dst_ip when they are in a system */
  uint64_t dst_caller;      /* library, as struct locus_comm_sample's caller; 0 = none */
  /* reserved[0..2]: LOCUS_CE_PROCS's shared memory; reserved[5]: the event is the one
   * written of that many detections of its thread (0 or 1: every one written): one in 2 of
   * those it makes once it took LOCUS_COMM_KEEP samples, one in 4 once it took 3 x as many,
   * ... (struct locus_comm_sample's thin), chosen at random, its `volume` multiplied by it
   * (never for LOCUS_CE_EXACT) */
  uint64_t reserved[6];
  uint16_t flags;     /* LOCUS_CE_* */
  uint16_t kind;      /* 1 = event; 0 = unused record */
  uint32_t dst_flags; /* LOCUS_AC_* of the detecting access */
};

/* Per-thread counters of the comm lens, written when the thread ends (and at process exit
 * for the threads still running); one record per thread. */
/* exact backend: the thread had no copy-set bit (more than 64 threads were live when it
 * started): its loads were not tracked (its `skipped`), its stores were. */
#define LOCUS_CT_NO_COPY_BIT 1u
/* exact backend: the thread was not tracked at all (more than 1024 threads live at once, or
 * a serial above 65535): none of its accesses were seen. */
#define LOCUS_CT_UNTRACKED 2u
/* soft backend: the thread switched context so often (more than the runtime's threshold per
 * second of its CPU time) that it was sampled for a while by a POSIX CPU-time timer, at the
 * scheduler's tick (its watchpoints closed above a higher rate): perf's task clock costs at
 * every switch */
#define LOCUS_CT_TICKED 4u
/* soft backend: on the tick, the thread's watches ended after 8 of its context switches
 * without a trap (a perf context-switch counter) */
#define LOCUS_CT_EXPIRY 8u
/* soft backend: on the tick, the counter above could not be opened (kernel events need
 * perf_event_paranoid <= 1 or CAP_PERFMON): its watches lasted until its next sample */
#define LOCUS_CT_EXPIRY_DENIED 16u
struct locus_comm_thread { /* 128 bytes */
  uint32_t tid;
  uint32_t backend;     /* enum locus_comm_backend */
  uint64_t period_ns;   /* sampling period (soft/hw: time or count; exact: 0) */
  uint64_t signals;     /* sampler interrupts taken */
  uint64_t samples;     /* accesses decoded and used */
  uint64_t skipped;     /* interrupts whose instruction had no usable memory access */
  uint64_t undecoded;   /* of which: the decoder could not handle the instruction */
  uint64_t kernel;      /* of which: the interrupt landed outside user code */
  uint64_t published;   /* stores published on the bulletin board */
  uint64_t armed;       /* watchpoints armed */
  uint64_t traps;       /* watchpoint traps taken */
  uint64_t detections;  /* communication events written */
  uint64_t dropped;     /* records that could not be written */
  uint64_t self_ns;     /* time spent in the handlers */
  uint32_t watchpoints; /* debug registers this thread could open (0-4) */
  uint16_t kind;        /* 1 = record; 0 = unused */
  uint16_t flags;       /* LOCUS_CT_* */
  char name[16];        /* the thread's name (PR_GET_NAME: pthread_setname_np, the JVM's names) */
};

/* Allocations and other address ranges that the comm report names as objects. */
enum locus_alloc_kind {
  LOCUS_AL_MALLOC = 1, /* malloc, calloc, realloc (new block), posix_memalign, ... */
  LOCUS_AL_FREE = 2,   /* addr freed (size 0) */
  LOCUS_AL_MMAP = 3,   /* mmap: anonymous, or of a file (flags LOCUS_ALF_FILE) */
  LOCUS_AL_MUNMAP = 4,
  /* a thread's stack: [addr, addr + size), tid = its thread, reserved[0] = its thread
   * pointer (the TCB address: %fs:0 on x86-64; 0 = unknown, runs before 2026-11-29's
   * fourth change), from which its static TLS blocks lie at LOCUS_AL_TLS offsets */
  LOCUS_AL_STACK = 5,
  /* A frame that may have passed the addresses of its locals to other threads: the caller
   * of pthread_create or of an OpenMP parallel region (GOMP_parallel*). addr = its stack
   * pointer at the call (the callee's canonical frame address), size = 0, site = the call's
   * return address, reserved[0] = its frame pointer (rbp: meaningful where the function
   * keeps one), tid = the calling thread. One record per distinct (thread, site, addr). */
  LOCUS_AL_FRAME = 6,
  /* A module's static thread-local storage block (its PT_TLS segment), once per process at
   * its start: addr = the block of the recording thread, size = the segment's p_memsz,
   * site = the module's load address + the segment's p_vaddr (an address in the module, whose
   * STT_TLS symbols' values are offsets from the block's start), reserved[0] = the thread
   * pointer less the block's address (int64: the same for every thread). Modules whose TLS is
   * allocated on first use (most dlopen'ed ones) have none. */
  LOCUS_AL_TLS = 7
};

struct locus_alloc { /* 64 bytes */
  uint64_t t;        /* ticks */
  uint64_t addr;     /* start of the block */
  uint64_t size;     /* bytes requested (0 for frees) */
  uint64_t site;     /* return address of the allocating call */
  uint64_t reserved[2];
  uint32_t tid;
  uint32_t stack; /* id in stacks.bin (--call-stack), 0 = none */
  uint16_t kind;  /* enum locus_alloc_kind; 0 = unused record */
  uint16_t flags; /* LOCUS_ALF_* */
  uint32_t dev;   /* LOCUS_ALF_FILE: the file's st_dev (low 32 bits) */
};
/* An mmap of a file (shared or private): reserved[0] = the file offset mapped at addr,
 * reserved[1] = the file's st_ino. */
#define LOCUS_ALF_FILE 1u
/* An mremap (kind MMAP): reserved[0] = the mapping's old address; the new range continues
 * the object of the block alive there (its site, and file and offset for a file's). */
#define LOCUS_ALF_REMAP 2u
/* Mapped MAP_SHARED and writable (memory other processes may share): a file's (with
 * LOCUS_ALF_FILE) or anonymous. */
#define LOCUS_ALF_SHARED 4u
/* With LOCUS_ALF_SHARED: a System V shared memory segment attached by shmat (kind MMAP; its
 * shmdt is a kind MUNMAP record of the segment's size). */
#define LOCUS_ALF_SYSV 8u
/* A heap block (kind MALLOC) made by C++ operator new (new, new[], std::allocator): its
 * site is operator new's caller. In a struct locus_heap, bit LOCUS_HEAP_NEW of size_tid. */
#define LOCUS_ALF_NEW 16u
/* A frame (kind FRAME) of a runtime that records a call again when it comes back to a stack
 * depth another call took since (comm/allocs.c seen_call): the records' times say whose
 * locals the bytes were at any moment. Without it (runs before 2026-11-29), locals of
 * different frames at the same bytes are not named. */
#define LOCUS_ALF_TIMED 32u

/* The two records of the allocation hot path, small because an allocation-heavy program
 * writes one per malloc and one per free (a struct locus_alloc each cost twice the time).
 * A heap block without a call stack (--call-stack off) is a locus_heap, kind MALLOC; a free
 * is a locus_free, kind FREE. Their last word is never 0 in a record (an allocation's return
 * address, a freed block's address): 0 marks unused space, as `kind` does elsewhere. */
struct locus_heap {  /* 32 bytes */
  uint64_t t;        /* ticks */
  uint64_t addr;     /* start of the block */
  uint64_t size_tid; /* bytes requested (bits 0-39, saturated) | allocating tid << 40
                      * (bits 40-61: Linux's tids are below 2^22) | LOCUS_HEAP_NEW */
  uint64_t site;     /* return address of the allocating call */
};
#define LOCUS_HEAP_SIZE_BITS 40
#define LOCUS_HEAP_TID_MASK ((1ull << 22) - 1) /* of size_tid >> LOCUS_HEAP_SIZE_BITS */
#define LOCUS_HEAP_NEW (1ull << 63)            /* made by operator new (LOCUS_ALF_NEW) */

struct locus_free { /* 16 bytes */
  uint64_t t;       /* ticks */
  uint64_t addr;    /* the block freed */
};

/* ---- numa lens ----
 * One touch record per first touch of a page of fresh anonymous memory that the runtime kept
 * inaccessible (mmap'd allocations, anonymous mmap): the faulting thread records itself, opens
 * the page and places it (a write of nothing: an atomic or of 0), then asks move_pages where it
 * landed. A read places nothing (the kernel maps its shared zero page): its record has node -2
 * and the page stays read-only until its first write, recorded with LOCUS_NT_PLACE. Under
 * --fake-numa the node is the emulated node of the touching CPU. */
/* flags: */
/* the touching thread was allowed on more than one node */
#define LOCUS_NT_UNPINNED 1u
/* `pages` pages opened at once, attributed to this thread: a thread touching page after
 * page (a growing block ahead of it), or the map-count budget reached */
#define LOCUS_NT_RANGE 2u
/* the faulting access was a write (from the page-fault error code) */
#define LOCUS_NT_WRITE 4u
/* exact backend: the first instrumented access to a page not present yet */
#define LOCUS_NT_EXACT 8u
/* not a first touch: the first write to a page first touched by a read (node -2 then: the
 * zero page), and where the page landed */
#define LOCUS_NT_PLACE 16u
/* not a first touch: `pages` pages of the allocation at `region` were on `node` (-2: never
 * placed) when it was freed, or at exit (move_pages) */
#define LOCUS_NT_FINAL 32u
/* with LOCUS_NT_RANGE: the `pages` pages are one aligned transparent huge page's worth, opened
 * at once so that the kernel can back them with one huge page (THP enabled for the memory):
 * one first touch (or placement) of one huge page */
#define LOCUS_NT_HUGE 64u

struct locus_numa_touch { /* 64 bytes */
  uint64_t t;             /* ticks */
  uint64_t addr;          /* page address */
  uint64_t ip;            /* faulting instruction */
  uint64_t region; /* start of the protected region (allocation) holding the page, 0 unknown */
  uint64_t nodes;  /* nodes the touching thread was allowed to run on (bit per node) */
  uint32_t tid;
  uint32_t pages;  /* pages this record stands for (1; more with LOCUS_NT_RANGE) */
  int16_t node;    /* memory node the page landed on; -1 unknown */
  int16_t cpu;     /* CPU of the touching thread, -1 unknown */
  uint16_t flags;  /* LOCUS_NT_* */
  uint16_t kind;   /* 1 = record; 0 = unused */
  uint64_t caller; /* ip in a system library (memset): the program's call into it, as struct
                      locus_comm_sample's caller; 0 none (and in runs before 2026-11-28) */
};

/* A thread's binding: at thread start, at its end, and after every successful call that
 * changes a CPU affinity or a memory policy. */
enum locus_numa_pin_what {
  LOCUS_NP_START = 1,             /* thread start (or adoption): its initial binding */
  LOCUS_NP_SCHED_SETAFFINITY = 2, /* sched_setaffinity (tid = the thread it applies to) */
  LOCUS_NP_PTHREAD_SETAFFINITY = 3,
  LOCUS_NP_SET_MEMPOLICY = 4, /* thread's memory policy: mode, policy_nodes */
  LOCUS_NP_MBIND = 5,         /* range [addr, addr + len): mode, policy_nodes */
  LOCUS_NP_MOVE_PAGES = 6,    /* move_pages with nodes: len = pages moved, policy_nodes */
  LOCUS_NP_END = 7            /* thread end */
};

struct locus_numa_pin {  /* 64 bytes */
  uint16_t kind;         /* 1 = record; 0 = unused */
  uint8_t what;          /* enum locus_numa_pin_what */
  uint8_t mode;          /* memory policy mode (MPOL_*; 0xff = not a policy record) */
  uint32_t tid;          /* thread the binding applies to */
  uint32_t caller;       /* thread that made the call */
  uint32_t ncpus;        /* CPUs in the thread's affinity mask */
  uint64_t t;            /* ticks */
  uint64_t nodes;        /* nodes the thread may run on (bit per node), after the call */
  uint64_t ip;           /* call site (return address) */
  uint64_t policy_nodes; /* the policy's node mask */
  uint64_t addr;         /* mbind / move_pages: start of the range */
  uint64_t len;          /* mbind: bytes; move_pages: pages */
};

/* Exact backend (a program built with `locus cc`): every instrumented access counted, one
 * record per (thread, instruction, page, page node, thread's nodes, flags), written when the
 * thread ends (or at exit for the threads still running). */
#define LOCUS_NC_UNPINNED_PAGE 0x100u /* the page's first toucher was unpinned */
struct locus_numa_count {             /* 64 bytes */
  uint64_t t;                         /* ticks of the last access */
  uint64_t addr;                      /* page address */
  uint64_t ip;                        /* accessing instruction */
  uint64_t nodes;                     /* nodes the thread was allowed to run on (bit per node) */
  uint64_t count;                     /* accesses */
  uint32_t tid;
  int16_t node;   /* memory node of the page; -1 unknown, -2 not placed yet, -3 stack */
  uint16_t flags; /* LOCUS_AC_STORE, LOCUS_AC_STACK, LOCUS_NC_UNPINNED_PAGE */
  uint16_t kind;  /* 1 = record; 0 = unused */
  uint16_t pad16;
  uint32_t pad32;
  uint64_t reserved;
};

/* Written by the launcher, not the runtime. */
struct locus_sched_sample { /* 32 bytes */
  uint64_t t_ns;            /* CLOCK_MONOTONIC */
  uint64_t service_ns;      /* utime+stime (or schedstat runtime) of the task so far */
  uint32_t pid;
  uint32_t tid; /* tid 0 = system row: service_ns holds procs_running */
  uint32_t reserved[2];
};

#endif
