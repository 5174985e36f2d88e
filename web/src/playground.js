// The playground: an editor, a language picker, Run and Stop, a terminal that
// shows the program's output live and sends what is typed to its stdin, and
// the verdict; beside the terminal, the Tests panel (tests.js), whose "Run
// tests" submits the program with test cases (not interactive) and ticks
// them off as the job's `test` events arrive.
//
// Keys: the page holds an API key only when the person types one (kept in
// session storage, for this tab only). When the operator configured a shared
// playground key, jobs go to /v1/playground/jobs and the server submits them
// with that key; the page never sees it. Either way the job's live stream is
// opened with the job's attach token, offered as the WebSocket subprotocol
// `token.<token>` next to `code-runner`, and Stop sends the stream's `kill`
// signal, so both ways work the same after the submit. Each tab is its own
// user: every job carries the tab's random id as its `user`.

import { EditorView, basicSetup } from "codemirror";
import { Compartment, EditorState } from "@codemirror/state";
import { keymap } from "@codemirror/view";
import { indentWithTab } from "@codemirror/commands";
import { StreamLanguage } from "@codemirror/language";
import { python } from "@codemirror/lang-python";
import { javascript } from "@codemirror/lang-javascript";
import { cpp } from "@codemirror/lang-cpp";
import { java } from "@codemirror/lang-java";
import { rust } from "@codemirror/lang-rust";
import { go } from "@codemirror/lang-go";
import { shell } from "@codemirror/legacy-modes/mode/shell";
import { ruby } from "@codemirror/legacy-modes/mode/ruby";
import { perl } from "@codemirror/legacy-modes/mode/perl";
import { lua } from "@codemirror/legacy-modes/mode/lua";
import { haskell } from "@codemirror/legacy-modes/mode/haskell";
import { csharp, kotlin, scala } from "@codemirror/legacy-modes/mode/clike";
import { r } from "@codemirror/legacy-modes/mode/r";
import { sqlite } from "@codemirror/legacy-modes/mode/sql";
import { pascal } from "@codemirror/legacy-modes/mode/pascal";
import { fortran } from "@codemirror/legacy-modes/mode/fortran";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import "./style.css";

import { ApiFailure, KeyForm, api, bytes, ms, show } from "./common.js";
import { TestsPanel } from "./tests.js";

/** A hello world per language id (the catalog's ids; aliases map below). */
const TEMPLATES = {
  python: ["main.py", 'print("Hello, world!")\n'],
  javascript: ["main.js", 'console.log("Hello, world!");\n'],
  typescript: ["main.ts", 'const greeting: string = "Hello, world!";\nconsole.log(greeting);\n'],
  c: ["main.c", '#include <stdio.h>\n\nint main(void) {\n    printf("Hello, world!\\n");\n    return 0;\n}\n'],
  cpp: ["main.cpp", '#include <iostream>\n\nint main() {\n    std::cout << "Hello, world!" << std::endl;\n    return 0;\n}\n'],
  bash: ["main.sh", 'echo "Hello, world!"\n'],
  ruby: ["main.rb", 'puts "Hello, world!"\n'],
  go: ["main.go", 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("Hello, world!")\n}\n'],
  java: ["Main.java", 'public class Main {\n    public static void main(String[] args) {\n        System.out.println("Hello, world!");\n    }\n}\n'],
  rust: ["main.rs", 'fn main() {\n    println!("Hello, world!");\n}\n'],
  kotlin: ["main.kt", 'fun main() {\n    println("Hello, world!")\n}\n'],
  csharp: ["main.cs", 'class Program {\n    static void Main() {\n        System.Console.WriteLine("Hello, world!");\n    }\n}\n'],
  scala: ["Main.scala", '@main def hello(): Unit =\n  println("Hello, world!")\n'],
  php: ["main.php", '<?php\necho "Hello, world!\\n";\n'],
  perl: ["main.pl", 'print "Hello, world!\\n";\n'],
  lua: ["main.lua", 'print("Hello, world!")\n'],
  haskell: ["main.hs", 'main :: IO ()\nmain = putStrLn "Hello, world!"\n'],
  r: ["main.r", 'cat("Hello, world!\\n")\n'],
  sql: ["main.sql", "SELECT 'Hello, world!';\n"],
  pascal: ["main.pas", "program main;\nbegin\n  writeln('Hello, world!');\nend.\n"],
  fortran: ["main.f90", "program main\n  print '(a)', 'Hello, world!'\nend program main\n"],
};

