// The event chooser (#event-list): grouped by sensor, searchable (#event-search), one row per
// event (or per sensor:event over its sources when grouping), unit and description as a
// tooltip. Rows are label.ev[data-key] with a checkbox.

import { groupHow } from "./state.js";

export class EventList {
  constructor(el, samples, store) {
    this.el = el;
    this.samples = samples;
    this.store = store;
    this.rows = new Map(); // key -> {row, input, members}
    el.addEventListener("change", (e) => {
      const input = e.target;
      if (!(input instanceof HTMLInputElement)) return;
      const row = input.closest(".ev");
      if (!row) return;
      const entry = this.rows.get(row.dataset.key);
      const selected = new Set(this.store.get().selected);
      for (const id of entry.members) {
        if (input.checked) selected.add(id);
        else selected.delete(id);
      }
      this.store.set({ selected });
    });
  }

  render(state) {
    const { samples } = this;
    this.el.textContent = "";
    this.rows.clear();
    const bySensor = new Map();
    const entries = state.group
      ? [...samples.groups().values()]
      : [...samples.events.values()].map((e) => ({ ...e, key: e.id, members: [e.id] }));
    for (const e of entries) {
      if (!bySensor.has(e.sensor)) bySensor.set(e.sensor, []);
      bySensor.get(e.sensor).push(e);
    }
    if (entries.length === 0) {
      const p = document.createElement("p");
      p.className = "hint";
      p.textContent = "no events yet";
      this.el.append(p);
      return;
    }
    for (const [sensor, list] of bySensor) {
      const sourced = list.some((e) => e.source);
      const det = document.createElement("details");
      det.className = "sensor";
      det.dataset.sensor = sensor;
      det.open = true;
      const sum = document.createElement("summary");
      sum.textContent = `${sensor} `;
      const cnt = document.createElement("span");
      cnt.className = "count";
      cnt.textContent = String(list.length);
      sum.append(cnt);
      det.append(sum);
      for (const e of list) {
        const row = document.createElement("label");
        row.className = "ev";
        row.dataset.key = e.key;
        const input = document.createElement("input");
        input.type = "checkbox";
        const name = document.createElement("span");
        name.className = "name";
        name.textContent = e.event;
        row.append(input, name);
        // A system-wide event beside per-source ones (cpu::user beside cpu:cpu3:user): "all".
        const src = e.source === "*" ? `×${e.members.length}` : e.source || (sourced ? "all" : "");
        if (src) {
          const s = document.createElement("span");
          s.className = "src";
          s.textContent = src;
          row.append(s);
        }
        const unit = document.createElement("span");
        unit.className = "unit";
        unit.textContent = e.unit || "";
        row.append(unit);
        const how = e.source === "*" ? ` — ${groupHow(state, e.unit)} over ${src} sources` : "";
        row.title = `${e.key} [${e.unit || "no unit"}, ${e.kind}]${how}\n${e.description || ""}`;
        row.dataset.search = `${e.key} ${e.description || ""}`.toLowerCase();
        det.append(row);
        this.rows.set(e.key, { row, input, members: e.members });
      }
      this.el.append(det);
    }
    this.absent();
    this.sync(state);
    this.filter(state.filter);
  }

  // Sensors the monitor found absent, with the reason (and how to enable) as a tooltip.
  absent() {
    const absent = (this.samples.header?.sensors || []).filter((s) => !s.present);
    if (absent.length === 0) return;
    const p = document.createElement("p");
    p.className = "absent hint";
    p.textContent = "absent: ";
    for (const s of absent) {
      const span = document.createElement("span");
      span.className = "absent-sensor";
      span.dataset.sensor = s.name;
      span.textContent = `${s.name} `;
      span.title = s.reason || "not present on this machine";
      p.append(span);
    }
    this.el.append(p);
  }

  sync(state) {
    for (const { input, members } of this.rows.values()) {
      let n = 0;
      for (const id of members) if (state.selected.has(id)) n++;
      input.checked = n > 0;
      input.indeterminate = n > 0 && n < members.length;
    }
  }

  filter(text) {
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    for (const { row } of this.rows.values()) {
      const hay = row.dataset.search;
      row.hidden = !words.every((w) => hay.includes(w));
    }
    for (const det of this.el.querySelectorAll("details.sensor")) {
      det.hidden = !det.querySelector(".ev:not([hidden])");
    }
  }
}
