// The playground's Tests panel: test cases a person writes (stdin, expected
// output, an optional name and points), the comparison and stop-on-failure,
// and the verdicts of a graded run as its `test` events arrive.
//
// The panel knows nothing of keys or streams: playground.js submits the job
// the panel describes (`job()`), then hands it the job's events (`event()`)
// and its result (`finish()`). The rows a run was submitted with are kept
// aside, so the verdict of test i lands on the row that was test i.

import { bytes, ms } from "./common.js";
import "./tests.css";

/** Words for a verdict (the API's names use underscores). */
const VERDICTS = {
  accepted: "accepted",
  wrong_answer: "wrong answer",
  time_limit: "time limit",
  memory_limit: "memory limit",
  runtime_error: "runtime error",
  output_limit: "output limit",
  skipped: "skipped",
  checker_error: "checker error",
  compile_error: "compile error",
};

const STORAGE = "code-runner.tests";

/** A number as a short figure: integers as they are, else two decimals. */
function figure(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return Number.isInteger(n) ? String(n) : String(Number(n.toFixed(2)));
}

/** The text of a result's output field (base64 when not UTF-8). */
function text(data, encoding) {
  if (!data) return "";
  if (encoding !== "base64") return data;
  const binary = atob(data);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) out[i] = binary.charCodeAt(i);
  return new TextDecoder().decode(out);
}

/** `value` with a final newline, as a file of lines has (empty stays empty). */
function lines(value) {
  return value && !value.endsWith("\n") ? `${value}\n` : value;
}

function element(tag, className, content) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (content !== undefined) node.textContent = content;
  return node;
}

/** One test case of the panel: its inputs, and the result of the last run. */
class Row {
  constructor(panel, saved = {}) {
    this.node = element("li", "test");
    this.node.dataset.state = "idle";
    const head = element("div", "test-head");
    this.number = element("span", "test-number");
    this.name = element("input", "test-name");
    this.name.type = "text";
    this.name.placeholder = "name (optional)";
    this.name.maxLength = 128;
    this.name.spellcheck = false;
    const pointsLabel = element("label", "test-points", "points ");
    this.points = element("input");
    this.points.type = "number";
    this.points.min = "0";
    this.points.step = "any";
    this.points.placeholder = "1";
    pointsLabel.append(this.points);
    this.badge = element("span", "verdict-badge");
    this.remove = element("button", "remove", "×");
    this.remove.type = "button";
    head.append(this.number, this.name, pointsLabel, this.badge, this.remove);

    const io = element("div", "test-io");
    const stdinLabel = element("label", "", "stdin");
    this.stdin = element("textarea", "test-stdin");
    const expectedLabel = element("label", "", "expected output");
    this.expected = element("textarea", "test-expected");
    this.expected.placeholder = "empty: any output passes if the program exits 0";
    for (const [label, area] of [[stdinLabel, this.stdin], [expectedLabel, this.expected]]) {
      area.rows = 2;
      area.spellcheck = false;
      area.autocomplete = "off";
      label.append(area);
      io.append(label);
    }
    this.figures = element("div", "test-figures");
    this.detail = element("div", "test-detail");
    this.output = element("details", "test-output");
    this.node.append(head, io, this.figures, this.detail, this.output);

    this.name.value = saved.name || "";
    this.points.value = saved.points ?? "";
    this.stdin.value = saved.stdin || "";
    this.expected.value = saved.expected || "";
    for (const input of [this.name, this.points, this.stdin, this.expected]) {
      input.addEventListener("input", () => {
        input.removeAttribute("aria-invalid");
        panel.save();
      });
    }
    this.remove.addEventListener("click", () => panel.removeRow(this));
    this.clear();
  }

  /** Numbers the row (1-based, as people count) and labels its inputs. */
  setNumber(n) {
    this.number.textContent = String(n);
    this.name.setAttribute("aria-label", `test ${n} name`);
    this.points.setAttribute("aria-label", `test ${n} points`);
    this.stdin.setAttribute("aria-label", `test ${n} stdin`);
    this.expected.setAttribute("aria-label", `test ${n} expected output`);
    this.remove.title = `Remove test ${n}`;
    this.remove.setAttribute("aria-label", `remove test ${n}`);
  }

