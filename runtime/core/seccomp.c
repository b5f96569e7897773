/* Whether a seccomp filter the program installs lets the runtime go on recording.
 *
 * The filter is a classic BPF program over struct seccomp_data (system call number,
 * architecture, instruction pointer, arguments). It is run here, before the kernel gets it,
 * for every system call the runtime makes after start-up: the runtime goes on when each
 * verdict the filter can reach is one it survives (ALLOW, LOG, or ERRNO: a refused call drops
 * a record or leaves a sampler unstarted, and every call's failure is handled), whatever the
 * arguments and the calling address: a test on those follows both ways. Otherwise (KILL,
 * TRAP, TRACE, USER_NOTIF on a path, a program the kernel will refuse) the process's
 * recording ends before the filter (locus_before_sandbox). So a deny-list (QEMU's -sandbox,
 * a container's profile) keeps the process recorded, and an allow-list (stress-ng's,
 * man-db's, whose default is TRAP) stops it. */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "runtime.h"

/* The runtime's system calls after start-up, in any lens (strace of recordings; the
 * program's own are its business). */
static const int16_t runtime_calls[] = {
    SYS_read,
    SYS_write,
    SYS_pread64,
    SYS_pwrite64,
    SYS_openat,
    SYS_close,
    SYS_newfstatat,
    SYS_fstat,
    SYS_lseek,
    SYS_readlink,
    SYS_getdents64,
    SYS_mkdirat,
    SYS_fcntl,
    SYS_dup3,
    SYS_fallocate,
    SYS_ftruncate,
    SYS_ioctl,
    SYS_mmap,
    SYS_munmap,
    SYS_mremap,
    SYS_mprotect,
    SYS_madvise,
    SYS_mincore,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_sigaltstack,
    SYS_tgkill,
    SYS_getpid,
    SYS_gettid,
    SYS_getppid,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_prlimit64,
    SYS_getrusage,
    SYS_clock_gettime,
    SYS_sched_yield,
    SYS_sched_getaffinity,
    SYS_getcpu,
    SYS_futex,
    SYS_perf_event_open,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_delete,
    SYS_move_pages,
    SYS_get_mempolicy,
    SYS_process_vm_readv,
};

#define MAX_INSNS 4096 /* BPF_MAXINSNS */

static int survivable(uint32_t v) {
  uint32_t act = v & SECCOMP_RET_ACTION_FULL;
  return act == SECCOMP_RET_ALLOW || act == SECCOMP_RET_LOG || act == SECCOMP_RET_ERRNO;
}

/* What is known of the machine at an instruction: A, X and the scratch words, each a value
 * or unknown (read from the arguments or the calling address, or merged from paths that
 * disagree). */
struct absval {
  uint32_t a, x, mem[BPF_MEMWORDS];
  uint16_t mem_known;
  uint8_t a_known, x_known, reached;
};

static void merge(struct absval *to, const struct absval *from) {
  if (!to->reached) {
    *to = *from;
    to->reached = 1;
    return;
  }
  to->a_known = to->a_known && from->a_known && to->a == from->a;
  to->x_known = to->x_known && from->x_known && to->x == from->x;
  for (int i = 0; i < BPF_MEMWORDS; i++)
    if (to->mem[i] != from->mem[i] || !(from->mem_known & (1u << i)))
      to->mem_known &= (uint16_t) ~(1u << i);
}

/* Whether every verdict the filter can reach for system call nr on x86-64, whatever the
 * arguments and the calling address, is one the runtime survives. Jumps only go forward, so
 * one pass in order visits each instruction after all the paths into it (st: len entries). A
 * program the kernel refuses (it checks the same things) is not. */