/** Syntax highlighting per language id. */
const MODES = {
  python: () => python(),
  javascript: () => javascript(),
  typescript: () => javascript({ typescript: true }),
  c: () => cpp(),
  cpp: () => cpp(),
  java: () => java(),
  rust: () => rust(),
  go: () => go(),
  bash: () => StreamLanguage.define(shell),
  ruby: () => StreamLanguage.define(ruby),
  perl: () => StreamLanguage.define(perl),
  lua: () => StreamLanguage.define(lua),
  haskell: () => StreamLanguage.define(haskell),
  kotlin: () => StreamLanguage.define(kotlin),
  csharp: () => StreamLanguage.define(csharp),
  scala: () => StreamLanguage.define(scala),
  r: () => StreamLanguage.define(r),
  sql: () => StreamLanguage.define(sqlite),
  pascal: () => StreamLanguage.define(pascal),
  fortran: () => StreamLanguage.define(fortran),
};

/** The entry of `TEMPLATES`/`MODES` for a catalog language: by id, then aliases. */
function lookup(table, language) {
  for (const name of [language.id, ...(language.aliases || [])]) {
    if (table[name]) return table[name];
  }
  return null;
}

/** A template for a language: its file name and code. */
function template(language) {
  const known = lookup(TEMPLATES, language);
  if (known) return { file: known[0], code: known[1], known: true };
  const extension = (language.extensions || [])[0] || "txt";
  return { file: `main.${extension}`, code: "", known: false };
}

const $ = (id) => document.getElementById(id);
const ui = {
  language: $("language"),
  run: $("run"),
  stop: $("stop"),
  grade: $("grade"),
  tabTerminal: $("tab-terminal"),
  tabTests: $("tab-tests"),
  terminalView: $("terminal-view"),
  testsView: $("tests-view"),
  terminalHint: $("terminal-hint"),
  testsHint: $("tests-hint"),
  error: $("error"),
  fileName: $("file-name"),
  templateNote: $("template-note"),
  jobId: $("job-id"),
  dashboardLink: $("dashboard-link"),
  status: $("v-status"),
  reason: $("v-reason"),
  exit: $("v-exit"),
  wall: $("v-wall"),
  cpu: $("v-cpu"),
  memory: $("v-memory"),
  start: $("v-start"),
  detail: $("v-detail"),
  terminalBox: $("terminal"),
  inputWanted: $("input-wanted"),
};

const drafts = {
  get: (id) => {
    try {
      return sessionStorage.getItem(`code-runner.draft.${id}`);
    } catch {
      return null;
    }
  },
  set: (id, code) => {
    try {
      sessionStorage.setItem(`code-runner.draft.${id}`, code);
    } catch {
      // Drafts are a convenience.
    }
  },
};

/** Who this tab's jobs are for: every browser tab is its own user (the
 * job's `user`), a random id kept in the tab's session storage, so it
 * stays the same across runs and reloads of the tab and differs between
 * tabs. Without storage (private mode) it lasts until the page closes. */
const tabUser = (() => {
  const slot = "code-runner.user";
  let user = null;
  try {
    user = sessionStorage.getItem(slot);
  } catch {
    // No storage: a new id below.
  }
  if (!user) {
    const random = crypto.getRandomValues(new Uint8Array(16));
    user = `tab-${Array.from(random, (b) => b.toString(16).padStart(2, "0")).join("")}`;
    try {
      sessionStorage.setItem(slot, user);
    } catch {
      // It lives as long as the page.
    }
  }
  return user;
})();

const state = {
  /** `{shared_key, max_active, dashboard_path}` from /v1/playground. */
  config: { shared_key: false },
  languages: [],
  current: null,
  /** The job being shown: `{id, token, ws, lastSeq, ended, retries,
   * graded}` (`graded`: a run of the Tests panel). */
  job: null,
  /** What has been typed on the terminal's current line. */
  line: "",
};

// ---------------------------------------------------------------------------
// editor and terminal
// ---------------------------------------------------------------------------

