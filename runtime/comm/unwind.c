/* Unwinding the calling thread's stack from a call, for the frames whose locals the threads
 * it starts may be given (comm/allocs.c, LOCUS_AL_FRAME): a helper of the program that calls
 * pthread_create with its caller's array, std::thread's constructor in libstdc++, a function
 * with an OpenMP region given its caller's array.
 *
 * The call frame information is read from each object's file with pread, never where it is
 * mapped: libgcc's and libunwind's unwinders read .eh_frame_hdr and .eh_frame in memory, and
 * each page they touch, with the kernel's fault-around the 64 KiB around it, then counts in
 * the program's resident memory (stress-ng memthrash: +256 KiB through libgcc's). A frame
 * costs an object lookup (dl_iterate_phdr), a binary search of .eh_frame_hdr's table (one
 * read a step) and two reads (the FDE, its CIE): 10-20 system calls.
 *
 * What a frame may say: its CFA at rsp or rbp plus an offset, or at [rbp + n] (gcc's frames
 * that realign the stack: DW_CFA_def_cfa_expression DW_OP_breg6 n, DW_OP_deref); rbp kept,
 * saved at CFA + n, or at rbp + n (the same frames: DW_CFA_expression r6 DW_OP_breg6 n); the
 * return address at CFA + n. Anything else ends the walk (a CFA in another register, an
 * object without .eh_frame_hdr or whose table is not the linker's usual encoding, the vdso). */
#define _GNU_SOURCE
#include "unwind.h"

#include "ehframe.h"
#include "../core/runtime.h"

#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DW_RBP 6
#define DW_RSP 7
#define MAX_LOADS 8
#define FDE_BYTES 2048 /* an FDE read at once; a longer one ends the walk */
#define CIE_BYTES 512
#define STATES 4 /* DW_CFA_remember_state depth */

/* The object holding a pc, and its file, open for the walk. */
struct uobj {
  uint64_t base;             /* dlpi_addr: a run-time address is base + its vaddr */
  uint64_t text_lo, text_hi; /* the executable segment holding the pc (run time) */
  uint64_t hdr;              /* vaddr of .eh_frame_hdr, 0: none */
  const char *name;          /* dlpi_name ("" for the program) */
  int sys;                   /* locus_system_object */
  int nload;
  uint64_t vaddr[MAX_LOADS], off[MAX_LOADS], filesz[MAX_LOADS];
  int fd;
};

struct find {
  uint64_t pc;
  struct uobj *o;
};

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  struct find *f = arg;
  struct uobj *o = f->o;
  int at = -1;
  for (int i = 0; i < info->dlpi_phnum && at < 0; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uint64_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && f->pc >= lo && f->pc < lo + ph->p_memsz)
      at = i;
  }
  if (at < 0) return 0;
  o->base = info->dlpi_addr;
  o->text_lo = info->dlpi_addr + info->dlpi_phdr[at].p_vaddr;
  o->text_hi = o->text_lo + info->dlpi_phdr[at].p_memsz;
  o->hdr = 0;
  o->name = info->dlpi_name;
  o->sys = locus_system_object(info);
  o->nload = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_GNU_EH_FRAME) {
      o->hdr = ph->p_vaddr;
    } else if (ph->p_type == PT_LOAD && o->nload < MAX_LOADS) {
      o->vaddr[o->nload] = ph->p_vaddr;
      o->off[o->nload] = ph->p_offset;
      o->filesz[o->nload++] = ph->p_filesz;
    }
  }
  return 1;
}

static void obj_close(struct uobj *o) {
  if (o->fd >= 0) syscall(SYS_close, o->fd);
  o->fd = -1;
  o->text_lo = o->text_hi = 0;
}

/* The object holding pc, its file open: 0; -1 when no object holds it; -2 when its call
 * frame information cannot be read (o->sys still says what it is). The last one is kept
 * for the next. */
