/* The critical-path walk of critical_path.py, in C: the one loop of the locks analysis that
 * numpy cannot vectorise (each step depends on the previous one). Loaded with ctypes; the
 * Python version in critical_path.py is the reference and the fallback, and the tests run
 * both. Arrays are int64; see critical_path.compute for their meaning. */
#include <stdint.h>

/* Last index k in [lo, hi) with a[k] <= t, or lo - 1. */
static int64_t last_le(const int64_t *a, int64_t lo, int64_t hi, int64_t t) {
  int64_t l = lo, h = hi;
  while (l < h) {
    int64_t m = l + (h - l) / 2;
    if (a[m] <= t)
      l = m + 1;
    else
      h = m;
  }
  return l - 1;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Walks one process backwards from thread `cur` at time `t`. `hi` (nth entries) starts as
 * bounds[1:], `started` (nth bytes) as zeros. Writes (thread, lo, hi) triples to `segs` and
 * event indices to `jumped`; returns 0, or -1 when an output would overflow. */
int64_t locus_cp_walk(int64_t nth, const int64_t *bounds, int64_t nb, const int64_t *tacq,
                      const int64_t *treq, const int64_t *bo, const int64_t *cthr,
                      const int64_t *ctime, const int64_t *start, const int64_t *create_t,
                      const int64_t *creator, int64_t cur, int64_t pstart, int64_t t, int64_t *hi,
                      uint8_t *started, int64_t *segs, int64_t seg_cap, int64_t *nsegs,
                      int64_t *jumped, int64_t jump_cap, int64_t *njumped) {
  int64_t top = t, ns = *nsegs, nj = *njumped;
  int64_t steps = nb + 4 * nth + 16;
#define SEG(a, b, c)              \
  do {                            \
    if (ns >= seg_cap) return -1; \
    segs[3 * ns] = (a);           \
    segs[3 * ns + 1] = (b);       \
    segs[3 * ns + 2] = (c);       \
    ns++;                         \
  } while (0)
  for (int64_t s = 0; s < steps; s++) {
    int64_t lo_b = bounds[cur];
    int64_t k = last_le(tacq, lo_b, hi[cur], t);
    if (k < lo_b) {
      SEG(cur, min64(start[cur], t), top);
      hi[cur] = lo_b;
      int64_t c = creator[cur];
      if (c < 0 || started[cur] || start[cur] <= pstart) break;
      started[cur] = 1;
      t = top = min64(min64(create_t[cur], start[cur]), t);
      cur = c;
      continue;
    }
    hi[cur] = k;
    int64_t c = cthr[k];
    if (c >= 0) {
      SEG(cur, tacq[k], top);
      if (nj >= jump_cap) return -1;
      jumped[nj++] = bo[k];
      t = top = min64(ctime[k], tacq[k]);
      cur = c;
    } else if (treq[k] < t) {
      t = treq[k];
    }
    if (t <= pstart) {
      SEG(cur, t, top);
      break;
    }
  }
#undef SEG
  *nsegs = ns;
  *njumped = nj;
  return 0;
}
