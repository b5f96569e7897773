// A websocket to the locus server that reconnects with a back-off. The page's ?token= (needed
// when the server is bound to a non-loopback address) is passed on to the websocket URL.

export function wsUrl(path) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  const token = new URLSearchParams(location.search).get("token");
  if (token) url.searchParams.set("token", token);
  return url.href;
}

export function canConnect() {
  return location.protocol === "http:" || location.protocol === "https:";
}

export class LiveSocket {
  // onMessage(obj), onState(state): "connecting" | "open" | "closed"
  constructor(url, { onMessage, onState }) {
    this.url = url;
    this.onMessage = onMessage;
    this.onState = onState;
    this.ws = null;
    this.stopped = true;
    this.delay = 500;
    this.timer = null;
  }

  connect() {
    this.stopped = false;
    clearTimeout(this.timer);
    this.onState("connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onopen = () => {
      this.delay = 500;
      this.onState("open");
    };
    ws.onmessage = (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        console.warn("locus: not JSON from the server", ev.data);
        return;
      }
      this.onMessage(msg);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.onState("closed");
      if (!this.stopped) {
        this.timer = setTimeout(() => this.connect(), this.delay);
        this.delay = Math.min(this.delay * 2, 5000);
      }
    };
  }

  send(obj) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(obj));
    return true;
  }

  get open() {
    return !!this.ws && this.ws.readyState === WebSocket.OPEN;
  }

  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close();
  }
}