static int obj_at(struct uobj *o, uint64_t pc) {
  if (o->fd >= 0 && pc >= o->text_lo && pc < o->text_hi) return 0;
  obj_close(o);
  struct find f = {pc, o};
  if (!dl_iterate_phdr(find_cb, &f)) return -1;
  const char *path = o->name && o->name[0] ? o->name : "/proc/self/exe";
  if (!o->hdr || !strchr(path, '/')) return -2; /* (the vdso: no file) */
  long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -2;
  o->fd = (int)fd;
  return 0;
}

/* Up to n bytes of the object's file at vaddr (within its segment): the count read. */
static size_t read_v(const struct uobj *o, uint64_t vaddr, void *buf, size_t n) {
  for (int i = 0; i < o->nload; i++) {
    if (vaddr < o->vaddr[i] || vaddr >= o->vaddr[i] + o->filesz[i]) continue;
    uint64_t room = o->vaddr[i] + o->filesz[i] - vaddr;
    long got =
        syscall(SYS_pread64, o->fd, buf, n < room ? n : room, o->off[i] + vaddr - o->vaddr[i]);
    return got > 0 ? (size_t)got : 0;
  }
  return 0;
}

/* A cursor in bytes read from vaddr `at`. */
struct cur {
  const uint8_t *p, *end, *buf;
  uint64_t at;
  int bad;
};

static uint64_t fixed(struct cur *c, int n) {
  if (c->end - c->p < n) {
    c->bad = 1;
    c->p = c->end;
    return 0;
  }
  uint64_t v = 0;
  memcpy(&v, c->p, (size_t)n);
  c->p += n;
  return v;
}

static uint64_t uleb(struct cur *c) {
  uint64_t v = 0;
  if (locus_leb(&c->p, c->end, 0, &v) != 0) c->bad = 1;
  return v;
}

static int64_t sleb(struct cur *c) {
  uint64_t v = 0;
  if (locus_leb(&c->p, c->end, 1, &v) != 0) c->bad = 1;
  return (int64_t)v;
}

/* A pointer in DWARF's exception-header encoding (DW_EH_PE_*), as a vaddr; datarel from
 * `data`. */
static uint64_t enc_ptr(struct cur *c, uint8_t enc, uint64_t data) {
  uint64_t v = 0;
  int64_t bias = (int64_t)(c->at - (uint64_t)(uintptr_t)c->buf);
  if (locus_eh_ptr(&c->p, c->end, bias, enc, data, &v) != 0) c->bad = 1;
  return v;
}

/* Entry k of an object's .eh_frame_hdr table, by pread (locus_eh_search). */
struct table_at {
  const struct uobj *o;
  uint64_t table;
};
static int table_entry(const void *arg, uint32_t k, int32_t e[2]) {
  const struct table_at *t = arg;
  return read_v(t->o, t->table + (uint64_t)k * 8, e, 8) == 8 ? 0 : -1;
}

/* The FDE's vaddr for vaddr pc, from .eh_frame_hdr's sorted table; 0 if none. */
static uint64_t fde_of(const struct uobj *o, uint64_t pc) {
  uint8_t h[32];
  size_t n = read_v(o, o->hdr, h, sizeof h);
  uint32_t off, count, at;
  if (locus_eh_hdr(h, h + n, (int64_t)(o->hdr - (uint64_t)(uintptr_t)h), &off, &count) != 0)
    return 0;
  struct table_at t = {o, o->hdr + off};
  int32_t e[2];
  if (locus_eh_search(count, (int64_t)(pc - o->hdr), table_entry, &t, &at, e) != 0) return 0;
  return o->hdr + (int64_t)e[1];
}

/* How a register is found in the caller: kept (SAME), saved at CFA + off (AT_CFA), at
 * rbp + off (AT_FP), or not known (NONE: the walk ends if it needs it). */
enum { SAME, AT_CFA, AT_FP, NONE };
struct rule {
  uint8_t how;
  int64_t off;
};
struct row {
  uint8_t cfa_reg; /* DW_RSP, DW_RBP; anything else: not known */
  uint8_t cfa_deref;
  int64_t cfa_off;
  struct rule fp, ra;
};

