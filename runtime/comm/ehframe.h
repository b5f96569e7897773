/* Reading the exception-header encodings of .eh_frame_hdr and .eh_frame (DW_EH_PE_*), for
 * the soft backend's function table (soft/soft.c, in memory, in its signal handler) and the
 * frame walk (unwind.c, from a file's bytes). No allocation, no system call. `bias` turns a
 * pointer into the bytes into the address those bytes have (0 where they are read where
 * they are mapped), for pc-relative values. */
#ifndef LOCUS_COMM_EHFRAME_H
#define LOCUS_COMM_EHFRAME_H

#include <stdint.h>
#include <string.h>

#define DW_EH_PE_omit 0xff
#define DW_EH_PE_pcrel 0x10
#define DW_EH_PE_datarel 0x30

/* An unsigned or signed LEB128 at *pp before end: 0 and *pp past it, else -1. */
static inline int locus_leb(const uint8_t **pp, const uint8_t *end, int is_signed, uint64_t *out) {
  uint64_t v = 0;
  for (int s = 0; *pp < end && s < 64;) {
    uint8_t b = *(*pp)++;
    v |= (uint64_t)(b & 0x7f) << s;
    s += 7;
    if (!(b & 0x80)) {
      if (is_signed && s < 64 && (b & 0x40)) v |= ~0ull << s;
      *out = v;
      return 0;
    }
  }
  return -1;
}

/* One pointer of encoding enc at *pp before end, `data` the datarel base: 0 and *pp past
 * it, else -1 (omitted, indirect, an application other than absolute, pc- or data-relative,
 * or cut by end). */
static inline int locus_eh_ptr(const uint8_t **pp, const uint8_t *end, int64_t bias, uint8_t enc,
                               uint64_t data, uint64_t *out) {
  const uint8_t *p = *pp;
  uint64_t v = 0;
  static const uint8_t width[16] = {
      [0x00] = 8, [0x02] = 2, [0x03] = 4, [0x04] = 8, [0x0a] = 2, [0x0b] = 4, [0x0c] = 8};
  if (enc == DW_EH_PE_omit || (enc & 0x80)) return -1; /* (indirect: never code addresses) */
  if ((enc & 0x0f) == 0x01 || (enc & 0x0f) == 0x09) {
    if (locus_leb(&p, end, (enc & 0x0f) == 0x09, &v) != 0) return -1;
  } else {
    uint8_t w = width[enc & 0x0f];
    if (!w || end - p < w) return -1;
    memcpy(&v, p, w);
    if ((enc & 0x08) && w < 8 && (v >> (8 * w - 1)) & 1) v |= ~0ull << (8 * w); /* sdataN */
    p += w;
  }
  switch (enc & 0x70) {
    case 0x00:
      break;
    case DW_EH_PE_pcrel:
      v += (uint64_t)(uintptr_t)*pp + (uint64_t)bias;
      break;
    case DW_EH_PE_datarel:
      v += data;
      break;
    default:
      return -1;
  }
  *pp = p;
  *out = v;
  return 0;
}

/* .eh_frame_hdr's header in [p, end) (at address p + bias): the offset of its table from
 * the header's start and the table's entry count, the table being the pairs (function
 * start, FDE) the binary search needs, datarel sdata4 as gcc, clang and lld all write it:
 * 0, else -1. */
static inline int locus_eh_hdr(const uint8_t *p, const uint8_t *end, int64_t bias,
                               uint32_t *table_off, uint32_t *nfde) {
  const uint8_t *q = p + 4;
  uint64_t addr = (uint64_t)(uintptr_t)p + (uint64_t)bias, v, n;
  if (end - p < 4 || p[0] != 1 || p[3] != (DW_EH_PE_datarel | 0x0b) ||
      locus_eh_ptr(&q, end, bias, p[1], addr, &v) != 0 ||
      locus_eh_ptr(&q, end, bias, p[2], addr, &n) != 0 || n == 0 || n > 0x7fffffff)
    return -1;
  *table_off = (uint32_t)(q - p);
  *nfde = (uint32_t)n;
  return 0;
}

/* The binary search of .eh_frame_hdr's table (nfde pairs of sdata4, datarel from the
 * header): the last entry whose function start is at or before `rel` (an address minus the
 * header's). `entry(arg, k, e)` reads pair k into e[0] (the start) and e[1] (the FDE), 0 on
 * success: the soft backend reads the table where it is mapped, the frame walk with pread
 * (keeping its pages out of the program's memory). 0 and *at, *e the entry's pair; -1 when
 * rel is before the first entry or a read failed. */
static inline int locus_eh_search(uint32_t nfde, int64_t rel,
                                  int (*entry)(const void *arg, uint32_t k, int32_t e[2]),
                                  const void *arg, uint32_t *at, int32_t e[2]) {
  uint32_t lo = 0, hi = nfde;
  if (!nfde || entry(arg, 0, e) != 0 || e[0] > rel) return -1;
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (entry(arg, mid, e) != 0) return -1;
    if (e[0] <= rel)
      lo = mid;
    else
      hi = mid;
  }
  if (entry(arg, lo, e) != 0) return -1;
  *at = lo;
  return 0;
}

#endif