static int all_survivable(const struct sock_filter *f, unsigned len, int nr, struct absval *st) {
  memset(st, 0, len * sizeof *st);
  st[0].reached = 1;
  for (unsigned pc = 0; pc < len; pc++) {
    struct absval v = st[pc];
    if (!v.reached) continue;
    const struct sock_filter *i = &f[pc];
    uint32_t k = i->k;
    int next = 1; /* falls through to pc + 1 */
    switch (i->code) {
      case BPF_LD | BPF_W | BPF_ABS:
        if (k >= sizeof(struct seccomp_data) || k % 4) return 0;
        v.a_known =
            k == offsetof(struct seccomp_data, nr) || k == offsetof(struct seccomp_data, arch);
        v.a = k == offsetof(struct seccomp_data, nr) ? (uint32_t)nr : AUDIT_ARCH_X86_64;
        break;
      case BPF_LD | BPF_W | BPF_LEN:
        v.a = sizeof(struct seccomp_data), v.a_known = 1;
        break;
      case BPF_LDX | BPF_W | BPF_LEN:
        v.x = sizeof(struct seccomp_data), v.x_known = 1;
        break;
      case BPF_LD | BPF_IMM:
        v.a = k, v.a_known = 1;
        break;
      case BPF_LDX | BPF_IMM:
        v.x = k, v.x_known = 1;
        break;
      case BPF_MISC | BPF_TAX:
        v.x = v.a, v.x_known = v.a_known;
        break;
      case BPF_MISC | BPF_TXA:
        v.a = v.x, v.a_known = v.x_known;
        break;
      case BPF_LD | BPF_MEM:
      case BPF_LDX | BPF_MEM:
      case BPF_ST:
      case BPF_STX: {
        if (k >= BPF_MEMWORDS) return 0;
        uint16_t bit = (uint16_t)(1u << k);
        if (i->code == (BPF_LD | BPF_MEM)) v.a = v.mem[k], v.a_known = (v.mem_known & bit) != 0;
        if (i->code == (BPF_LDX | BPF_MEM)) v.x = v.mem[k], v.x_known = (v.mem_known & bit) != 0;
        if (i->code == BPF_ST || i->code == BPF_STX) {
          int known = i->code == BPF_ST ? v.a_known : v.x_known;
          v.mem[k] = i->code == BPF_ST ? v.a : v.x;
          v.mem_known = known ? (uint16_t)(v.mem_known | bit) : (uint16_t)(v.mem_known & ~bit);
        }
        break;
      }
      case BPF_RET | BPF_K:
        if (!survivable(k)) return 0;
        next = 0;
        break;
      case BPF_RET | BPF_A:
        if (!v.a_known || !survivable(v.a)) return 0;
        next = 0;
        break;
      case BPF_JMP | BPF_JA:
        if (k >= len - pc - 1) return 0;
        merge(&st[pc + 1 + k], &v);
        next = 0;
        break;
      default:
        if (BPF_CLASS(i->code) == BPF_ALU) {
          int src_known = BPF_SRC(i->code) == BPF_X ? v.x_known : 1;
          uint32_t y = BPF_SRC(i->code) == BPF_X ? v.x : k, a = v.a;
          switch (BPF_OP(i->code)) {
            case BPF_ADD:
              a += y;
              break;
            case BPF_SUB:
              a -= y;
              break;
            case BPF_MUL:
              a *= y;
              break;
            case BPF_DIV:
            case BPF_MOD:
              /* A zero divisor ends the filter with 0, which kills the thread. */
              if (!src_known || !y) return 0;
              a = BPF_OP(i->code) == BPF_DIV ? a / y : a % y;
              break;
            case BPF_AND:
              a &= y;
              break;
            case BPF_OR:
              a |= y;
              break;
            case BPF_XOR:
              a ^= y;
              break;
            case BPF_LSH:
              a = y < 32 ? a << y : 0;
              break;
            case BPF_RSH:
              a = y < 32 ? a >> y : 0;
              break;
            case BPF_NEG:
              a = -a;
              break;
            default:
              return 0;
          }
          if (BPF_OP(i->code) != BPF_NEG) v.a_known = v.a_known && src_known;
          v.a = a;
          break;
        }
        if (BPF_CLASS(i->code) == BPF_JMP) {
          int known = v.a_known && (BPF_SRC(i->code) == BPF_X ? v.x_known : 1);
          uint32_t y = BPF_SRC(i->code) == BPF_X ? v.x : k;
          int t;
          switch (BPF_OP(i->code)) {
            case BPF_JEQ:
              t = v.a == y;
              break;
            case BPF_JGT:
              t = v.a > y;
              break;
            case BPF_JGE:
              t = v.a >= y;
              break;
            case BPF_JSET:
              t = (v.a & y) != 0;
              break;
            default:
              return 0;
          }
          if (i->jt >= len - pc - 1 || i->jf >= len - pc - 1) return 0;
          if (!known || t) merge(&st[pc + 1 + i->jt], &v);
          if (!known || !t) merge(&st[pc + 1 + i->jf], &v);
          next = 0;
          break;
        }
        return 0; /* absolute loads of other widths, indirect loads */
    }
    if (next) {
      if (pc + 1 >= len) return 0; /* falls off the end */
      merge(&st[pc + 1], &v);
    }
  }
  return 1;
}

/* n bytes at the program's address a into buf, or -1 (a bad address is the kernel's EFAULT
 * to give, not a fault of ours). */
static int copy_in(const void *a, void *buf, size_t n) {
  struct iovec local = {buf, n}, remote = {(void *)a, n};
  return syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) == (long)n ? 0 : -1;
}

static int harmless(const void *fprog) {
  struct sock_fprog p;
  if (!fprog || copy_in(fprog, &p, sizeof p) != 0 || p.len == 0 || p.len > MAX_INSNS) return 0;
  size_t code = p.len * sizeof(struct sock_filter), bytes = code + p.len * sizeof(struct absval);
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 0;
  struct sock_filter *f = m;
  struct absval *st = (struct absval *)((char *)m + code);
  int ok = copy_in(p.filter, f, code) == 0;
  for (size_t i = 0; ok && i < sizeof runtime_calls / sizeof runtime_calls[0]; i++)
    ok = all_survivable(f, p.len, runtime_calls[i], st);
  munmap(m, bytes);
  return ok;
}

void locus_seccomp_before(long op, const void *fprog) {
  if (!locus_enabled) return;
  if (op == SECCOMP_SET_MODE_STRICT || (op == SECCOMP_SET_MODE_FILTER && !harmless(fprog)))
    locus_before_sandbox();
}
