// The console's only way to the service: the /v1 API and the /events WebSocket, with the
// viewer's key (sessionStorage: this tab only) sent as the API expects.

const KEY_ITEM = "opml.console.key";

export function getKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

/** A 4xx/5xx answer: its status and problem+json body. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

/** One API call: JSON in, JSON out (null for 204); an ApiError for a problem answer. */
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const answer = await fetch(path, init);
  if (answer.status === 204) return null;
  const text = await answer.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = { detail: text.slice(0, 200) };
  }
  if (!answer.ok) throw new ApiError(answer.status, parsed || {});
  return parsed;
}

/** The model's /events push. Browsers cannot set headers on a WebSocket: the key goes in the
 * subprotocol list, as the service documents. Reconnects (with a growing pause) until closed;
 * `onGone` is called when the model was deleted (close code 4404). */
export function subscribe(name, intervalMs, onFrame, onGone) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/v1/models/${encodeURIComponent(name)}/events?interval_ms=${intervalMs}`;
  let socket = null;
  let closed = false;
  let pause = 500;
  const open = () => {
    const key = getKey();
    socket = new WebSocket(url, key ? ["opml", `opml.bearer.${key}`] : ["opml"]);
    socket.onmessage = (event) => {
      pause = 500;
      const frame = JSON.parse(event.data);
      if (!frame.error) onFrame(frame);
    };
    socket.onclose = (event) => {
      if (closed) return;
      if (event.code === 4404) {
        onGone();
        return;
      }
      setTimeout(() => closed || open(), pause);
      pause = Math.min(pause * 2, 10000);
    };
  };
  open();
  return () => {
    closed = true;
    if (socket) socket.close();
  };
}
