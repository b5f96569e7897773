/* Unit test of the hw backend's ring-buffer parser with synthetic perf records: field
 * order, store/load from data_src, records of other types skipped, malformed records,
 * and records that wrap around the end of the ring. The parser is linked in directly
 * (no PMU is needed, and none exists on the development machines).
 * Usage: test_hw_parse [LIBLOCUS] (the argument is ignored). */
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/hw/hw_parse.c"

#define ST                                                                                    \
  (PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ADDR | PERF_SAMPLE_CPU | \
   PERF_SAMPLE_DATA_SRC | PERF_SAMPLE_WEIGHT)

static int failures;
#define CHECK(c)                                               \
  do {                                                         \
    if (!(c)) {                                                \
      fprintf(stderr, "test_hw_parse:%d: %s\n", __LINE__, #c); \
      failures++;                                              \
    }                                                          \
  } while (0)

struct got {
  struct locus_comm_access a[16];
  int n;
};

static void collect(const struct locus_comm_access *a, void *arg) {
  struct got *g = arg;
  if (g->n < 16) g->a[g->n++] = *a;
}

static unsigned char *put64(unsigned char *p, uint64_t v) {
  memcpy(p, &v, 8);
  return p + 8;
}

static unsigned char *put32x2(unsigned char *p, uint32_t a, uint32_t b) {
  memcpy(p, &a, 4);
  memcpy(p + 4, &b, 4);
  return p + 8;
}

static uint64_t data_src(int op) {
  union perf_mem_data_src d = {.val = 0};
  d.mem_op = (uint64_t)op;
  d.mem_lvl = PERF_MEM_LVL_HIT | PERF_MEM_LVL_L1;
  return d.val;
}

/* A PERF_RECORD_SAMPLE laid out for ST (plus IDENTIFIER/CALLCHAIN/RAW when asked). */
static size_t sample(unsigned char *buf, uint64_t st, uint64_t ip, uint64_t addr, uint32_t cpu,
                     uint64_t t, int op) {
  unsigned char *p = buf + sizeof(struct perf_event_header);
  if (st & PERF_SAMPLE_IDENTIFIER) p = put64(p, 77);
  p = put64(p, ip);
  p = put32x2(p, 1234, 1235);
  p = put64(p, t);
  p = put64(p, addr);
  p = put32x2(p, cpu, 0);
  if (st & PERF_SAMPLE_CALLCHAIN) {
    p = put64(p, 3);
    for (int i = 0; i < 3; i++) p = put64(p, 0x1000u + (unsigned)i);
  }
  if (st & PERF_SAMPLE_RAW) {
    /* u32 size + data, padded so the record stays 8-byte aligned */
    uint32_t n = 12;
    memcpy(p, &n, 4);
    memset(p + 4, 0xab, n);
    p += 4 + n;
  }
  p = put64(p, 42); /* weight */
  p = put64(p, data_src(op));
  struct perf_event_header h = {PERF_RECORD_SAMPLE, 0, (uint16_t)(p - buf)};
  memcpy(buf, &h, sizeof h);
  return h.size;
}

static size_t other(unsigned char *buf, uint32_t type, uint16_t size) {
  struct perf_event_header h = {type, 0, size};
  memset(buf, 0x5a, size);
  memcpy(buf, &h, sizeof h);
  return size;
}

static void test_linear(void) {
  unsigned char buf[1024];
  size_t n = 0;
  n += sample(buf + n, ST, 0x401000, 0x7f0000001000, 1, 5000, PERF_MEM_OP_LOAD);
  n += other(buf + n, PERF_RECORD_MMAP2, 72);
  n += other(buf + n, PERF_RECORD_LOST, 24);
  n += sample(buf + n, ST, 0x401010, 0x7f0000001008, 0, 6000, PERF_MEM_OP_STORE);
  n += other(buf + n, PERF_RECORD_THROTTLE, 24);
  struct got g = {.n = 0};
  CHECK(locus_hw_parse(buf, n, ST, collect, &g) == 2);
  CHECK(g.n == 2);
  CHECK(g.a[0].ip == 0x401000 && g.a[0].addr == 0x7f0000001000 && g.a[0].cpu == 1);
  CHECK(g.a[0].t == 5000 && g.a[0].len == 8 && !(g.a[0].flags & LOCUS_AC_STORE));
  CHECK(g.a[1].ip == 0x401010 && g.a[1].addr == 0x7f0000001008 && g.a[1].cpu == 0);
  CHECK(g.a[1].t == 6000 && (g.a[1].flags & LOCUS_AC_STORE));
}

static void test_optional_fields(void) {
  uint64_t st = ST | PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_CALLCHAIN | PERF_SAMPLE_RAW;
  unsigned char buf[512];
  size_t n = sample(buf, st, 0x500000, 0xdead0000, 3, 9, PERF_MEM_OP_STORE);
  struct got g = {.n = 0};
  CHECK(locus_hw_parse(buf, n, st, collect, &g) == 1);
  CHECK(g.n == 1 && g.a[0].ip == 0x500000 && g.a[0].addr == 0xdead0000 && g.a[0].cpu == 3);
  CHECK(g.n == 1 && (g.a[0].flags & LOCUS_AC_STORE));
  /* Without PERF_SAMPLE_CPU the cpu is unknown. */
  uint64_t st2 = PERF_SAMPLE_IP | PERF_SAMPLE_ADDR;
  unsigned char *p = buf + 8;
  p = put64(p, 0x600000);
  p = put64(p, 0xbeef00);
  struct perf_event_header h = {PERF_RECORD_SAMPLE, 0, (uint16_t)(p - buf)};
  memcpy(buf, &h, sizeof h);
  g.n = 0;
  CHECK(locus_hw_parse(buf, h.size, st2, collect, &g) == 1);
  CHECK(g.n == 1 && g.a[0].cpu == -1 && g.a[0].addr == 0xbeef00 && g.a[0].t == 0);
}

static void test_malformed(void) {
  unsigned char buf[512];
  size_t n = sample(buf, ST, 1, 2, 0, 3, PERF_MEM_OP_LOAD);
  /* A record shorter than its header, then one running past the end. */
  struct perf_event_header bad = {PERF_RECORD_SAMPLE, 0, 4};
  memcpy(buf + n, &bad, sizeof bad);
  struct got g = {.n = 0};
  CHECK(locus_hw_parse(buf, n + 8, ST, collect, &g) == -1);
  CHECK(g.n == 1);
  bad.size = 200;
  memcpy(buf + n, &bad, sizeof bad);
  g.n = 0;
  CHECK(locus_hw_parse(buf, n + 8, ST, collect, &g) == -1 && g.n == 1);
  /* A sample whose body is shorter than its sample_type needs is skipped, not read past. */
  struct perf_event_header shortrec = {PERF_RECORD_SAMPLE, 0, 24};
  memcpy(buf, &shortrec, sizeof shortrec);
  n = 24 + sample(buf + 24, ST, 7, 8, 0, 9, PERF_MEM_OP_LOAD);
  g.n = 0;
  CHECK(locus_hw_parse(buf, n, ST, collect, &g) == 1 && g.n == 1 && g.a[0].ip == 7);
  /* sample_type with fields this parser cannot size. */
  CHECK(locus_hw_parse(buf, n, ST | PERF_SAMPLE_READ, collect, &g) == -1);
  CHECK(locus_hw_parse(buf, n, ST | PERF_SAMPLE_REGS_USER, collect, &g) == -1);
  /* Nothing, or less than a header: no sample, no error. */
  CHECK(locus_hw_parse(buf, 0, ST, collect, &g) == 0);
  CHECK(locus_hw_parse(buf, 5, ST, collect, &g) == 0);
}

/* Write `len` bytes at byte counter `pos` of a ring of `size` bytes, wrapping. */
static void ring_write(unsigned char *ring, size_t size, uint64_t pos, const void *src,
                       size_t len) {
  for (size_t i = 0; i < len; i++) ring[(pos + i) & (size - 1)] = ((const unsigned char *)src)[i];
}

static void test_wrap(void) {
  enum { SIZE = 256 };
  unsigned char ring[SIZE], rec[256], bounce[128];
  for (uint64_t start = 3 * SIZE + 128; start < 3 * SIZE + 256; start += 4) {
    memset(ring, 0xee, sizeof ring);
    uint64_t head = start;
    for (int i = 0; i < 3; i++) {
      size_t n = sample(rec, ST, 0x1000 + (unsigned)i, 0x2000 + 8u * (unsigned)i, 0, (unsigned)i,
                        i == 1 ? PERF_MEM_OP_STORE : PERF_MEM_OP_LOAD);
      ring_write(ring, SIZE, head, rec, n);
      head += n;
      n = other(rec, PERF_RECORD_LOST, 16);
      ring_write(ring, SIZE, head, rec, n);
      head += n;
    }
    struct got g = {.n = 0};
    uint64_t tail = locus_hw_drain(ring, SIZE, start, head, ST, collect, &g, bounce, sizeof bounce);
    CHECK(tail == head);
    CHECK(g.n == 3);
    for (int i = 0; i < g.n; i++) {
      CHECK(g.a[i].ip == 0x1000u + (unsigned)i && g.a[i].addr == 0x2000u + 8u * (unsigned)i);
      CHECK(!!(g.a[i].flags & LOCUS_AC_STORE) == (i == 1));
    }
  }
  /* A bounce buffer too small for a wrapping record: it is skipped, the walk goes on. */
  memset(ring, 0, sizeof ring);
  uint64_t start = SIZE - 16, head = start;
  size_t n = sample(rec, ST, 0xaaa, 0xbbb, 0, 1, PERF_MEM_OP_LOAD);
  ring_write(ring, SIZE, head, rec, n);
  head += n;
  n = sample(rec, ST, 0xccc, 0xddd, 0, 2, PERF_MEM_OP_LOAD);
  ring_write(ring, SIZE, head, rec, n);
  head += n;
  struct got g = {.n = 0};
  CHECK(locus_hw_drain(ring, SIZE, start, head, ST, collect, &g, bounce, 16) == head);
  CHECK(g.n == 1 && g.a[0].ip == 0xccc);
  /* A corrupt size stops the walk at that record. */
  struct perf_event_header bad = {PERF_RECORD_SAMPLE, 0, 2};
  ring_write(ring, SIZE, head, &bad, sizeof bad);
  g.n = 0;
  CHECK(locus_hw_drain(ring, SIZE, start, head + 8, ST, collect, &g, bounce, sizeof bounce) ==
        head);
  /* Empty ring. */
  CHECK(locus_hw_drain(ring, SIZE, 40, 40, ST, collect, &g, bounce, sizeof bounce) == 40);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  test_linear();
  test_optional_fields();
  test_malformed();
  test_wrap();
  if (failures) {
    fprintf(stderr, "test_hw_parse: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_hw_parse: ok\n");
  return 0;
}
