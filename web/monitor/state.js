// The monitor page's state, in one store (see common/store.js). The samples themselves are
// in samples.js; `version` here changes when they do.

import { createStore } from "../common/store.js";

export const WINDOWS = [
  [10, "10 s"],
  [30, "30 s"],
  [60, "1 min"],
  [300, "5 min"],
  [900, "15 min"],
  [0, "all"],
];

export const store = createStore({
  mode: "live", // "live": fed by the websocket; "file": a recorded file loaded in the page
  conn: "connecting", // live mode: "connecting" | "open" | "closed" | "unavailable"
  source: "", // file mode: the file's name
  intervalMs: null, // the monitor's interval, from the header and interval records
  paused: false,
  selected: new Set(), // chosen event ids (concrete "sensor:source:event")
  group: true, // one trace per sensor:event over its sources, or each source apart
  groupHow: "auto", // "auto" (mean for %, else sum) | "sum" | "mean"
  follow: true, // the x window follows the newest sample
  windowS: 60, // its width (0: all the data)
  xRange: null, // [min, max] when zoomed (follow off)
  hidden: new Set(), // series keys hidden by a legend click
  filter: "", // the event list's search text
  eventsVersion: 0, // bumps when the set of known events changes
  message: "",
});

export function groupHow(state, unit) {
  if (state.groupHow !== "auto") return state.groupHow;
  return /%|percent/i.test(unit || "") ? "mean" : "sum";
}
