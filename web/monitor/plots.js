// The charts in #plots: one chart per unit among the chosen series, x = time, all charts on
// the same x window with a shared cursor. #plots[data-points] = samples held.

import { PALETTE, TimeChart } from "../common/chart.js";
import { groupHow } from "./state.js";

export function seriesList(samples, state) {
  const out = [];
  if (state.group) {
    for (const g of samples.groups().values()) {
      const members = g.members.filter((id) => state.selected.has(id));
      if (members.length === 0) continue;
      if (!g.source) {
        out.push(plain(samples.events.get(g.key)));
        continue;
      }
      const how = groupHow(state, g.unit);
      out.push({
        key: `${g.key}|${how}`,
        base: g.key,
        members,
        how,
        unit: g.unit || "",
        label: `${g.sensor}:${g.event} (${how} of ${members.length})`,
        title: `${how} over ${members.join(", ")}\n${g.description || ""}`,
      });
    }
  } else {
    for (const info of samples.events.values()) {
      if (state.selected.has(info.id)) out.push(plain(info));
    }
  }
  return out;
}

function plain(info) {
  return {
    key: info.id,
    base: info.id,
    members: null,
    unit: info.unit || "",
    label: info.id,
    title: info.description || info.id,
  };
}

export class Plots {
  constructor(el, samples, store, { onZoom, onReset }) {
    this.el = el;
    this.samples = samples;
    this.store = store;
    this.onZoom = onZoom;
    this.onReset = onReset;
    this.charts = []; // {chart, series}
    this.hint = document.createElement("p");
    this.hint.className = "hint";
    el.append(this.hint);
  }

  rebuild(state) {
    for (const c of this.charts) c.chart.destroy();
    this.charts = [];
    this.samples.dropDerived();
    const all = seriesList(this.samples, state);
    const byUnit = new Map();
    for (const s of all) {
      if (!byUnit.has(s.unit)) byUnit.set(s.unit, []);
      byUnit.get(s.unit).push(s);
    }
    this.hint.textContent =
      all.length === 0 ? "Choose events in the list on the left to plot them." : "";
    this.hint.hidden = all.length !== 0;
    let color = 0;
    for (const [unit, series] of byUnit) {
      for (const s of series) {
        s.color = PALETTE[color++ % PALETTE.length];
        s.show = !state.hidden.has(s.key);
      }
      const chart = new TimeChart(this.el, {
        title: unit || "value",
        unit: unit || "",
        series,
        syncKey: "locus-monitor",
        onZoom: this.onZoom,
        onReset: this.onReset,
        onToggle: (key, show) => {
          const hidden = new Set(this.store.get().hidden);
          if (show) hidden.delete(key);
          else hidden.add(key);
          this.store.set({ hidden });
        },
      });
      this.charts.push({ chart, series });
    }
  }

  // The x window to show: following (the last windowS seconds, or everything), or zoomed.
  range(state) {
    const s = this.samples;
    if (s.length === 0) return [null, null];
    if (!state.follow) return state.xRange || [null, null];
    // Until the data spans the window, the data fills the plot.
    if (state.windowS > 0) return [Math.max(s.times[0], s.lastT - state.windowS), s.lastT];
    return [null, null];
  }

  update(state) {
    const s = this.samples;
    this.el.dataset.points = String(s.length);
    const [lo, hi] = this.range(state);
    for (const { chart, series } of this.charts) {
      const data = [s.times, ...series.map((x) => s.series(x.base, x.members, x.how))];
      chart.setData(data, lo, hi);
      chart.setMarks(s.marks);
    }
  }

  visibleRange() {
    const c = this.charts[0];
    if (!c) return null;
    const { min, max } = c.chart.u.scales.x;
    return min == null ? null : [min, max];
  }
}
