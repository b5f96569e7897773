/* Parsing of perf ring-buffer records for the hw backend. Kept apart from hw.c so the unit
 * test links it alone: no runtime state, no system calls, async-signal-safe. */
#include <linux/perf_event.h>
#include <string.h>

#include "hw.h"

/* Fields whose size depends on the attr (read_format, branch_sample_type, the register
 * masks) or that this backend never asks for: a record with them cannot be walked here. */
#define UNWALKABLE                                                                                \
  (PERF_SAMPLE_READ | PERF_SAMPLE_BRANCH_STACK | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER | \
   PERF_SAMPLE_REGS_INTR | PERF_SAMPLE_PHYS_ADDR | PERF_SAMPLE_AUX | PERF_SAMPLE_CGROUP |         \
   PERF_SAMPLE_DATA_PAGE_SIZE | PERF_SAMPLE_CODE_PAGE_SIZE)

struct reader {
  const unsigned char *p, *end;
};

static int take(struct reader *r, void *out, size_t n) {
  if ((size_t)(r->end - r->p) < n) return -1;
  if (out) memcpy(out, r->p, n);
  r->p += n;
  return 0;
}

/* One PERF_RECORD_SAMPLE body, fields in the order of perf_event_open(2). */
static int parse_sample(const unsigned char *body, size_t len, uint64_t st,
                        struct locus_comm_access *a) {
  struct reader r = {body, body + len};
  uint64_t u64 = 0, data_src = 0;
  uint32_t u32[2];
  memset(a, 0, sizeof *a);
  a->cpu = -1;
  a->len = 8;
  if ((st & PERF_SAMPLE_IDENTIFIER) && take(&r, NULL, 8)) return -1;
  if ((st & PERF_SAMPLE_IP) && take(&r, &a->ip, 8)) return -1;
  if ((st & PERF_SAMPLE_TID) && take(&r, u32, 8)) return -1;
  if ((st & PERF_SAMPLE_TIME) && take(&r, &a->t, 8)) return -1;
  if ((st & PERF_SAMPLE_ADDR) && take(&r, &a->addr, 8)) return -1;
  if ((st & PERF_SAMPLE_ID) && take(&r, NULL, 8)) return -1;
  if ((st & PERF_SAMPLE_STREAM_ID) && take(&r, NULL, 8)) return -1;
  if (st & PERF_SAMPLE_CPU) {
    if (take(&r, u32, 8)) return -1;
    a->cpu = (int)u32[0];
  }
  if ((st & PERF_SAMPLE_PERIOD) && take(&r, NULL, 8)) return -1;
  if (st & PERF_SAMPLE_CALLCHAIN) {
    if (take(&r, &u64, 8) || u64 > (uint64_t)(r.end - r.p) / 8 || take(&r, NULL, u64 * 8))
      return -1;
  }
  if (st & PERF_SAMPLE_RAW) {
    if (take(&r, u32, 4) || take(&r, NULL, u32[0])) return -1;
  }
  if ((st & (PERF_SAMPLE_WEIGHT | PERF_SAMPLE_WEIGHT_STRUCT)) && take(&r, NULL, 8)) return -1;
  if (st & PERF_SAMPLE_DATA_SRC) {
    if (take(&r, &data_src, 8)) return -1;
    union perf_mem_data_src ds = {.val = data_src};
    if (ds.mem_op & PERF_MEM_OP_STORE) a->flags |= LOCUS_AC_STORE;
  }
  return 0;
}

int locus_hw_parse(const void *data, size_t len, uint64_t sample_type,
                   void (*cb)(const struct locus_comm_access *, void *), void *arg) {
  if (sample_type & UNWALKABLE) return -1;
  const unsigned char *p = data, *end = p + len;
  int n = 0;
  while ((size_t)(end - p) >= sizeof(struct perf_event_header)) {
    struct perf_event_header h;
    memcpy(&h, p, sizeof h);
    if (h.size < sizeof h || h.size > (size_t)(end - p)) return -1;
    if (h.type == PERF_RECORD_SAMPLE) {
      struct locus_comm_access a;
      if (parse_sample(p + sizeof h, h.size - sizeof h, sample_type, &a) == 0) {
        cb(&a, arg);
        n++;
      }
    }
    p += h.size;
  }
  return n;
}

uint64_t locus_hw_drain(const void *ring, size_t size, uint64_t tail, uint64_t head,
                        uint64_t sample_type, void (*cb)(const struct locus_comm_access *, void *),
                        void *arg, void *bounce, size_t bounce_size) {
  const unsigned char *base = ring;
  size_t mask = size - 1;
  while (head - tail >= sizeof(struct perf_event_header)) {
    size_t off = (size_t)(tail & mask);
    struct perf_event_header h;
    /* The header itself may straddle the end (records are 8-byte aligned, so only when a
     * producer wrote an odd layout; handle it anyway). */
    size_t first = size - off < sizeof h ? size - off : sizeof h;
    memcpy(&h, base + off, first);
    memcpy((char *)&h + first, base, sizeof h - first);
    if (h.size < sizeof h || h.size > head - tail) return tail;
    if (off + h.size <= size) {
      locus_hw_parse(base + off, h.size, sample_type, cb, arg);
    } else if (h.size <= bounce_size) {
      size_t part = size - off;
      memcpy(bounce, base + off, part);
      memcpy((char *)bounce + part, base, h.size - part);
      locus_hw_parse(bounce, h.size, sample_type, cb, arg);
    }
    tail += h.size;
  }
  return tail;
}