  saved() {
    return {
      name: this.name.value,
      points: this.points.value,
      stdin: this.stdin.value,
      expected: this.expected.value,
    };
  }

  /** The test as the API takes it. A final newline is added to stdin and
   * to the expected output when missing: a text box rarely ends with one,
   * a program's input and output usually do. */
  spec() {
    const test = { stdin: lines(this.stdin.value) };
    const name = this.name.value.trim();
    if (name) test.name = name;
    if (this.expected.value !== "") test.expected_stdout = lines(this.expected.value);
    if (this.points.value !== "") test.points = Number(this.points.value);
    return test;
  }

  /** Shows the row's state: `idle` (no result), `waiting`, `running`, or
   * `done` with a verdict. */
  setState(stateName, verdict = "") {
    this.node.dataset.state = stateName;
    if (verdict) this.node.dataset.verdict = verdict;
    else delete this.node.dataset.verdict;
    this.badge.dataset.verdict = verdict || stateName;
    this.badge.textContent = { idle: "", waiting: "waiting", running: "running…" }[stateName] ?? VERDICTS[verdict] ?? verdict;
  }

  /** No result shown. */
  clear() {
    this.setState("idle");
    this.empty();
  }

  empty() {
    this.badge.title = "";
    this.figures.textContent = "";
    this.detail.textContent = "";
    this.output.textContent = "";
    this.output.hidden = true;
  }

  /** The verdict and figures of a test's result (or its `test` end event).
   * `quiet`: the reason of a skip is said elsewhere (a compile error). */
  show(result, quiet = false) {
    this.empty();
    this.setState("done", result.verdict);
    // A time limit's message says which one (wall clock or CPU).
    if (result.verdict === "time_limit" && result.time_limit) this.badge.title = `over the ${result.time_limit} time limit`;
    if (result.verdict !== "skipped") {
      const parts = [`${ms(result.wall_ms)} wall`, `${ms(result.cpu_ms)} cpu`, bytes(result.memory_peak_bytes)];
      // How the run ended is in its message ("exited with code 3", "killed
      // by SIGSEGV") when it ended badly.
      if (!result.message) {
        if (result.exit_code !== null && result.exit_code !== undefined && result.exit_code !== 0) {
          parts.push(`exit code ${result.exit_code}`);
        }
        if (result.signal) parts.push(result.signal);
      }
      parts.push(`${figure(result.score)}/${figure(result.points)} points`);
      this.figures.textContent = parts.join(" · ");
    }
    const difference = result.difference;
    if (difference) {
      const where = element("div", "diff-where",
        `first difference: line ${difference.line}${difference.token ? `, token ${difference.token}` : ""}`);
      const table = element("dl", "diff");
      for (const [label, value, ended] of [
        ["expected", difference.expected, "(the expected output ends here)"],
        ["got", difference.got, "(the output ends here)"],
      ]) {
        table.append(element("dt", "", label));
        const dd = element("dd");
        if (value === null || value === undefined) dd.append(element("span", "muted", ended));
        else dd.append(element("code", "", value));
        table.append(dd);
      }
      this.detail.append(where, table);
    }
    if (result.message && !(quiet && result.verdict === "skipped")) {
      this.detail.append(element("div", "test-message", result.message));
    }
    if (result.stdout || result.stderr) {
      this.output.append(element("summary", "", "output"));
      if (result.stdout) this.output.append(element("pre", "out", result.stdout));
      if (result.stderr) this.output.append(element("pre", "err", result.stderr));
      this.output.hidden = false;
    }
  }
}