struct cie {
  uint64_t code_align;
  int64_t data_align;
  uint64_t ra_reg;
  uint8_t fde_enc;
  int z;
  struct row init;
};

static struct rule *rule_of(struct row *r, uint64_t reg, uint64_t ra_reg) {
  return reg == DW_RBP ? &r->fp : reg == ra_reg ? &r->ra : NULL;
}

/* DW_CFA_restore: the rule the CIE's instructions left. */
static struct rule init_rule(const struct cie *ci, uint64_t reg) {
  return reg == DW_RBP ? ci->init.fp : ci->init.ra;
}

/* Runs CFA instructions up to the row for vaddr `target` (all of them for a CIE's: target
 * UINT64_MAX, loc 0): 0, or -1 for one this unwinder does not know. */
static int run_cfa(struct cur *c, const struct cie *ci, struct row *r, uint64_t loc,
                   uint64_t target, uint64_t data) {
  struct row saved[STATES];
  int depth = 0;
  while (c->p < c->end && !c->bad) {
    uint8_t op = *c->p++;
    uint64_t reg = op & 0x3f, delta = 0;
    struct rule *ru;
    switch (op & 0xc0) {
      case 0x40:
        delta = reg;
        goto advance;
      case 0x80:
        if ((ru = rule_of(r, reg, ci->ra_reg)))
          *ru = (struct rule){AT_CFA, (int64_t)uleb(c) * ci->data_align};
        else
          uleb(c);
        continue;
      case 0xc0:
        if ((ru = rule_of(r, reg, ci->ra_reg))) *ru = init_rule(ci, reg);
        continue;
    }
    switch (op) {
      case 0x00: /* nop */
        continue;
      case 0x01: { /* set_loc */
        uint64_t to = enc_ptr(c, ci->fde_enc, data);
        if (to > target) return 0;
        loc = to;
        continue;
      }
      case 0x02:
        delta = fixed(c, 1);
        goto advance;
      case 0x03:
        delta = fixed(c, 2);
        goto advance;
      case 0x04:
        delta = fixed(c, 4);
        goto advance;
      case 0x05:   /* offset_extended */
      case 0x2f: { /* GNU_negative_offset_extended */
        reg = uleb(c);
        int64_t off = (int64_t)uleb(c) * ci->data_align;
        if ((ru = rule_of(r, reg, ci->ra_reg)))
          *ru = (struct rule){AT_CFA, op == 0x2f ? -off : off};
        continue;
      }
      case 0x06: /* restore_extended */
        reg = uleb(c);
        if ((ru = rule_of(r, reg, ci->ra_reg))) *ru = init_rule(ci, reg);
        continue;
      case 0x07: /* undefined */
      case 0x08: /* same_value */
        reg = uleb(c);
        if ((ru = rule_of(r, reg, ci->ra_reg))) *ru = (struct rule){op == 0x08 ? SAME : NONE, 0};
        continue;
      case 0x09: /* register */
        reg = uleb(c);
        uleb(c);
        if ((ru = rule_of(r, reg, ci->ra_reg))) ru->how = NONE;
        continue;
      case 0x0a: /* remember_state */
        if (depth == STATES) return -1;
        saved[depth++] = *r;
        continue;
      case 0x0b: /* restore_state */
        if (!depth) return -1;
        *r = saved[--depth];
        continue;
      case 0x0c: /* def_cfa */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_off = (int64_t)uleb(c);
        r->cfa_deref = 0;
        continue;
      case 0x0d: /* def_cfa_register */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_deref = 0;
        continue;
      case 0x0e: /* def_cfa_offset */
        r->cfa_off = (int64_t)uleb(c);
        continue;
      case 0x0f: { /* def_cfa_expression: DW_OP_breg6 n; DW_OP_deref known */
        uint64_t len = uleb(c);
        const uint8_t *end = c->p + len;
        if (len > (uint64_t)(c->end - c->p)) return -1;
        r->cfa_reg = 0xff;
        if (len >= 3 && c->p[0] == 0x76) {
          struct cur e = {c->p + 1, end, c->buf, c->at, 0};
          int64_t off = sleb(&e);
          if (!e.bad && e.p + 1 == end && *e.p == 0x06)
            r->cfa_reg = DW_RBP, r->cfa_off = off, r->cfa_deref = 1;
        }
        c->p = end;
        continue;
      }
      case 0x10: { /* expression: DW_OP_breg6 n for rbp known (saved at rbp + n) */
        reg = uleb(c);
        uint64_t len = uleb(c);
        const uint8_t *end = c->p + len;
        if (len > (uint64_t)(c->end - c->p)) return -1;
        if ((ru = rule_of(r, reg, ci->ra_reg))) {
          ru->how = NONE;
          struct cur e = {c->p + 1, end, c->buf, c->at, 0};
          if (reg == DW_RBP && len >= 2 && c->p[0] == 0x76) {
            int64_t off = sleb(&e);
            if (!e.bad && e.p == end) *ru = (struct rule){AT_FP, off};
          }
        }
        c->p = end;
        continue;
      }
      case 0x11: /* offset_extended_sf */
        reg = uleb(c);
        if ((ru = rule_of(r, reg, ci->ra_reg)))
          *ru = (struct rule){AT_CFA, sleb(c) * ci->data_align};
        else
          sleb(c);
        continue;
      case 0x12: /* def_cfa_sf */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_off = sleb(c) * ci->data_align;
        r->cfa_deref = 0;
        continue;
      case 0x13: /* def_cfa_offset_sf */
        r->cfa_off = sleb(c) * ci->data_align;
        continue;
      case 0x14: /* val_offset */
      case 0x15: /* val_offset_sf */
        reg = uleb(c);
        if (op == 0x14)
          uleb(c);
        else
          sleb(c);
        if ((ru = rule_of(r, reg, ci->ra_reg))) ru->how = NONE;
        continue;
      case 0x16: { /* val_expression */
        reg = uleb(c);
        uint64_t len = uleb(c);
        if (len > (uint64_t)(c->end - c->p)) return -1;
        c->p += len;
        if ((ru = rule_of(r, reg, ci->ra_reg))) ru->how = NONE;
        continue;
      }
      case 0x2e: /* GNU_args_size */
        uleb(c);
        continue;
      default:
        return -1;
    }
  advance:
    if (loc + delta * ci->code_align > target) return 0;
    loc += delta * ci->code_align;
  }
  return c->bad ? -1 : 0;
}

