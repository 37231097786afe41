// The public API, as any client calls it: the key the user typed goes in
// Authorization: Bearer (kept in sessionStorage: never in a URL or a cookie).

const KEY = "trioserve.apiKey";

export const keys = {
  get() {
    return sessionStorage.getItem(KEY) || "";
  },
  set(value) {
    sessionStorage.setItem(KEY, value);
  },
  forget() {
    sessionStorage.removeItem(KEY);
  },
};

// A refusal of the server (its error envelope), or "the server cannot be reached" (status 0).
export class ApiError extends Error {
  constructor(status, reason, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.reason = reason;
    this.retryAfter = retryAfter;
  }
}

// What a 401 does (set by the app: ask for a key).
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export async function call(method, path, { body, headers = {}, signal } = {}) {
  const sent = new Headers(headers);
  const key = keys.get();
  if (key) sent.set("Authorization", `Bearer ${key}`);
  if (body !== undefined) sent.set("Content-Type", "application/json");
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: sent,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "unreachable", `the server cannot be reached (${error.message})`);
  }
  if (!response.ok) {
    const error = await refusal(response);
    if (error.status === 401) onUnauthorized(error);
    throw error;
  }
  return response;
}

export async function getJSON(path, options) {
  return (await call("GET", path, options)).json();
}

export async function sendJSON(method, path, body, options = {}) {
  const response = await call(method, path, { ...options, body });
  return response.status === 204 ? null : response.json();
}

async function refusal(response) {
  let reason = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      reason = body.error.reason || reason;
      message = body.error.message || message;
    }
  } catch {
    // not the envelope: keep the status line
  }
  const retry = Number.parseInt(response.headers.get("Retry-After") || "", 10);
  return new ApiError(response.status, reason, message, Number.isFinite(retry) ? retry : null);
}

// A refusal in words, for the user.
export function describe(error) {
  if (!(error instanceof ApiError)) return `Something went wrong: ${error.message || error}`;
  const { status, message } = error;
  switch (status) {
    case 0:
      return `No answer: ${message}. Is the server running?`;
    case 400:
      return `The server refused the request: ${message}.`;
    case 401:
      return `The API key was refused (${message}). Enter a valid key.`;
    case 403:
      return `Not allowed: ${message}.`;
    case 404:
      return `Not found: ${message}.`;
    case 409:
      return `This session is busy: another turn is running (${message}). Wait for it to end, or cancel it.`;
    case 410:
      return `Those events are no longer kept: ${message}.`;
    case 429:
      return `Too many requests: ${message}.`;
    case 503:
      return `The server is draining (shutting down) and takes no new work: ${message}.`;
    default:
      return `The server answered ${status}: ${message}.`;
  }
}