export class TestsPanel {
  /** `onChange(count)` runs when the number of tests changes. */
  constructor({ onChange }) {
    const $ = (id) => document.getElementById(id);
    this.form = $("tests-form");
    this.list = $("test-list");
    this.add = $("add-test");
    this.check = $("check");
    this.floatOptions = $("float-options");
    this.abs = $("float-abs");
    this.rel = $("float-rel");
    this.stopOnFailure = $("stop-on-failure");
    this.summary = $("tests-summary");
    this.tally = $("tests-tally");
    this.onChange = onChange;
    this.rows = [];
    /** The rows the current (or last) run was submitted with. */
    this.submitted = [];

    const saved = this.load();
    for (const test of saved.tests?.length ? saved.tests : [{}]) this.addRow(test);
    this.check.value = saved.check || "trim";
    if (!this.check.value) this.check.value = "trim";
    this.abs.value = saved.abs || "";
    this.rel.value = saved.rel || "";
    this.stopOnFailure.checked = Boolean(saved.stop);
    this.floatOptions.hidden = this.check.value !== "float";

    this.add.addEventListener("click", () => {
      const row = this.addRow({});
      this.save();
      row.stdin.focus();
    });
    const describeCheck = () => {
      const option = this.check.selectedOptions[0];
      this.check.title = option ? `${option.value}: ${option.title}` : "";
    };
    describeCheck();
    this.check.addEventListener("change", () => {
      describeCheck();
      this.floatOptions.hidden = this.check.value !== "float";
      this.check.removeAttribute("aria-invalid");
      this.save();
    });
    for (const input of [this.abs, this.rel, this.stopOnFailure]) {
      input.addEventListener(input === this.stopOnFailure ? "change" : "input", () => {
        input.removeAttribute("aria-invalid");
        this.save();
      });
    }
  }

  load() {
    try {
      return JSON.parse(sessionStorage.getItem(STORAGE) || "{}") || {};
    } catch {
      return {};
    }
  }

  save() {
    const saved = {
      tests: this.rows.map((row) => row.saved()),
      check: this.check.value,
      abs: this.abs.value,
      rel: this.rel.value,
      stop: this.stopOnFailure.checked,
    };
    try {
      sessionStorage.setItem(STORAGE, JSON.stringify(saved));
    } catch {
      // The tests are kept for the tab as a convenience.
    }
  }

  addRow(saved) {
    const row = new Row(this, saved);
    this.rows.push(row);
    this.list.append(row.node);
    this.renumber();
    return row;
  }

  removeRow(row) {
    this.rows = this.rows.filter((r) => r !== row);
    row.node.remove();
    this.renumber();
    this.save();
    (this.rows[0]?.stdin ?? this.add).focus();
  }

  renumber() {
    this.rows.forEach((row, index) => row.setNumber(index + 1));
    this.tally.textContent = String(this.rows.length);
    this.onChange(this.rows.length);
  }

  get count() {
    return this.rows.length;
  }

  /** No editing while a run is on: its rows are the ones submitted. */
  lock(locked) {
    this.form.disabled = locked;
  }

  /** What the job needs besides its program: `tests`, `check`, `stop_on_failure`. */
  job() {
    const number = (input) => {
      const value = input.value.trim();
      if (value === "") return undefined;
      // Not a number: sent as it is, and the server names the field.
      return Number.isFinite(Number(value)) ? Number(value) : value;
    };
    let check = this.check.value;
    if (check === "float") {
      const abs = number(this.abs);
      const rel = number(this.rel);
      if (abs !== undefined || rel !== undefined) check = { mode: "float", abs, rel };
    }
    const job = { tests: this.rows.map((row) => row.spec()), check };
    if (this.stopOnFailure.checked) job.stop_on_failure = true;
    return job;
  }