/* The CIE at vaddr `at`: 0, else -1. Its instructions have run into ci->init. */
static int read_cie(const struct uobj *o, uint64_t at, struct cie *ci) {
  uint8_t b[CIE_BYTES];
  size_t n = read_v(o, at, b, sizeof b);
  struct cur c = {b, b + n, b, at, 0};
  uint64_t len = fixed(&c, 4);
  if (c.bad || len == 0xffffffffu || len + 4 > n || fixed(&c, 4) != 0) return -1;
  c.end = b + 4 + len;
  uint8_t version = (uint8_t)fixed(&c, 1);
  const char *aug = (const char *)c.p;
  const uint8_t *nul = memchr(c.p, 0, (size_t)(c.end - c.p));
  if (!nul || (version != 1 && version != 3) || strstr(aug, "eh")) return -1;
  c.p = nul + 1;
  memset(ci, 0, sizeof *ci);
  ci->code_align = uleb(&c);
  ci->data_align = sleb(&c);
  ci->ra_reg = version == 1 ? fixed(&c, 1) : uleb(&c);
  ci->z = aug[0] == 'z';
  if (ci->z) {
    uint64_t alen = uleb(&c);
    const uint8_t *aend = c.p + alen;
    if (alen > (uint64_t)(c.end - c.p)) return -1;
    for (const char *a = aug + 1; *a && !c.bad; a++) {
      if (*a == 'R') {
        ci->fde_enc = (uint8_t)fixed(&c, 1);
      } else if (*a == 'P') {
        uint8_t penc = (uint8_t)fixed(&c, 1);
        enc_ptr(&c, penc & 0x7f, 0); /* (its value is not needed) */
        c.bad = 0;
      } else if (*a == 'L') {
        fixed(&c, 1);
      } else if (*a != 'S' && *a != 'B') {
        break; /* the length says where the data ends */
      }
    }
    c.p = aend;
  }
  ci->init.cfa_reg = 0xff;
  ci->init.fp.how = SAME;
  ci->init.ra.how = NONE;
  return c.bad || run_cfa(&c, ci, &ci->init, 0, UINT64_MAX, 0) != 0 ? -1 : 0;
}

