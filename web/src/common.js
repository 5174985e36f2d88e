// What the playground and the dashboard share: the API key kept in session
// storage, requests that turn every failure into a sentence a person can act
// on, and number formatting.

/** A key kept for this browser tab only (session storage), under `slot`. */
export class KeyStore {
  constructor(slot) {
    this.slot = slot;
  }
  get() {
    try {
      return sessionStorage.getItem(this.slot) || "";
    } catch {
      return "";
    }
  }
  set(key) {
    try {
      sessionStorage.setItem(this.slot, key);
    } catch {
      // Storage refused (private mode): the key lives until the page closes.
    }
  }
  clear() {
    try {
      sessionStorage.removeItem(this.slot);
    } catch {
      // Nothing stored.
    }
  }
}

/** The key area of a page (`#key-state`, `#key-change`, `#key-form`,
 * `#key-input`): shows whether a key is set, asks for one, keeps it in
 * session storage under `slot`. `onSaved` runs after a key was entered;
 * errors go to `showError`. */
export class KeyForm {
  constructor({ slot, setText, missingText, showError, onSaved }) {
    this.store = new KeyStore(slot);
    this.setText = setText;
    this.showError = showError;
    this.fixedText = "";
    const $ = (id) => document.getElementById(id);
    this.state = $("key-state");
    this.change = $("key-change");
    this.form = $("key-form");
    this.input = $("key-input");
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      const key = this.input.value.trim();
      if (!key) {
        showError(missingText);
        return;
      }
      this.store.set(key);
      this.input.value = "";
      showError("");
      this.render();
      onSaved();
    });
    this.change.addEventListener("click", () => this.ask(""));
  }

  /** The key of this tab ("" when none). */
  get() {
    return this.store.get();
  }

  /** No key is asked for: `text` says why (e.g. a shared key). */
  notNeeded(text) {
    this.fixedText = text;
    this.render();
  }

  render() {
    if (this.fixedText) {
      this.state.textContent = this.fixedText;
      this.change.hidden = true;
      this.form.hidden = true;
      return;
    }
    const key = this.get();
    this.state.textContent = key ? this.setText : "";
    this.change.hidden = !key;
    this.form.hidden = Boolean(key);
  }

  /** Forgets the key and asks for another, with `message` (may be ""). */
  ask(message) {
    this.store.clear();
    this.render();
    this.showError(message);
    this.input.value = "";
    this.input.focus();
  }
}

/** A failed request: `status` (0 when the server was not reached), the
 * API's error `code`, a `message` written for the person at the page, and
 * the server's own `field` (e.g. `tests[1].points`) and `detail` (its
 * message); both "" when it gave none. */
export class ApiFailure extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
    this.field = "";
    this.detail = "";
  }
}

/** The message of an API error body `{"error": {"code", "message", "field"}}`. */
function describe(status, body, retryAfter) {
  const error = body && body.error ? body.error : {};
  const code = error.code || `http_${status}`;
  const detail = error.field ? `${error.field}: ${error.message}` : error.message || "";
  const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
  switch (code) {
    case "unauthorized":
      return new ApiFailure(status, code, `The API key was refused (401: ${detail || "invalid api key"}). Check it and enter it again.`);
    case "forbidden":
      return new ApiFailure(status, code, `This key may not do that (403: ${detail}).`);
    case "invalid_job":
    case "invalid_json":
    case "invalid_request":
      return new ApiFailure(status, code, `The server refused the job (400): ${detail}.`);
    case "too_large":
      return new ApiFailure(status, code, `The code is too large (413): ${detail}.`);
    case "queue_full":
      return new ApiFailure(status, code, `The server is busy: ${detail}.${wait}`, retryAfter);
    case "key_limit":
      return new ApiFailure(status, code, `Too many runs at once for this key: ${detail}.${wait}`, retryAfter);
    case "shutting_down":
    case "unavailable":
      return new ApiFailure(status, code, `The server cannot take this now (${status}): ${detail}.${wait}`, retryAfter);
    default:
      return new ApiFailure(status, code, `The server answered ${status}${detail ? `: ${detail}` : ""}.`);
  }
}

/** `fetch` returning the JSON body of a 2xx answer, or throwing an
 * [`ApiFailure`] that says what went wrong. */
export async function api(path, { method = "GET", key = "", body } = {}) {
  const headers = { Accept: "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ApiFailure(0, "network", "The server cannot be reached. Is code-runner still running?");
  }
  let json = null;
  try {
    json = await response.json();
  } catch {
    json = null;
  }
  if (!response.ok) {
    const retry = Number(response.headers.get("Retry-After")) || 0;
    const failure = describe(response.status, json, retry);
    failure.field = (json && json.error && json.error.field) || "";
    failure.detail = (json && json.error && json.error.message) || "";
    throw failure;
  }
  return json;
}

/** Bytes as a short human figure (KiB/MiB). */
export function bytes(n) {
  if (n === null || n === undefined) return "—";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(0)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** A number of milliseconds, or "—". */
export function ms(n) {
  return n === null || n === undefined ? "—" : `${n} ms`;
}

/** Sets `element`'s text and shows it, or hides it when `text` is empty. */
export function show(element, text) {
  element.textContent = text || "";
  element.hidden = !text;
}
