// A time-series chart: uPlot with the interactions every lens wants.
// - x is Unix time in seconds; the caller sets the visible window (setData(data, xmin, xmax));
// - drag selects a window -> onZoom(min, max); double-click -> onReset();
// - hovering shows exact values in the legend; clicking a legend entry toggles the trace
//   (onToggle(key, shown));
// - marks (labels) are DOM elements over the plot: .label-mark[data-text][data-t], so they can
//   be styled, hovered and found by tests.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { fmtNumber, fmtTime } from "./format.js";

export const PALETTE = [
  "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
  "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#e6550d", "#7b4173", "#3182bd",
];

const HEIGHT = 240;

export class TimeChart {
  // series: [{key, label, color, show, title}]
  constructor(parent, { title, unit, series, syncKey, onZoom, onReset, onToggle }) {
    this.el = document.createElement("div");
    this.el.className = "chart";
    this.el.dataset.unit = unit;
    this.el.dataset.points = "0";
    const h = document.createElement("div");
    h.className = "chart-title";
    h.textContent = title;
    this.el.append(h);
    parent.append(this.el);
    this.series = series;
    this.marks = [];
    this.onToggle = onToggle;

    const opts = {
      width: Math.max(300, this.el.clientWidth || parent.clientWidth || 800),
      height: HEIGHT,
      cursor: {
        sync: syncKey ? { key: syncKey } : undefined,
        drag: { x: true, y: false, setScale: false },
        bind: {
          dblclick: () => (e) => {
            if (e.button === 0) onReset();
            return null;
          },
        },
      },
      legend: { live: true },
      scales: { x: { time: true } },
      axes: [
        {},
        { label: unit, size: 70, values: (u, vals) => vals.map((v) => fmtNumber(v)) },
      ],
      series: [
        { label: "time", value: (u, v) => fmtTime(v) },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 1.5,
          show: s.show !== false,
          value: (u, v) => fmtNumber(v),
          points: { show: false },
          // Slower sensors fill only every k-th sample (docs/monitor.md): join their points.
          spanGaps: true,
        })),
      ],
      hooks: {
        setSelect: [
          (u) => {
            if (u.select.width > 2) {
              const min = u.posToVal(u.select.left, "x");
              const max = u.posToVal(u.select.left + u.select.width, "x");
              u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
              onZoom(min, max);
            }
          },
        ],
        setSeries: [
          (u, idx, o) => {
            if (idx != null && idx > 0 && o && "show" in o && this.onToggle) {
              this.onToggle(this.series[idx - 1].key, o.show);
            }
          },
        ],
        draw: [() => this.placeMarks()],
      },
    };
    const empty = [[], ...series.map(() => [])];
    this.u = new uPlot(opts, empty, this.el);
    // Series titles (descriptions) as tooltips on the legend entries.
    const rows = this.el.querySelectorAll(".u-legend .u-series");
    series.forEach((s, i) => {
      const row = rows[i + 1];
      if (row) {
        row.title = s.title || s.label;
        row.dataset.key = s.key;
      }
    });
    this.markLayer = document.createElement("div");
    this.markLayer.className = "marks";
    this.u.over.append(this.markLayer);
    this.ro = new ResizeObserver(() => this.fit());
    this.ro.observe(this.el);
  }

  fit() {
    const w = Math.max(300, this.el.clientWidth);
    if (Math.abs(w - this.u.width) > 1) this.u.setSize({ width: w, height: HEIGHT });
  }

  // data = [times, ...series values]; xmin/xmax = the visible window (null: all data).
  setData(data, xmin, xmax) {
    const n = data[0].length;
    this.el.dataset.points = String(n);
    this.u.batch(() => {
      this.u.setData(data, false);
      if (n > 0) {
        const lo = xmin ?? data[0][0];
        let hi = xmax ?? data[0][n - 1];
        if (hi <= lo) hi = lo + 1;
        this.u.setScale("x", { min: lo, max: hi });
      }
    });
  }

  // marks: [{t, text, kind}]
  setMarks(marks) {
    this.marks = marks.slice();
    const layer = this.markLayer;
    while (layer.children.length > marks.length) layer.lastChild.remove();
    for (let i = 0; i < marks.length; i++) {
      let el = layer.children[i];
      if (!el) {
        el = document.createElement("div");
        el.className = "label-mark";
        const span = document.createElement("span");
        el.append(span);
        layer.append(el);
      }
      const m = marks[i];
      if (el.dataset.text !== m.text || el.dataset.t !== String(m.t)) {
        el.dataset.text = m.text;
        el.dataset.t = String(m.t);
        el.dataset.kind = m.kind;
        el.title = `${fmtTime(m.t)}  ${m.text}`;
        el.firstChild.textContent = m.text;
        el.firstChild.style.top = `${2 + (i % 4) * 14}px`; // neighbours' texts do not overlap
      }
    }
    this.placeMarks();
  }

  placeMarks() {
    const u = this.u;
    const { min, max } = u.scales.x;
    const layer = this.markLayer;
    if (!layer) return;
    for (let i = 0; i < this.marks.length; i++) {
      const el = layer.children[i];
      if (!el) break;
      const t = this.marks[i].t;
      if (min == null || t < min || t > max) {
        el.style.display = "none";
      } else {
        const x = u.valToPos(t, "x");
        el.style.display = "";
        el.style.left = `${x}px`;
        el.classList.toggle("flip", x > u.over.clientWidth - 120); // text left of the line
      }
    }
  }

  destroy() {
    this.ro.disconnect();
    this.u.destroy();
    this.el.remove();
  }
}