const mode = new Compartment();
const editor = new EditorView({
  parent: $("editor"),
  state: EditorState.create({
    doc: "",
    extensions: [
      basicSetup,
      keymap.of([
        { key: "Mod-Shift-Enter", run: () => (grade(), true) },
        { key: "Mod-Enter", run: () => (run(), true) },
        indentWithTab,
      ]),
      mode.of([]),
      EditorView.updateListener.of((update) => {
        if (update.docChanged && state.current) drafts.set(state.current.id, code());
      }),
      EditorView.contentAttributes.of({ "aria-label": "code editor" }),
    ],
  }),
});

function code() {
  return editor.state.doc.toString();
}

function setCode(text) {
  editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: text } });
}

const terminal = new Terminal({
  convertEol: true,
  cursorBlink: true,
  fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace',
  fontSize: 13,
  scrollback: 5000,
  theme: { background: "#1b1e24", foreground: "#e6e6e6" },
});
const fit = new FitAddon();
terminal.loadAddon(fit);
terminal.open($("terminal"));
const refit = () => {
  try {
    fit.fit();
  } catch {
    // Not laid out yet.
  }
};
new ResizeObserver(refit).observe($("terminal"));
refit();

// ---------------------------------------------------------------------------
// the output pane's tabs: Terminal and Tests
// ---------------------------------------------------------------------------

/** Shows the terminal (`"terminal"`) or the Tests panel (`"tests"`). */
function showTab(name) {
  const tests = name === "tests";
  ui.tabTerminal.setAttribute("aria-selected", String(!tests));
  ui.tabTests.setAttribute("aria-selected", String(tests));
  ui.terminalView.hidden = tests;
  ui.terminalHint.hidden = tests;
  ui.testsView.hidden = !tests;
  ui.testsHint.hidden = !tests;
  if (!tests) refit();
}

ui.tabTerminal.addEventListener("click", () => showTab("terminal"));
ui.tabTests.addEventListener("click", () => showTab("tests"));

const panel = new TestsPanel({
  onChange: (count) => {
    ui.grade.disabled = !document.body.dataset.ready || Boolean(state.job && !state.job.ended) || count === 0;
  },
});

const DIM = "\x1b[2m";
const RED = "\x1b[31m";
const RESET = "\x1b[0m";

function note(text) {
  terminal.write(`${DIM}${text}${RESET}\r\n`);
}

/** Shows (or takes down) the prompt that the program waits for input. */
function setWaiting(waiting) {
  ui.inputWanted.hidden = !waiting;
  ui.terminalBox.dataset.waiting = String(waiting);
  if (waiting) terminal.focus();
}

// A small line discipline: the terminal echoes what is typed, Backspace
// edits the line, Enter sends it (with "\n") to the program's stdin,
// Ctrl+D sends what is there and closes stdin, Ctrl+C interrupts.
terminal.onData((data) => {
  const job = state.job;
  if (!job || job.ended) return;
  if (data.startsWith("\x1b")) return; // arrows and other keys: no line editing beyond Backspace
  for (const ch of data) {
    if (ch === "\r" || ch === "\n") {
      setWaiting(false);
      terminal.write("\r\n");
      send({ type: "stdin", data: `${state.line}\n` });
      state.line = "";
    } else if (ch === "\x7f" || ch === "\b") {
      if (state.line) {
        state.line = [...state.line].slice(0, -1).join("");
        terminal.write("\b \b");
      }
    } else if (ch === "\x03") {
      terminal.write("^C\r\n");
      state.line = "";
      send({ type: "signal", signal: "interrupt" });
    } else if (ch === "\x04") {
      if (state.line) send({ type: "stdin", data: state.line });
      state.line = "";
      setWaiting(false);
      terminal.write(`${DIM}^D (input closed)${RESET}\r\n`);
      send({ type: "stdin_close" });
    } else if (ch >= " " || ch === "\t") {
      state.line += ch;
      terminal.write(ch);
    }
  }
});

// ---------------------------------------------------------------------------
// errors, keys, languages
// ---------------------------------------------------------------------------

function showError(text) {
  show(ui.error, text);
}

