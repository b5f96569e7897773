// The web UI's entry point: picks the lens view and mounts it into #app.
// Each lens is a directory web/LENS/ with app.js (exports mount(root, ctx)) and LENS.css;
// see docs/web.md.

import { setStatus } from "./common/status.js";

const LENSES = {
  monitor: () => import("./monitor/app.js"),
};

const params = new URLSearchParams(location.search);
const lens = params.get("lens") || document.body.dataset.lens || "monitor";

async function start() {
  const load = LENSES[lens];
  const root = document.getElementById("app");
  if (!load) {
    setStatus("error", `unknown lens '${lens}'`);
    return;
  }
  document.getElementById("lens-name").textContent = lens;
  document.title = `locus ${lens}`;
  const css = document.createElement("link");
  css.rel = "stylesheet";
  css.href = `${lens}/${lens}.css`;
  document.head.append(css);
  const mod = await load();
  mod.mount(root, { params });
}

start().catch((err) => {
  console.error(err);
  setStatus("error", `failed to start: ${err.message || err}`);
});
