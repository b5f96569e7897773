/* Interposers for the OpenMP runtime's lock entry points: the omp_*_lock API (C and the
 * gfortran `_` symbols) and the GOMP_critical / GOMP_barrier calls GCC emits. GCC's libgomp
 * has no OMPT, so these are the points a preload can see (see docs/lenses/locks.md). */
#define _GNU_SOURCE
#include <errno.h>

#include "../comm/allocs.h"
#include "../core/real.h"
#include "../locks/locks.h"

#define SITE ((uint64_t)(uintptr_t)__builtin_return_address(0))
/* The unnamed `#pragma omp critical` is one lock for the whole program. */
#define UNNAMED_CRITICAL ((void *)1)

static int omp_try(void *l) { return REAL(omp_test_lock, "omp_test_lock")(l) ? 0 : EBUSY; }
static int omp_block(void *l, const void *a) {
  (void)a;
  REAL(omp_set_lock, "omp_set_lock")(l);
  return 0;
}
static int nest_try(void *l) {
  return REAL(omp_test_nest_lock, "omp_test_nest_lock")(l) ? 0 : EBUSY;
}
static int nest_block(void *l, const void *a) {
  (void)a;
  REAL(omp_set_nest_lock, "omp_set_nest_lock")(l);
  return 0;
}
static int f_try(void *l) { return REAL(omp_test_lock_, "omp_test_lock_")(l) ? 0 : EBUSY; }
static int f_block(void *l, const void *a) {
  (void)a;
  REAL(omp_set_lock_, "omp_set_lock_")(l);
  return 0;
}
static int fnest_try(void *l) {
  return REAL(omp_test_nest_lock_, "omp_test_nest_lock_")(l) ? 0 : EBUSY;
}
static int fnest_block(void *l, const void *a) {
  (void)a;
  REAL(omp_set_nest_lock_, "omp_set_nest_lock_")(l);
  return 0;
}

#define SET(name, kind, try_fn, block_fn)                          \
  LOCUS_EXPORT void name(void *l) {                                \
    struct locus_self *me = locus_locks_self();                    \
    if (!me) {                                                     \
      block_fn(l, NULL);                                           \
      return;                                                      \
    }                                                              \
    locus_lock_acquire(me, l, kind, SITE, try_fn, block_fn, NULL); \
  }