const keys = new KeyForm({
  slot: "code-runner.api-key",
  setText: "API key set for this tab.",
  missingText: "Enter an API key: ask the operator of this server for one.",
  showError,
  onSaved: () => {},
});

function chooseLanguage(id) {
  const language = state.languages.find((l) => l.id === id) || state.languages[0];
  if (!language) return;
  state.current = language;
  ui.language.value = language.id;
  const start = template(language);
  ui.fileName.textContent = start.file;
  ui.templateNote.textContent = start.known ? "" : ` no template for ${language.name}: write your program here`;
  const factory = lookup(MODES, language);
  editor.dispatch({ effects: mode.reconfigure(factory ? factory() : []) });
  const draft = drafts.get(language.id);
  setCode(draft !== null ? draft : start.code);
  try {
    sessionStorage.setItem("code-runner.language", language.id);
  } catch {
    // A convenience.
  }
}

ui.language.addEventListener("change", () => chooseLanguage(ui.language.value));

async function load() {
  try {
    const [catalog, config] = await Promise.all([api("/v1/languages"), api("/v1/playground")]);
    state.config = config;
    state.languages = catalog.languages;
  } catch (error) {
    showError(`The playground cannot start: ${error.message}`);
    ui.language.innerHTML = "<option>unavailable</option>";
    return;
  }
  if (state.config.dashboard_path) {
    ui.dashboardLink.href = state.config.dashboard_path;
    ui.dashboardLink.hidden = false;
  }
  ui.language.textContent = "";
  for (const language of state.languages) {
    const option = document.createElement("option");
    option.value = language.id;
    option.textContent = `${language.name} ${language.version}`;
    ui.language.append(option);
  }
  ui.language.disabled = false;
  let saved = null;
  try {
    saved = sessionStorage.getItem("code-runner.language");
  } catch {
    saved = null;
  }
  chooseLanguage(saved || (state.languages.some((l) => l.id === "python") ? "python" : state.languages[0]?.id));
  if (state.config.shared_key) {
    const limit = state.config.max_active ? ` (at most ${state.config.max_active} runs at once)` : "";
    keys.notNeeded(`Runs use this server's shared playground key${limit}.`);
  } else {
    keys.render();
  }
  ui.run.disabled = false;
  ui.grade.disabled = panel.count === 0;
  document.body.dataset.ready = "true";
}

// ---------------------------------------------------------------------------
// a run
// ---------------------------------------------------------------------------

function setVerdict(status, fields = {}) {
  ui.status.textContent = status.replace("_", " ");
  ui.status.dataset.status = status;
  ui.reason.textContent = fields.reason ?? "—";
  ui.exit.textContent = fields.exit ?? "—";
  ui.wall.textContent = fields.wall ?? "—";
  ui.cpu.textContent = fields.cpu ?? "—";
  ui.memory.textContent = fields.memory ?? "—";
  ui.start.textContent = fields.start ?? "—";
  ui.detail.textContent = fields.detail ?? "";
}

/** The verdict of a finished job from its result. */
function showResult(result) {
  const compileFailed = result.compile && (!result.run || result.compile.exit_code !== 0);
  const stage = compileFailed ? result.compile : result.run;
  const details = [];
  if (compileFailed) details.push("the compile stage failed: the compiler's messages are in the terminal");
  if (stage && stage.signal) details.push(`ended by ${stage.signal}`);
  if (stage && stage.truncated) details.push("output was cut at the output limit");
  if (stage && stage.pids_limit_reached) details.push("a process start was refused at the process limit");
  if (stage && stage.reason === "killed" && result.status !== "error") details.push("stopped");
  if (result.error) details.push(result.error);
  const start = { warm: "warm", warm_runtime: "warm runtime", cold: "cold" }[result.start] || "—";
  setVerdict(result.status, {
    reason: stage ? (compileFailed ? `compile: ${stage.reason}` : stage.reason) : "—",
    exit: stage && stage.exit_code !== null && stage.exit_code !== undefined ? String(stage.exit_code) : "—",
    wall: stage ? ms(stage.wall_ms) : "—",
    cpu: stage ? ms(stage.cpu_ms) : "—",
    memory: stage ? bytes(stage.memory_peak_bytes) : "—",
    start,
    detail: details.join("; "),
  });
}

