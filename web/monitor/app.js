// The monitor lens: live (websocket /ws, see docs/web.md) or a recorded file loaded in the page
// (JSON lines, docs/monitor.md). mount(root) builds the page and wires it to the store.

import { fmtInterval } from "../common/format.js";
import { readJsonLines } from "../common/jsonl.js";
import { setStatus } from "../common/status.js";
import { canConnect, LiveSocket, wsUrl } from "../common/ws.js";
import { EventList } from "./eventlist.js";
import { Plots } from "./plots.js";
import { Samples } from "./samples.js";
import { store, WINDOWS } from "./state.js";

const TEMPLATE = `
<section id="controls">
  <div class="ctl live-only">
    <label>interval <input id="interval-input" type="number" min="0.1" step="any" placeholder="ms"> ms</label>
    <button id="interval-apply" type="button">apply to all clients</button>
    <span class="now">now <output id="interval-current" data-ms="">—</output></span>
    <button id="pause" type="button">pause</button>
    <button id="resume" type="button">resume</button>
    <input id="label-input" type="text" maxlength="200" placeholder="label text">
    <button id="label-send" type="button">add label</button>
  </div>
  <div class="ctl">
    <label title="one trace per sensor:event over all its sources (e.g. all CPUs)">
      <input id="group-toggle" type="checkbox" checked> group sources</label>
    <select id="group-mode" title="how grouped sources are combined">
      <option value="auto">auto (mean of %, else sum)</option>
      <option value="sum">sum</option>
      <option value="mean">mean</option>
    </select>
    <label title="the time window moves with the newest sample">
      <input id="follow-toggle" type="checkbox" checked> follow live</label>
    <select id="window-select" title="width of the time window"></select>
    <span class="hint">drag on a plot to zoom, double-click to reset, click a legend entry to hide it</span>
    <label class="file">open recorded file…
      <input id="file-input" type="file" accept=".jsonl,.ndjson,.json,.gz,.txt"></label>
    <button id="live-button" type="button" hidden>back to live</button>
  </div>
</section>
<div id="layout">
  <aside id="sidebar">
    <input id="event-search" type="search" placeholder="filter events">
    <div id="event-list"></div>
  </aside>
  <section id="plots" data-points="0"></section>
</div>
<p id="message" role="status"></p>
`;

// Picked when nothing is chosen yet (group keys or ids), in this order, up to MAX_DEFAULT.
const PREFERRED = [
  "cpu:*:user",
  "cpu:*:system",
  "vmstat::pgfault",
  "vmstat::numa_hit",
  "vmstat::numa_miss",
  "cpu::user",
  "cpu::system",
];
const MAX_DEFAULT = 4;
// Live mode keeps about this many values (samples × events) in the page.
const LIVE_VALUES = 4e6;

