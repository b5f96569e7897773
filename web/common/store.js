// A very small store: one state object, shallow patches, subscribers told which keys changed.
// Each lens keeps its UI state in one store (web/LENS/state.js); bulky data (samples, run
// records) lives beside it in plain objects and the store only carries a version counter.

export function createStore(initial) {
  let state = { ...initial };
  const subscribers = new Set();
  return {
    get: () => state,
    set(patch) {
      const changed = new Set();
      for (const [k, v] of Object.entries(patch)) if (state[k] !== v) changed.add(k);
      if (changed.size === 0) return;
      state = { ...state, ...patch };
      for (const fn of subscribers) fn(state, changed);
    },
    subscribe(fn) {
      subscribers.add(fn);
      return () => subscribers.delete(fn);
    },
  };
}
