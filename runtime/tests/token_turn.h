/* One turn of a token passed through a word reached by a pointer the spin reloads (a spin
 * on `*p`, as a compiler writes `while (*p != want)` for a global `p`), then the hand-off:
 *   1: mov p(%rip),%rax; mov (%rax),%rax; cmp want,%rax; jne 1b
 *      mov p(%rip),%rax; lea 1(want),%rdx; mov %rdx,(%rax)
 * The time goes to the load that overwrites its own address register. Written in asm so
 * that every compiler and level makes that code. Shared by the runtime's soft-sampler test
 * (threads) and an integration test (processes). */
#ifndef LOCUS_TESTS_TOKEN_TURN_H
#define LOCUS_TESTS_TOKEN_TURN_H

/* *pp: the pointer variable (its own memory: the spin reloads it). */
static inline void token_turn(void *volatile *pp, long want) {
  __asm__ volatile(
      "1: mov %[p], %%rax\n\t"
      "mov (%%rax), %%rax\n\t"
      "cmp %[w], %%rax\n\t"
      "jne 1b\n\t"
      "mov %[p], %%rax\n\t"
      "lea 1(%[w]), %%rdx\n\t"
      "mov %%rdx, (%%rax)"
      :
      : [p] "m"(*pp), [w] "r"(want)
      : "rax", "rdx", "memory", "cc");
}

#endif
