// The console's one way to the api: the API key (kept in sessionStorage, sent only as the Bearer
// header, never in a URL or a log), JSON requests with the api's error messages, and an SSE reader
// over fetch() (EventSource cannot send an Authorization header).

const KEY = "conveyor.apiKey";

export const auth = {
  get key() { return sessionStorage.getItem(KEY) || ""; },
  set(key) { sessionStorage.setItem(KEY, key.trim()); },
  clear() { sessionStorage.removeItem(KEY); },
  headers() { return this.key ? { Authorization: `Bearer ${this.key}` } : {}; },
};

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function errorMessage(data, text, status) {
  if (data && data.error && typeof data.error === "object" && data.error.message) return data.error.message;
  if (data && typeof data.error === "string") return data.error;
  return text || `HTTP ${status}`;
}

async function failed(res) {
  const text = await res.text();
  let data = null;
  try { data = JSON.parse(text); } catch { /* not JSON */ }
  return new ApiError(res.status, errorMessage(data, text, res.status));
}

export async function request(method, path, body) {
  const headers = auth.headers();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!res.ok) throw await failed(res);
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

function parseEvent(block) {
  const event = { id: null, event: "message", data: [] };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue; // a keep-alive comment
    const at = line.indexOf(":");
    const field = at < 0 ? line : line.slice(0, at);
    const value = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
    if (field === "data") event.data.push(value);
    else if (field === "id") event.id = value;
    else if (field === "event") event.event = value;
  }
  if (!event.data.length) return null;
  return { ...event, data: event.data.join("\n") };
}

// Yields {id, event, data} for each Server-Sent Event of the answer to this request.
export async function* sse(path, { method = "GET", body, signal } = {}) {
  const headers = { ...auth.headers(), Accept: "text/event-stream" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!res.ok) throw await failed(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = parseEvent(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (event) yield event;
    }
  }
}

// A DOM element; children are nodes or text (text is never parsed as HTML).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "style") Object.assign(el.style, value); // CSSOM: the CSP allows no style attribute
    else el.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function when(epoch) {
  return epoch ? new Date(epoch * 1000).toLocaleString() : "—";
}

export function seconds(value) {
  return value === null || value === undefined ? "—" : `${Number(value).toFixed(3)} s`;
}

export function badge(status) {
  return h("span", { class: `badge ${status}`, "data-status": status }, status);
}
