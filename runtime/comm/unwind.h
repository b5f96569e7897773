/* Unwinding the calling thread's own stack from a call (comm/unwind.c). */
#ifndef LOCUS_COMM_UNWIND_H
#define LOCUS_COMM_UNWIND_H

#include <stdint.h>

/* A frame at a call it makes: its stack pointer (the callee's canonical frame address), its
 * frame pointer (rbp), the call's return address (a pc in the frame's function), and
 * whether that pc is in a system object (locus_system_object; 1 where no object holds it). */
struct locus_uframe {
  uint64_t sp, fp, pc;
  int sys;
};

/* f[0] given (its sp, fp and pc), a frame of the calling thread still on its stack (below
 * stack_hi): fills f[1..] with its callers, up to max frames in all, from the call frame
 * information of each object's .eh_frame, read from the object's file, and each frame's
 * `sys`. Returns the frames in f (>= 1). Normal context only (opens files); x86-64. */
int locus_unwind(struct locus_uframe *f, int max, uint64_t stack_hi);

#endif