#define UNSET(name, field)          \
  LOCUS_EXPORT void name(void *l) { \
    locus_lock_release(l);          \
    REAL(field, #name)(l);          \
    locus_lock_released();          \
  }
#define TEST(name, field, kind, try_fn)                    \
  LOCUS_EXPORT int name(void *l) {                         \
    struct locus_self *me = locus_locks_self();            \
    if (!me) return REAL(field, #name)(l);                 \
    return locus_lock_try(me, l, kind, SITE, try_fn) == 0; \
  }

SET(omp_set_lock, LOCUS_LK_OMP_LOCK, omp_try, omp_block)
UNSET(omp_unset_lock, omp_unset_lock)
SET(omp_set_nest_lock, LOCUS_LK_OMP_NEST_LOCK, nest_try, nest_block)
UNSET(omp_unset_nest_lock, omp_unset_nest_lock)
SET(omp_set_lock_, LOCUS_LK_OMP_LOCK, f_try, f_block)
UNSET(omp_unset_lock_, omp_unset_lock_)
SET(omp_set_nest_lock_, LOCUS_LK_OMP_NEST_LOCK, fnest_try, fnest_block)
UNSET(omp_unset_nest_lock_, omp_unset_nest_lock_)

/* omp_test_lock returns true on success; omp_test_nest_lock the new nesting depth. The
 * trylock path records them; their results are recomputed as booleans, which is what
 * callers test in practice. */
TEST(omp_test_lock, omp_test_lock, LOCUS_LK_OMP_LOCK, omp_try)
TEST(omp_test_lock_, omp_test_lock_, LOCUS_LK_OMP_LOCK, f_try)

static void critical_start(void *unused) {
  (void)unused;
  REAL(gomp_critical_start, "GOMP_critical_start")();
}
static void critical_name_start(void *pptr) {
  REAL(gomp_critical_name_start, "GOMP_critical_name_start")(pptr);
}

LOCUS_EXPORT void GOMP_critical_start(void) {
  struct locus_self *me = locus_locks_self();
  if (!me) {
    REAL(gomp_critical_start, "GOMP_critical_start")();
    return;
  }
  locus_lock_blind(me, UNNAMED_CRITICAL, LOCUS_LK_OMP_CRITICAL, SITE, critical_start, NULL);
}

LOCUS_EXPORT void GOMP_critical_end(void) {
  locus_lock_release(UNNAMED_CRITICAL);
  REAL(gomp_critical_end, "GOMP_critical_end")();
  locus_lock_released();
}

LOCUS_EXPORT void GOMP_critical_name_start(void **pptr) {
  struct locus_self *me = locus_locks_self();
  if (!me) {
    REAL(gomp_critical_name_start, "GOMP_critical_name_start")(pptr);
    return;
  }
  locus_lock_blind(me, pptr, LOCUS_LK_OMP_CRITICAL, SITE, critical_name_start, pptr);
}

LOCUS_EXPORT void GOMP_critical_name_end(void **pptr) {
  locus_lock_release(pptr);
  REAL(gomp_critical_name_end, "GOMP_critical_name_end")(pptr);
  locus_lock_released();
}

LOCUS_EXPORT void GOMP_barrier(void) {
  struct locus_self *me = locus_locks_self();
  if (!me) {
    REAL(gomp_barrier, "GOMP_barrier")();
    return;
  }
  uint64_t t;
  locus_wait_begin(me, &t);
  REAL(gomp_barrier, "GOMP_barrier")();
  locus_wait_end(me, LOCUS_LK_OMP_BARRIER, NULL, 0, SITE, t, 0);
}

/* OpenMP parallel regions as GCC lowers them: the region's body is outlined, and the
 * encountering function hands the addresses of its shared locals to it (in `data`), so the
 * region's threads reach that function's frame, and its callers' where it was given their
 * arrays. The frames are recorded (comm lens: LOCUS_AL_FRAME) so that the report can name
 * those locals; then the call goes on. */
typedef void (*omp_fn)(void *);
#define PARALLEL(name, params, args)                                            \
  LOCUS_EXPORT void name params {                                               \
    static void(*next) params;                                                  \
    LOCUS_CALLER_FRAMES();                                                      \
    if (!next) next = (__typeof__(next))locus_real_need((void **)&next, #name); \
    next args;                                                                  \
  }
#define LOOP_PARAMS \
  (omp_fn fn, void *data, unsigned n, long start, long end, long incr, long chunk, unsigned flags)
#define LOOP_ARGS (fn, data, n, start, end, incr, chunk, flags)
#define RUNTIME_PARAMS \
  (omp_fn fn, void *data, unsigned n, long start, long end, long incr, unsigned flags)
#define RUNTIME_ARGS (fn, data, n, start, end, incr, flags)

PARALLEL(GOMP_parallel, (omp_fn fn, void *data, unsigned n, unsigned flags), (fn, data, n, flags))
PARALLEL(GOMP_parallel_start, (omp_fn fn, void *data, unsigned n), (fn, data, n))
PARALLEL(GOMP_parallel_sections,
         (omp_fn fn, void *data, unsigned n, unsigned count, unsigned flags),
         (fn, data, n, count, flags))
PARALLEL(GOMP_parallel_loop_static, LOOP_PARAMS, LOOP_ARGS)
PARALLEL(GOMP_parallel_loop_dynamic, LOOP_PARAMS, LOOP_ARGS)
PARALLEL(GOMP_parallel_loop_guided, LOOP_PARAMS, LOOP_ARGS)
PARALLEL(GOMP_parallel_loop_nonmonotonic_dynamic, LOOP_PARAMS, LOOP_ARGS)
PARALLEL(GOMP_parallel_loop_nonmonotonic_guided, LOOP_PARAMS, LOOP_ARGS)
PARALLEL(GOMP_parallel_loop_runtime, RUNTIME_PARAMS, RUNTIME_ARGS)
PARALLEL(GOMP_parallel_loop_nonmonotonic_runtime, RUNTIME_PARAMS, RUNTIME_ARGS)
PARALLEL(GOMP_parallel_loop_maybe_nonmonotonic_runtime, RUNTIME_PARAMS, RUNTIME_ARGS)

/* LLVM's OpenMP runtime (libomp: clang, Intel's icx and ifx, AMD's AOCC; Intel's libiomp5)
 * opens a region with __kmpc_fork_call(loc, argc, microtask, ...), the shared variables'
 * addresses following as variable arguments, which C cannot pass on. So the interposer is
 * a stub in assembly (STUB): it keeps the argument registers (and %al, the count of vector
 * registers a variadic call passes, with xmm0-7), records its caller's frame as the
 * interposers above do (FRAME's function, which also finds the real function), and jumps
 * to the real function with the registers and the stack as the caller left them.
 *
 * The calls that start tasks take the same stub: GOMP_task's parameters changed between
 * GCC's versions (priority, detach), and a jump passes on whatever its caller passed. A
 * task is given the addresses of its creator's shared locals (`#pragma omp task
 * shared(sums)`), which the thread that runs it reaches: its caller's frame is recorded,
 * alone (locus_allocs_task_frame). */
#define FRAME(fn, record, real)                                                \
  LOCUS_HIDDEN void *fn##_next; /* the real function (read by the stub too) */ \
  void *fn(uint64_t cfa, uint64_t fp, uint64_t site);                          \
  void *fn(uint64_t cfa, uint64_t fp, uint64_t site) {                         \
    record(cfa, fp, site);                                                     \
    return fn##_next ? fn##_next : locus_real_need(&fn##_next, real);          \
  }

/* A task stub's way around the frame function once no more task frames are recorded
 * (locus_allocs_task_frames_done): a jump to the real function, which the frame function
 * found at the first call. A task of a few nanoseconds (a recursion's undeferred `if(0)`
 * tasks) would otherwise pay for the registers' save and restore at each call. */
#define TASK_FAST(fn)                                \
  "  cmpb $0, locus_allocs_task_frames_done(%rip)\n" \
  "  je 1f\n"                                        \
  "  mov " #fn                                       \
  "_next(%rip), %r11\n"                              \
  "  test %r11, %r11\n"                              \
  "  jz 1f\n"                                        \
  "  jmp *%r11\n"                                    \
  "1:\n"

/* clang-format off */
#define STUB(name, fn, fast)                                                                 \
  __asm__(".text\n"                                                                          \
          ".globl " #name "\n"                                                               \
          ".type " #name ", @function\n"                                                     \
          #name ":\n"                                                                        \
          ".cfi_startproc\n"                                                                \
          "  endbr64\n" /* (a landing pad where indirect branches are tracked; a no-op elsewhere) */ \
          fast                                                                               \
          "  push %rbp\n"                                                                    \
          ".cfi_def_cfa_offset 16\n"                                                         \
          ".cfi_offset %rbp, -16\n"                                                          \
          "  mov %rsp, %rbp\n"                                                               \
          ".cfi_def_cfa_register %rbp\n"                                                     \
          "  sub $192, %rsp\n" /* (16-byte aligned for the call) */                          \
          "  mov %rdi, 0(%rsp)\n"                                                            \
          "  mov %rsi, 8(%rsp)\n"                                                            \
          "  mov %rdx, 16(%rsp)\n"                                                           \
          "  mov %rcx, 24(%rsp)\n"                                                           \
          "  mov %r8, 32(%rsp)\n"                                                            \
          "  mov %r9, 40(%rsp)\n"                                                            \
          "  mov %rax, 48(%rsp)\n"                                                           \
          "  movdqu %xmm0, 64(%rsp)\n"                                                       \
          "  movdqu %xmm1, 80(%rsp)\n"                                                       \
          "  movdqu %xmm2, 96(%rsp)\n"                                                       \
          "  movdqu %xmm3, 112(%rsp)\n"                                                      \
          "  movdqu %xmm4, 128(%rsp)\n"                                                      \
          "  movdqu %xmm5, 144(%rsp)\n"                                                      \
          "  movdqu %xmm6, 160(%rsp)\n"                                                      \
          "  movdqu %xmm7, 176(%rsp)\n"                                                      \
          "  lea 16(%rbp), %rdi\n" /* the caller's stack pointer at the call */              \
          "  mov (%rbp), %rsi\n"   /* its frame pointer */                                   \
          "  mov 8(%rbp), %rdx\n"  /* the return address */                                  \
          "  call " #fn "\n"                                                                 \
          "  mov %rax, %r11\n"                                                               \
          "  mov 0(%rsp), %rdi\n"                                                            \
          "  mov 8(%rsp), %rsi\n"                                                            \
          "  mov 16(%rsp), %rdx\n"                                                           \
          "  mov 24(%rsp), %rcx\n"                                                           \
          "  mov 32(%rsp), %r8\n"                                                            \
          "  mov 40(%rsp), %r9\n"                                                            \
          "  mov 48(%rsp), %rax\n"                                                           \
          "  movdqu 64(%rsp), %xmm0\n"                                                       \
          "  movdqu 80(%rsp), %xmm1\n"                                                       \
          "  movdqu 96(%rsp), %xmm2\n"                                                       \
          "  movdqu 112(%rsp), %xmm3\n"                                                      \
          "  movdqu 128(%rsp), %xmm4\n"                                                      \
          "  movdqu 144(%rsp), %xmm5\n"                                                      \
          "  movdqu 160(%rsp), %xmm6\n"                                                      \
          "  movdqu 176(%rsp), %xmm7\n"                                                      \
          "  leave\n"                                                                        \
          ".cfi_def_cfa %rsp, 8\n"                                                           \
          "  jmp *%r11\n"                                                                    \
          ".cfi_endproc\n"                                                                   \
          ".size " #name ", .-" #name "\n")
/* clang-format on */

FRAME(locus_kmpc_frame, locus_allocs_frames, "__kmpc_fork_call")
STUB(__kmpc_fork_call, locus_kmpc_frame, "");
#define TASK(name, fn)                      \
  FRAME(fn, locus_allocs_task_frame, #name) \
  STUB(name, fn, TASK_FAST(fn));
TASK(GOMP_task, locus_gomp_task_frame)
TASK(GOMP_taskloop, locus_gomp_taskloop_frame)
TASK(GOMP_taskloop_ull, locus_gomp_taskloop_ull_frame)
TASK(__kmpc_omp_task, locus_kmpc_task_frame)
TASK(__kmpc_omp_task_with_deps, locus_kmpc_task_deps_frame)
TASK(__kmpc_taskloop, locus_kmpc_taskloop_frame)