function setRunning(running, graded = false) {
  ui.run.disabled = running;
  ui.stop.disabled = !running;
  // A kill reaches the program that runs: in a graded run, that test's.
  ui.stop.title = graded ? "Stop the grading: kill the test that is running and skip the rest" : "Kill the running program";
  ui.language.disabled = running;
  ui.grade.disabled = running || panel.count === 0;
  panel.lock(running);
}

function send(frame) {
  const job = state.job;
  if (!job || !job.ws || job.ws.readyState !== WebSocket.OPEN) {
    (job ? job.note : note)("[not connected to the program: input not sent]");
    return;
  }
  job.ws.send(JSON.stringify(frame));
}

function finish(result) {
  const job = state.job;
  if (!job || job.ended) return;
  job.ended = true;
  // The verdict comes once the terminal has drawn the output before it:
  // xterm parses what it is given (then calls back) and draws it at its
  // next animation frame, and a job's last output often comes in the same
  // moment as its end.
  // A new run waits for this (`job.shown`), so that the verdict never
  // lands on the next run.
  terminal.write("", () =>
    requestAnimationFrame(() => {
      job.shown = true;
      if (job.graded) panel.finish(result, Boolean(job.stopped));
      else if (result) showResult(result);
      setRunning(false);
    }),
  );
}

