/* Shared between the soft sampler (soft.c) and the ComDetective detector (detect.c): one
 * SIGTRAP handler serves the sampling timer (soft) and the watchpoints (detect), and chains
 * every other SIGTRAP to the application's handler. */
#ifndef LOCUS_COMM_SOFT_H
#define LOCUS_COMM_SOFT_H

#include <signal.h>
#include <stdint.h>

#include "../comm.h"

/* sig_data of our perf events: the cookie in the high bits, a watchpoint index or
 * LOCUS_TRAP_SAMPLER in the low byte. */
#define LOCUS_TRAP_COOKIE 0x4c4f435553000000ULL /* "LOCUS" */
#define LOCUS_TRAP_COOKIE_MASK 0xffffffffff000000ULL
#define LOCUS_TRAP_SAMPLER 0xffu
/* detect.c: the context-switch counter that ends a watch (watch_expiry) */
#define LOCUS_TRAP_EXPIRY 0xfeu

/* The kernel's siginfo layout for TRAP_PERF (glibc 2.36 does not name these fields). */
struct locus_perf_siginfo {
  int si_signo, si_errno, si_code, pad;
  void *addr;
  unsigned long perf_data;
  uint32_t perf_type;
  uint32_t perf_flags;
};

/* Install the SIGTRAP dispatcher once (normal context); 0 or -1. */
int locus_comm_trap_install(void);
/* Hooks the dispatcher calls for our traps (handler context, SIGTRAP blocked). The
 * sampler hook is set by soft.c; it returns 1 when the signal was its own. */
extern int (*locus_comm_trap_sampler)(siginfo_t *si, void *uc);
void locus_comm_detect_on_watch(unsigned idx, siginfo_t *si, void *uc);

/* Decoding for the detector's traps (soft.c): the access made by the instruction that ends
 * right before `pc` (a watchpoint trap reports the pc after the access), or, a rep string
 * instruction at pc stopped with iterations left, its own on the watched [chunk, chunk + n).
 * 0 when found, and then on the chunk. */
int locus_comm_soft_access_before(uint64_t pc, void *uc, uint64_t chunk, uint64_t n,
                                  struct locus_comm_access *a);

/* Sizes of hardware address samples (hw backend): the PMU gives the address and the
 * instruction of an access, not its size. locus_comm_decoder_open (normal context, once)
 * readies the decoder; locus_comm_access_size then decodes the instruction at ip (a copy of
 * its bytes) and gives the size of its memory operand in bytes and its LOCUS_AC_STORE /
 * LOCUS_AC_ATOMIC flags. store: the sample is a store (1), a load (0) or either (-1): the
 * operand taken is one that does that. 0 when found; 1 when the instruction has no such
 * memory operand; -1 when it cannot be read or decoded, or the decoder is not open. */
LOCUS_EXPORT int locus_comm_decoder_open(void);
LOCUS_EXPORT int locus_comm_access_size(uint64_t ip, int store, uint32_t *len, uint32_t *flags);
/* Callers of hardware samples in system libraries (after locus_comm_decoder_open): the
 * program's call that led to the sample at `ip`, found by the soft backend's stack scan in
 * the context `uc` of the signal that delivers it, when that context is still in the
 * sampled function; 0 otherwise. The scan keeps to the thread's stack, whose bounds
 * locus_comm_soft_thread_stack takes (once per thread, normal context). */
LOCUS_EXPORT uint64_t locus_comm_sample_caller(uint64_t ip, const void *uc);
LOCUS_EXPORT void locus_comm_soft_thread_stack(void);

/* Tests: resync_info on the code bytes [code, code + n) as if at their own address, for the
 * pc at code + at: the length of the instruction before it (0: none usable), -1 when there
 * is no answer; *target: pc is a branch target in the bytes. */
LOCUS_EXPORT int locus_test_soft_resync(const uint8_t *code, uint64_t n, uint64_t at, int *target);
/* Tests: locus_comm_soft_access_before, with the decoder opened first (-2: none). */
LOCUS_EXPORT int locus_test_soft_access_before(uint64_t pc, void *uc, uint64_t chunk, uint64_t n,
                                               struct locus_comm_access *a);

/* Test-only entry point: decode the instruction at `ip` with the given registers
 * (ucontext_t), no skid correction. 0 when it has a usable memory access. */
LOCUS_EXPORT int locus_test_soft_decode(uint64_t ip, void *uc, uint64_t *addr, uint32_t *len,
                                        uint32_t *flags);
/* Test-only entry point: the sampled access at pc as the sampler decodes it first
 * (skid-corrected, no run ahead, no split read-modify-write): 0 with *a; else the decoder's
 * code, and *clobbered the load that overwrote its own address register, if that was why. */
LOCUS_EXPORT int locus_test_soft_sampled(uint64_t pc, void *uc, struct locus_comm_access *a,
                                         uint64_t *clobbered);
/* Test-only entry point: the sample's access as the sampler takes it before any single step
 * (sampled_access, the run ahead where that found none, moved off the thread's own frame):
 * 0 with *a; else the decoder's code. */
LOCUS_EXPORT int locus_test_soft_sample(uint64_t pc, void *uc, struct locus_comm_access *a);
/* Test-only entry point: the next access from `ip` on, found by interpreting the code
 * without running it (the run ahead of the sampler): 0 with its instruction's address in
 * *at, -1 when the run ahead gives up (the sampler would single-step). */
LOCUS_EXPORT int locus_test_soft_ahead(uint64_t ip, void *uc, uint64_t *at, uint64_t *addr,
                                       uint32_t *len, uint32_t *flags);
/* Test-only entry point: the same run past reads of the thread's own frame (off_frame): the
 * next access off it; -1 when there is none (a store to the frame first). */
LOCUS_EXPORT int locus_test_soft_ahead_frames(uint64_t ip, void *uc, uint64_t *at, uint64_t *addr,
                                              uint32_t *len, uint32_t *flags);

/* Test-only entry point: one check of a thread's measured context-switch rate (adapt): 1
 * when it moves to the other source now (tick: it is on the scheduler's tick, else on the
 * task clock); high is the threshold, dsw the switches counted, *streak the checks in a row
 * that pointed there (updated). */
LOCUS_EXPORT int locus_test_soft_switch_check(int tick, uint64_t rate, uint64_t dsw, uint64_t high,
                                              int *streak);

/* Test-only entry point: whether a thread that started on the tick stays there at its
 * first check (rate: its switches a second of CPU time, over dsw switches; high: the
 * threshold); else it takes the task clock. */
LOCUS_EXPORT int locus_test_soft_stays_on_tick(uint64_t rate, uint64_t dsw, uint64_t high);

/* Test-only entry points (detect.c): the calling thread watches the line of addr as if
 * another thread had just published a store there, on the tick or not (the registers
 * armed, -1 none); the registers armed now, plus 0x100 when the thread has the
 * context-switch counter that ends its watches on the tick. */
LOCUS_EXPORT int locus_test_detect_watch(uint64_t addr, int on_tick);
LOCUS_EXPORT int locus_test_detect_armed(void);

#endif
