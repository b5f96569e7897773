// Number and time formatting shared by the lenses.

const SI = [
  [1e12, "T"],
  [1e9, "G"],
  [1e6, "M"],
  [1e3, "k"],
];

export function fmtNumber(v) {
  if (v == null || Number.isNaN(v)) return "—";
  const a = Math.abs(v);
  for (const [f, p] of SI) if (a >= f) return trim((v / f).toPrecision(4)) + p;
  if (a === 0) return "0";
  if (a < 1e-3) return v.toExponential(2);
  return trim(v.toPrecision(4));
}

function trim(s) {
  return s.includes(".") && !s.includes("e") ? s.replace(/\.?0+$/, "") : s;
}

export function fmtTime(t) {
  if (t == null) return "—";
  const d = new Date(t * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function fmtInterval(ms) {
  if (ms == null) return "—";
  return ms >= 1000 ? `${+(ms / 1000).toPrecision(4)} s` : `${+ms.toPrecision(4)} ms`;
}