/** Opens (or reopens, after `lastSeq`) the job's stream with its token. */
function connect(job) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const after = job.lastSeq ? `?after=${job.lastSeq}` : "";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/jobs/${job.id}/ws${after}`, [
    "code-runner",
    `token.${job.token}`,
  ]);
  job.ws = ws;
  ws.onopen = () => {
    job.retries = 0;
  };
  ws.onmessage = (message) => {
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      return;
    }
    if (event.seq) job.lastSeq = event.seq;
    handle(job, event);
  };
  ws.onclose = (close) => {
    if (state.job !== job || job.ended) return;
    if (close.code === 4404) {
      showError("The job no longer exists on the server (it expired).");
      finish(null);
      return;
    }
    // A dropped connection or a server restart: resume after the last event.
    if (job.retries < 5) {
      job.retries += 1;
      const delay = 300 * 2 ** job.retries;
      job.note(`[connection lost (${close.code}); reconnecting]`);
      setTimeout(() => state.job === job && !job.ended && connect(job), delay);
    } else {
      showError("The live output stream could not be (re)opened; the job may still be running on the server.");
      finish(null);
    }
  };
}

/** "3 ahead of you · about 2 s": a queued job's place. */
function placeText(event) {
  const ahead = event.position === 0 ? "next in line" : `${event.position} ahead of you`;
  if (event.eta_ms === null || event.eta_ms === undefined) return ahead;
  const wait = event.eta_ms < 60000
    ? `${Math.max(1, Math.round(event.eta_ms / 1000))} s`
    : `${Math.round(event.eta_ms / 60000)} min`;
  return `${ahead} · about ${wait}`;
}

function handle(job, event) {
  // A wait for input ends with the next output, or with the job.
  if (["stdout", "stderr", "exit", "attempt", "stage"].includes(event.type)) setWaiting(false);
  if (event.type === "queued") {
    // Not stored, no seq: the job's place while it waits.
    setVerdict("queued", { detail: placeText(event) });
    return;
  }
  if (job.graded) {
    if (event.type === "exit") finish(event.result);
    else if (event.type === "error") panel.say("error", `server: ${event.message}`);
    else panel.event(event);
    return;
  }
  switch (event.type) {
    case "status":
      // A queued job's place (a `queued` event, not stored) can come before
      // the stored `status: queued`, which the stream reads from Redis
      // first: that status must not wipe the place it shows.
      if (event.status === "queued" && ui.status.dataset.status === "queued" && ui.detail.textContent) break;
      if (event.status === "queued" || event.status === "running") setVerdict(event.status);
      break;
    case "stage":
      if (event.stage === "compile" && event.state === "start") note("[compiling]");
      if (event.stage === "compile" && event.state === "end" && event.exit_code !== 0) {
        note(`[compilation failed: ${event.reason}${event.exit_code !== undefined ? `, exit code ${event.exit_code}` : ""}]`);
      }
      break;
    case "stdout":
      terminal.write(decode(event));
      break;
    case "stderr":
      terminal.write(RED);
      terminal.write(decode(event));
      terminal.write(RESET);
      break;
    case "attempt":
      // The job's worker was lost and the job runs again from the start:
      // what the terminal shows belongs to the lost attempt.
      terminal.reset();
      note(`[the worker running this job was lost; it runs again (attempt ${event.attempt})]`);
      break;
    case "input_wanted":
      setWaiting(true);
      break;
    case "exit":
      finish(event.result);
      break;
    case "error":
      note(`[server: ${event.message}]`);
      break;
    default:
      break;
  }
}

/** Event data as bytes for the terminal (base64 when not UTF-8). */
function decode(event) {
  if (event.encoding !== "base64") return event.data;
  const binary = atob(event.data);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) out[i] = binary.charCodeAt(i);
  return out;
}

async function run() {
  if (!state.current || (state.job && !state.job.shown)) return;
  showError("");
  const shared = Boolean(state.config.shared_key);
  const key = keys.get();
  if (!shared && !key) {
    keys.ask("Enter an API key to run code (ask the operator of this server for one).");
    return;
  }
  const start = template(state.current);
  const body = {
    language: state.current.id,
    files: [{ name: start.file, content: code() }],
    interactive: true,
    user: tabUser,
  };
  terminal.reset();
  setWaiting(false);
  state.line = "";
  setRunning(true);
  setVerdict("submitting");
  ui.jobId.textContent = "";
  showTab("terminal");
  let accepted;
  try {
    accepted = shared
      ? await api("/v1/playground/jobs", { method: "POST", body })
      : await api("/v1/jobs", { method: "POST", key, body });
  } catch (error) {
    setRunning(false);
    setVerdict("idle");
    if (error instanceof ApiFailure && error.code === "unauthorized" && !shared) {
      keys.ask(error.message);
    } else {
      showError(error.message);
    }
    return;
  }
  ui.jobId.textContent = `job ${accepted.id}`;
  setVerdict("queued");
  state.job = { id: accepted.id, token: accepted.token, ws: null, lastSeq: 0, ended: false, retries: 0, note };
  connect(state.job);
  terminal.focus();
}

/** "Run tests": the program with the Tests panel's tests, not interactive;
 * the panel follows the job's stream. */
async function grade() {
  if (!state.current || (state.job && !state.job.shown) || panel.count === 0) return;
  showError("");
  showTab("tests");
  const shared = Boolean(state.config.shared_key);
  const key = keys.get();
  if (!shared && !key) {
    keys.ask("Enter an API key to run code (ask the operator of this server for one).");
    return;
  }
  const start = template(state.current);
  const body = {
    language: state.current.id,
    files: [{ name: start.file, content: code() }],
    ...panel.job(),
    user: tabUser,
  };
  setRunning(true, true);
  panel.begin();
  ui.jobId.textContent = "";
  let accepted;
  try {
    accepted = shared
      ? await api("/v1/playground/jobs", { method: "POST", body })
      : await api("/v1/jobs", { method: "POST", key, body });
  } catch (error) {
    setRunning(false);
    panel.refused(error);
    if (error instanceof ApiFailure && error.code === "unauthorized" && !shared) {
      keys.ask(error.message);
    } else {
      showError(error.message);
    }
    return;
  }
  ui.jobId.textContent = `job ${accepted.id}`;
  const job = { id: accepted.id, token: accepted.token, ws: null, lastSeq: 0, ended: false, retries: 0, graded: true };
  job.note = (text) => panel.say("running", text.replace(/^\[|\]$/g, ""));
  state.job = job;
  connect(job);
}

function stop() {
  if (!state.job || state.job.ended) return;
  send({ type: "signal", signal: "kill" });
  state.job.stopped = true;
  state.job.note(state.job.graded ? "[stop: killing the test that is running]" : "[stop: killing the program]");
}

ui.run.addEventListener("click", run);
ui.grade.addEventListener("click", grade);
ui.stop.addEventListener("click", stop);
window.addEventListener("beforeunload", () => {
  if (state.job && state.job.ws) state.job.ws.close(1000);
});

setVerdict("idle");
load();