/* The row of vaddr pc in the object: 0, else -1. */
static int row_of(const struct uobj *o, uint64_t pc, struct row *r) {
  uint64_t fde = fde_of(o, pc);
  if (!fde) return -1;
  uint8_t b[FDE_BYTES];
  size_t n = read_v(o, fde, b, sizeof b);
  struct cur c = {b, b + n, b, fde, 0};
  uint64_t len = fixed(&c, 4);
  if (c.bad || len == 0xffffffffu || len + 4 > n) return -1;
  c.end = b + 4 + len;
  uint64_t cie_at = fde + 4 - fixed(&c, 4);
  struct cie ci;
  if (c.bad || read_cie(o, cie_at, &ci) != 0) return -1;
  uint64_t begin = enc_ptr(&c, ci.fde_enc, 0), range = enc_ptr(&c, ci.fde_enc & 0x0f, 0);
  if (c.bad || pc < begin || pc - begin >= range) return -1;
  if (ci.z) {
    uint64_t alen = uleb(&c);
    if (alen > (uint64_t)(c.end - c.p)) return -1;
    c.p += alen;
  }
  *r = ci.init;
  return run_cfa(&c, &ci, r, begin, pc, 0);
}

static int load(uint64_t addr, uint64_t lo, uint64_t hi, uint64_t *v) {
  if (addr < lo || addr > hi - 8 || (addr & 7)) return -1;
  *v = *(const uint64_t *)(uintptr_t)addr;
  return 0;
}

int locus_unwind(struct locus_uframe *f, int max, uint64_t stack_hi) {
  struct uobj o = {.fd = -1};
  uint64_t lo = f[0].sp;
  int n = 1;
  for (; n <= max; n++) {
    struct locus_uframe *in = &f[n - 1];
    struct row r;
    /* (a return address: the call is the instruction before it) */
    int found = in->pc < 2 ? -1 : obj_at(&o, in->pc - 1);
    if (found != -1) in->sys = o.sys;
    if (n == max || found != 0 || row_of(&o, in->pc - 1 - o.base, &r) != 0) break;
    uint64_t cfa;
    if (r.cfa_reg == DW_RSP && !r.cfa_deref)
      cfa = in->sp + (uint64_t)r.cfa_off;
    else if (r.cfa_reg == DW_RBP && !r.cfa_deref)
      cfa = in->fp + (uint64_t)r.cfa_off;
    else if (r.cfa_reg != DW_RBP || load(in->fp + (uint64_t)r.cfa_off, lo, stack_hi, &cfa) != 0)
      break;
    struct locus_uframe *up = &f[n];
    if (cfa <= in->sp || cfa > stack_hi || r.ra.how != AT_CFA ||
        load(cfa + (uint64_t)r.ra.off, lo, stack_hi, &up->pc) != 0 || !up->pc)
      break;
    up->sp = cfa;
    up->fp = in->fp;
    up->sys = 1; /* (until its object is found) */
    if ((r.fp.how == AT_CFA && load(cfa + (uint64_t)r.fp.off, lo, stack_hi, &up->fp) != 0) ||
        (r.fp.how == AT_FP && load(in->fp + (uint64_t)r.fp.off, lo, stack_hi, &up->fp) != 0) ||
        r.fp.how == NONE)
      break;
  }
  obj_close(&o);
  return n;
}
