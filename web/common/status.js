// The connection/status line in the top bar (#status): its text and a data-state
// attribute (loading, connecting, live, closed, offline, file, error) for styles and tests.

export function setStatus(state, text) {
  const el = document.getElementById("status");
  if (!el) return;
  el.dataset.state = state;
  el.textContent = text;
}