export function mount(root, { params }) {
  root.innerHTML = TEMPLATE;
  const $ = (id) => document.getElementById(id);
  const samples = new Samples();
  const requested = (params.get("events") || "").split(",").filter(Boolean);
  let socket = null;
  let renderQueued = false;

  const plots = new Plots($("plots"), samples, store, {
    onZoom: (min, max) => store.set({ follow: false, xRange: [min, max] }),
    onReset: () =>
      store.get().mode === "live"
        ? store.set({ follow: true, xRange: null })
        : store.set({ follow: false, xRange: null }),
  });
  const events = new EventList($("event-list"), samples, store);

  for (const [s, text] of WINDOWS) $("window-select").add(new Option(text, String(s)));
  $("window-select").value = String(store.get().windowS);

  // -- records -----------------------------------------------------------------------------
  function chooseDefaults() {
    const st = store.get();
    for (const id of st.selected) if (samples.events.has(id)) return;
    const groups = samples.groups();
    let keys = (requested.length ? requested : PREFERRED).filter((k) => groups.has(k));
    for (const id of requested) if (samples.events.has(id) && !groups.has(id)) keys.push(id);
    if (keys.length === 0) keys = [...groups.keys()].slice(0, 3);
    const selected = new Set();
    for (const k of keys.slice(0, requested.length ? keys.length : MAX_DEFAULT)) {
      for (const id of groups.get(k)?.members || [k]) selected.add(id);
    }
    store.set({ selected });
  }

  function newHeader(header) {
    samples.reset(header);
    store.set({
      intervalMs: header?.interval_ms ?? null,
      eventsVersion: store.get().eventsVersion + 1,
    });
    chooseDefaults();
  }

  function apply(rec) {
    const nEvents = samples.events.size;
    const kind = samples.add(rec);
    if (kind === "interval") store.set({ intervalMs: rec.interval_ms });
    else if (kind === "pause") store.set({ paused: !!rec.paused });
    else if (kind === "header") {
      if (!sameSession(rec)) newHeader(rec);
    } else if (kind === "sample" && samples.events.size !== nEvents) {
      store.set({ eventsVersion: store.get().eventsVersion + 1 });
      chooseDefaults();
    }
  }

  function sameSession(header) {
    const h = samples.header;
    return !!h && h.start === header.start && (h.events || []).length === (header.events || []).length;
  }

  function liveCap() {
    return Math.max(3600, Math.min(200000, Math.floor(LIVE_VALUES / Math.max(1, samples.events.size))));
  }

  function onMessage(msg) {
    if (store.get().mode !== "live") return;
    if (msg.type === "hello") {
      if (!sameSession(msg.header)) newHeader(msg.header);
      samples.maxPoints = liveCap();
      for (const rec of msg.history || []) apply(rec);
      store.set({ intervalMs: msg.interval_ms ?? store.get().intervalMs, paused: !!msg.paused });
    } else if (msg.type === "batch") {
      for (const rec of msg.records) apply(rec);
    } else if (msg.type === "error") {
      store.set({ message: `server: ${msg.message}` });
      return;
    }
    samples.trim();
    scheduleRender();
  }

  function connect() {
    if (!canConnect()) {
      store.set({ conn: "unavailable" });
      return;
    }
    if (!socket) {
      socket = new LiveSocket(wsUrl("ws"), {
        onMessage,
        onState: (st) => store.set({ conn: st }),
      });
    }
    socket.connect();
  }

  let loading = 0; // a newer file (or going live) ends the reading of an older one

  async function loadFile(file) {
    const gen = ++loading;
    if (socket) socket.close();
    samples.reset(null);
    store.set({
      mode: "file",
      source: file.name,
      follow: false,
      xRange: null,
      paused: false,
      intervalMs: null,
      message: `reading ${file.name}…`,
      eventsVersion: store.get().eventsVersion + 1,
    });
    const stats = { bad: 0, lines: 0 };
    let n = 0;
    try {
      for await (const rec of readJsonLines(file, stats)) {
        if (gen !== loading) return;
        apply(rec);
        if (++n % 50000 === 0) {
          store.set({ message: `reading ${file.name}… ${n} records` });
          await new Promise((r) => setTimeout(r, 0));
        }
      }
    } catch (err) {
      store.set({ message: `cannot read ${file.name}: ${err.message || err}` });
      return;
    }
    if (gen !== loading) return;
    store.set({ eventsVersion: store.get().eventsVersion + 1 });
    chooseDefaults();
    const bad = stats.bad ? `, ${stats.bad} unreadable lines skipped` : "";
    store.set({
      message: samples.length
        ? `${file.name}: ${samples.length} samples, ${samples.events.size} events${bad}`
        : `${file.name}: no samples found (${stats.lines} lines${bad})`,
    });
    scheduleRender();
  }

  function backToLive() {
    loading++;
    samples.reset(null);
    store.set({
      mode: "live",
      source: "",
      follow: true,
      xRange: null,
      message: "",
      eventsVersion: store.get().eventsVersion + 1,
    });
    connect();
  }

  // -- rendering ---------------------------------------------------------------------------
  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      plots.update(store.get());
      showStatus(store.get());
    });
  }

  function showStatus(st) {
    if (st.mode === "file") {
      setStatus("file", `file ${st.source} — ${samples.length} samples`);
    } else if (st.conn === "open") {
      setStatus("live", `live — ${samples.events.size} events${st.paused ? " — paused" : ""}`);
    } else if (st.conn === "connecting") {
      setStatus("connecting", "connecting…");
    } else if (st.conn === "closed") {
      setStatus("closed", "disconnected — retrying (or open a recorded file)");
    } else {
      setStatus("offline", "offline — open a recorded file");
    }
  }

  function showControls(st) {
    const live = st.mode === "live" && st.conn === "open";
    for (const el of document.querySelectorAll(".live-only input, .live-only button")) {
      el.disabled = !live;
    }
    if (live) {
      $("pause").disabled = st.paused;
      $("resume").disabled = !st.paused;
    }
    $("live-button").hidden = st.mode !== "file" || !canConnect();
    $("follow-toggle").checked = st.follow;
    $("group-toggle").checked = st.group;
    $("group-mode").disabled = !st.group;
  }

  store.subscribe((st, ch) => {
    if (ch.has("eventsVersion") || ch.has("group") || (ch.has("groupHow") && st.group)) {
      events.render(st);
    } else if (ch.has("selected")) {
      events.sync(st);
    }
    if (ch.has("filter")) events.filter(st.filter);
    if (["selected", "group", "groupHow", "eventsVersion"].some((k) => ch.has(k))) {
      plots.rebuild(st);
    }
    if (ch.has("intervalMs")) {
      const out = $("interval-current");
      out.dataset.ms = st.intervalMs == null ? "" : String(st.intervalMs);
      out.textContent = fmtInterval(st.intervalMs);
    }
    if (ch.has("message")) $("message").textContent = st.message;
    showControls(st);
    showStatus(st);
    scheduleRender();
  });

  // -- controls ----------------------------------------------------------------------------
  function send(obj) {
    if (!socket || !socket.send(obj)) store.set({ message: "not connected to a live monitor" });
  }

  function applyInterval() {
    const ms = Number($("interval-input").value);
    if (!Number.isFinite(ms) || ms < 0.1) {
      store.set({ message: "interval: a number of milliseconds, at least 0.1" });
      return;
    }
    send({ type: "interval", interval_ms: ms });
    store.set({ message: `asked for an interval of ${fmtInterval(ms)}` });
  }

  function sendLabel() {
    const text = $("label-input").value.trim();
    if (!text) return;
    send({ type: "label", text });
    $("label-input").value = "";
  }

  $("interval-apply").addEventListener("click", applyInterval);
  $("interval-input").addEventListener("keydown", (e) => e.key === "Enter" && applyInterval());
  $("label-send").addEventListener("click", sendLabel);
  $("label-input").addEventListener("keydown", (e) => e.key === "Enter" && sendLabel());
  $("pause").addEventListener("click", () => send({ type: "pause" }));
  $("resume").addEventListener("click", () => send({ type: "resume" }));
  $("group-toggle").addEventListener("change", (e) => store.set({ group: e.target.checked }));
  $("group-mode").addEventListener("change", (e) => store.set({ groupHow: e.target.value }));
  $("follow-toggle").addEventListener("change", (e) =>
    store.set({ follow: e.target.checked, xRange: e.target.checked ? null : plots.visibleRange() }),
  );
  $("window-select").addEventListener("change", (e) =>
    store.set({ windowS: Number(e.target.value), follow: true, xRange: null }),
  );
  $("event-search").addEventListener("input", (e) => store.set({ filter: e.target.value }));
  $("file-input").addEventListener("change", (e) => {
    const file = e.target.files[0];
    if (file) loadFile(file).finally(() => (e.target.value = ""));
  });
  $("live-button").addEventListener("click", backToLive);

  // For debugging from the console (and the browser tests): window.locus.monitor.
  window.locus = { ...(window.locus || {}), monitor: { store, samples, plots } };

  showControls(store.get());
  events.render(store.get());
  plots.rebuild(store.get());
  connect();
}
