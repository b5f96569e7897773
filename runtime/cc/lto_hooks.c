/* The comm/numa exact hooks (clang -fsanitize=thread's __tsan_* calls), to be inlined into
 * the program: `locus cc` with LOCUS_CC_LTO=1 compiles this file with the
 * program's own clang (-O2 -flto, no debug info, no instrumentation) and links it into the
 * program, whose objects it compiles with -flto too. At link time LLVM inlines these hooks
 * into every instrumented access: the model's hit test runs in the program's loop, without
 * a call (liblocus.so still holds the model and everything but the hit test: fast.h).
 *
 * The instruction address of an access: __builtin_return_address(0) would name the caller of
 * the function the hook is inlined into, so each hook takes its own address (lea of the next
 * instruction, a return address in effect). Compiled without debug info, the inlined hook's
 * instructions carry the line of the access they were inlined for: reports name that line. */
#include "../comm/exact/fast.h"

#if defined(__x86_64__)
#define HERE()                                          \
  ({                                                    \
    uint64_t here_;                                     \
    __asm__ volatile("lea 0(%%rip), %0" : "=r"(here_)); \
    here_;                                              \
  })
#elif defined(__aarch64__)
#define HERE()                                        \
  ({                                                  \
    uint64_t here_;                                   \
    __asm__ volatile("adr %0, 1f\n1:" : "=r"(here_)); \
    here_;                                            \
  })
#else
#define HERE() ((uint64_t)__builtin_return_address(0))
#endif

#define INLINE __attribute__((always_inline))

LOCUS_X_TSAN_HOOKS(INLINE, HERE())