  /** A run was submitted with the current rows: they wait for their turn. */
  begin() {
    this.submitted = [...this.rows];
    for (const input of this.form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
    for (const row of this.submitted) {
      row.clear();
      row.setState("waiting");
    }
    this.say("queued", "submitting…");
  }

  /** The submit was refused: back to no result, and the field the server
   * named (e.g. `tests[1].points`) marked on its row. */
  refused(failure) {
    for (const row of this.submitted) row.clear();
    this.submitted = [];
    const field = failure.field || "";
    const test = field.match(/^tests\[(\d+)\]\.(\w+)/);
    // The banner has the server's words; here the field is named as the
    // panel numbers it (tests[0] is test 1).
    let where = field;
    if (test) where = `test ${Number(test[1]) + 1}, ${test[2].replace("expected_stdout", "expected output")}`;
    this.say("refused", where && failure.detail ? `Not run: ${where}: ${failure.detail}` : `Not run: ${failure.message}`);
    let input = null;
    if (test) {
      const row = this.rows[Number(test[1])];
      input = row && { name: row.name, points: row.points, stdin: row.stdin, expected_stdout: row.expected }[test[2]];
    } else if (field === "check.abs") {
      input = this.abs;
    } else if (field === "check.rel") {
      input = this.rel;
    } else if (field.startsWith("check")) {
      input = this.check;
    } else if (field === "stop_on_failure") {
      input = this.stopOnFailure;
    }
    if (input) {
      input.setAttribute("aria-invalid", "true");
      input.scrollIntoView({ block: "nearest" });
    }
  }

  /** A status line in the summary: `kind` styles it, `message` says it. */
  say(kind, message, detail = "") {
    this.summary.textContent = "";
    this.summary.dataset.kind = kind;
    const line = element("div", "summary-line");
    line.append(element("span", "summary-text", message));
    this.summary.append(line);
    if (detail) this.summary.append(element("pre", "compile-output", detail));
    this.summary.hidden = false;
  }

  /** Where a run is, between its events. */
  progress(what) {
    const done = this.submitted.filter((row) => row.node.dataset.state === "done").length;
    this.say("running", `${what} · ${done}/${this.submitted.length} done`);
  }

  /** One event of the graded job's stream. */
  event(event) {
    switch (event.type) {
      case "status":
        if (event.status === "queued") this.say("queued", "queued");
        else if (event.status === "running") this.progress("running");
        break;
      case "stage":
        if (event.stage === "compile" && event.state === "start") this.progress("compiling");
        break;
      case "test": {
        const row = this.submitted[event.index];
        if (!row) break;
        if (event.state === "start") {
          row.setState("running");
          this.progress(`running test ${event.index + 1}`);
        } else {
          row.show(event);
          this.progress("running");
        }
        break;
      }
      case "attempt":
        // The worker was lost and the job runs again from the start.
        for (const row of this.submitted) {
          row.clear();
          row.setState("waiting");
        }
        this.say("queued", `the worker was lost; the tests run again (attempt ${event.attempt})`);
        break;
      default:
        break;
    }
  }

  /** The job's result (`null`: the stream was lost; the banner says why);
   * `stopped`: Stop was pressed during the run. */
  finish(result, stopped = false) {
    if (!result) {
      for (const row of this.submitted) if (row.node.dataset.state !== "done") row.clear();
      this.say("error", "no result: the job's stream was lost");
      return;
    }
    const compileFailed = result.verdict === "compile_error";
    for (const test of result.tests || []) {
      const row = this.submitted[test.index];
      if (row) row.show(test, compileFailed);
    }
    for (const row of this.submitted) if (row.node.dataset.state !== "done") row.clear();
    if (!result.tests) {
      this.say("error", `${result.status.replace("_", " ")}: ${result.error || "the job ended without test results"}`);
      return;
    }
    this.summary.textContent = "";
    this.summary.dataset.kind = result.verdict === "accepted" ? "accepted" : "failed";
    const line = element("div", "summary-line");
    const badge = element("span", "verdict-badge", VERDICTS[result.verdict] ?? result.verdict);
    badge.dataset.verdict = result.verdict;
    badge.id = "tests-verdict";
    line.append(
      element("span", "summary-passed", `${result.passed}/${result.total} passed`),
      " · ",
      element("span", "summary-score", `score ${figure(result.score)}/${figure(result.max_score)}`),
      " · ",
      badge,
    );
    this.summary.append(line);
    if (stopped) this.summary.append(element("div", "test-message", "Stopped: the test that was running was killed, the rest were skipped"));
    if (result.error) this.summary.append(element("div", "test-message", result.error));
    if (compileFailed && result.compile) {
      const out = [text(result.compile.stdout, result.compile.stdout_encoding), text(result.compile.stderr, result.compile.stderr_encoding)]
        .filter((part) => part.trim())
        .join("\n");
      const why = result.compile.reason === "exited" ? `exit code ${result.compile.exit_code}` : result.compile.reason;
      this.summary.append(element("div", "test-message", `the compile stage failed (${why}); no test ran`));
      if (out) this.summary.append(element("pre", "compile-output", out));
    }
    this.summary.hidden = false;
  }
}
