// The monitor's data, column by column: times[] and one array per event id, the same arrays
// that uPlot draws (no copy), with null where a sample has no value. Grouped series (sum or
// mean over the sources of one sensor:event) are derived arrays, extended incrementally.
// Records are those of docs/monitor.md (header, sample, label, interval, pause).

export function groupKeyOf(info) {
  return info.source ? `${info.sensor}:*:${info.event}` : info.id;
}

export function parseId(id) {
  // "sensor:source:event"; the event part may itself contain ':'.
  const a = id.indexOf(":");
  const b = a < 0 ? -1 : id.indexOf(":", a + 1);
  if (a < 0 || b < 0) return { id, sensor: "other", source: "", event: id };
  return { id, sensor: id.slice(0, a), source: id.slice(a + 1, b), event: id.slice(b + 1) };
}

export class Samples {
  constructor() {
    this.reset(null);
  }

  reset(header) {
    this.header = header;
    this.events = new Map(); // id -> EventInfo
    this.times = [];
    this.cols = new Map(); // id -> values[]
    this.marks = []; // {t, text, kind}
    this.derived = new Map();
    this.maxPoints = Infinity;
    this._groups = null;
    this.version = 0;
    for (const ev of header?.events || []) this.addEvent(ev);
  }

  addEvent(info) {
    if (this.events.has(info.id)) return;
    const full = { unit: "", kind: "counter", description: "", ...parseId(info.id), ...info };
    this.events.set(info.id, full);
    this.cols.set(info.id, new Array(this.times.length).fill(null));
    this._groups = null;
  }

  get length() {
    return this.times.length;
  }

  get lastT() {
    return this.times.length ? this.times[this.times.length - 1] : null;
  }

  // Returns the record's kind: "header", "sample", "label", "interval", "pause" or null.
  add(rec) {
    if (rec == null || typeof rec !== "object") return null;
    if (rec.format !== undefined) return "header";
    const t = rec.t;
    if (rec.v !== undefined) {
      const last = this.lastT;
      if (typeof t !== "number" || (last !== null && t <= last)) return null;
      const v = rec.v || {};
      this.times.push(t);
      for (const [id, col] of this.cols) {
        const x = v[id];
        col.push(typeof x === "number" ? x : null);
      }
      for (const id in v) {
        if (!this.cols.has(id)) {
          this.addEvent({ id });
          this.cols.get(id)[this.times.length - 1] = v[id];
        }
      }
      this.version++;
      return "sample";
    }
    if (rec.label !== undefined) {
      this.addMark(t, String(rec.label), "label");
      return "label";
    }
    if (rec.paused !== undefined) {
      this.addMark(t, rec.paused ? "paused" : "resumed", "pause");
      return "pause";
    }
    if (rec.interval_ms !== undefined) return "interval";
    return null;
  }

  addMark(t, text, kind) {
    const m = this.marks;
    for (let i = m.length - 1; i >= 0 && m[i].t >= t; i--) {
      if (m[i].t === t && m[i].text === text) return; // seen (a reconnect's history)
    }
    m.push({ t, text, kind });
    if (m.length > 1 && m[m.length - 2].t > t) m.sort((a, b) => a.t - b.t);
    this.version++;
  }

  // Live mode keeps at most maxPoints samples, dropping the oldest in chunks.
  trim() {
    const n = this.times.length;
    if (n <= this.maxPoints * 1.25) return 0;
    const k = n - this.maxPoints;
    this.times.splice(0, k);
    for (const col of this.cols.values()) col.splice(0, k);
    for (const d of this.derived.values()) d.values.splice(0, Math.min(k, d.upTo));
    for (const d of this.derived.values()) d.upTo = Math.max(0, d.upTo - k);
    const t0 = this.times[0];
    this.marks = this.marks.filter((m) => m.t >= t0);
    return k;
  }

  // group key -> {key, sensor, event, unit, kind, description, members: [ids]}
  groups() {
    if (this._groups) return this._groups;
    const g = new Map();
    for (const info of this.events.values()) {
      const key = groupKeyOf(info);
      let e = g.get(key);
      if (!e) {
        e = {
          key,
          sensor: info.sensor,
          event: info.event,
          source: info.source ? "*" : "",
          unit: info.unit,
          kind: info.kind,
          description: info.description,
          members: [],
        };
        g.set(key, e);
      }
      e.members.push(info.id);
    }
    this._groups = g;
    return g;
  }

  // The values of one event id, or of a group over the given member ids ("sum" or "mean").
  series(key, members, how) {
    if (!members) return this.cols.get(key) || [];
    if (members.length === 1 && members[0] === key) return this.cols.get(key) || [];
    const dkey = `${key}|${how}|${members.join(",")}`;
    let d = this.derived.get(dkey);
    if (!d) {
      d = { values: [], upTo: 0 };
      this.derived.set(dkey, d);
    }
    const n = this.times.length;
    if (d.upTo < n) {
      const cols = members.map((id) => this.cols.get(id)).filter(Boolean);
      const out = d.values;
      for (let i = d.upTo; i < n; i++) {
        let sum = 0;
        let cnt = 0;
        for (const c of cols) {
          const x = c[i];
          if (x !== null) {
            sum += x;
            cnt++;
          }
        }
        out.push(cnt === 0 ? null : how === "mean" ? sum / cnt : sum);
      }
      d.upTo = n;
    }
    return d.values;
  }

  dropDerived() {
    this.derived.clear();
  }
}
