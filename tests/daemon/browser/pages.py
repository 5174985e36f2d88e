"""Browser tests of the playground and the dashboard, driven by Selenium.

Run by tests/daemon/browser/mod.rs, which starts the daemons (a real `code-runner
serve` each, with its own redis-server) and passes them in the environment:

    CODE_RUNNER_URL           a daemon whose playground asks for a key (at /)
    CODE_RUNNER_SHARED_URL    a daemon with a shared playground key (at /playground)
    CODE_RUNNER_KEY           a key of both daemons
    CODE_RUNNER_ADMIN_KEY     an admin key of the first daemon
    CODE_RUNNER_PLAYGROUND_KEY  the second daemon's shared playground key
                              (to read the visitors' jobs back)
    CODE_RUNNER_SHARED_ADMIN_KEY  an admin key of the second daemon, whose
                              warm pool waits for memory
    CODE_RUNNER_SCREENSHOTS   where each test saves a screenshot of its state
    CODE_RUNNER_BROWSER       chromium (default) or firefox

Each test asserts what a person at the page would see: the terminal's text,
the verdict's figures, the error banner. Every test also asserts that the
browser logged no error but the ones it expects (Chromium's browser log;
geckodriver has no log API, so Firefox is told to print the console to its
output, which geckodriver's log file catches).
"""

import itertools
import json
import os
import re
import shutil
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

URL = os.environ["CODE_RUNNER_URL"].rstrip("/")
SHARED_URL = os.environ["CODE_RUNNER_SHARED_URL"].rstrip("/")
KEY = os.environ["CODE_RUNNER_KEY"]
ADMIN_KEY = os.environ["CODE_RUNNER_ADMIN_KEY"]
PLAYGROUND_KEY = os.environ["CODE_RUNNER_PLAYGROUND_KEY"]
SHARED_ADMIN_KEY = os.environ["CODE_RUNNER_SHARED_ADMIN_KEY"]
SHOTS = os.environ["CODE_RUNNER_SCREENSHOTS"]
BROWSER = os.environ.get("CODE_RUNNER_BROWSER", "chromium")

# A laptop screen.
WIDTH, HEIGHT = 1366, 768
# Longest a job of these tests may take to show its verdict (a cold C
# compile on a busy machine included).
JOB_DEADLINE = 60

driver = None
profile_dir = None
# Firefox: geckodriver's log, and how much of it the tests have read.
firefox_log = None
firefox_log_read = 0


def chromium():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile_dir}",
        f"--window-size={WIDTH},{HEIGHT}",
    ]:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def firefox():
    from selenium.webdriver.firefox.service import Service

    options = webdriver.FirefoxOptions()
    options.binary_location = "/usr/bin/firefox-esr"
    options.add_argument("-headless")
    options.add_argument("-profile")
    options.add_argument(os.path.join(profile_dir, "profile"))
    for name, value in {
        "network.proxy.type": 0,
        "app.update.enabled": False,
        "browser.shell.checkDefaultBrowser": False,
        "datareporting.policy.dataSubmissionEnabled": False,
        "toolkit.telemetry.enabled": False,
        "network.captive-portal-service.enabled": False,
        "browser.safebrowsing.malware.enabled": False,
        "browser.safebrowsing.phishing.enabled": False,
        "extensions.update.enabled": False,
        # The page's console goes to Firefox's output, hence to the log;
        # the browser's own console does not.
        "devtools.console.stdout.content": True,
        "devtools.console.stdout.chrome": False,
    }.items():
        options.set_preference(name, value)
    geckodriver = os.environ.get("CODE_RUNNER_GECKODRIVER") or shutil.which("geckodriver")
    if not geckodriver:
        raise SystemExit("geckodriver is missing: run scripts/install-firefox")
    global firefox_log
    firefox_log = os.path.join(profile_dir, "geckodriver.log")
    browser = webdriver.Firefox(service=Service(geckodriver, log_path=firefox_log), options=options)
    browser.set_window_size(WIDTH, HEIGHT)
    return browser


def setUpModule():
    global driver, profile_dir
    os.makedirs(SHOTS, exist_ok=True)
    profile_dir = tempfile.mkdtemp(prefix="code-runner-browser-")
    # Firefox wants its profile folder to itself; the log goes beside it.
    if BROWSER == "firefox":
        os.makedirs(os.path.join(profile_dir, "profile"))
    driver = firefox() if BROWSER == "firefox" else chromium()


def tearDownModule():
    if driver is not None:
        driver.quit()
    shutil.rmtree(profile_dir, ignore_errors=True)


def http(method, url, key=None, body=None):
    """A request to the API outside the browser; (status, JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def continues(line):
    """Whether a line of Firefox's output continues the message above it
    (indented, blank, or a stack frame like `f@resource://x.mjs:1:5`)."""
    return not line.strip() or line[0].isspace() or re.match(r"^\S*@\S+:\d+:\d+$", line.strip())


class Page(unittest.TestCase):
    """What every test shares: a clean tab, waits, the console check."""

    # Browser log entries a test expects (substrings); any other error fails it.
    expected_errors = ()

    def setUp(self):
        driver.get("about:blank")
        driver.delete_all_cookies()
        self.browser_errors()  # drop what earlier tests left

    def tearDown(self):
        errors = self.browser_errors()
        unexpected = [e for e in errors if not any(x in e for x in self.expected_errors)]
        self.assertEqual(unexpected, [], "the browser logged errors")

    def browser_errors(self):
        """The errors the browser logged since the last call."""
        global firefox_log_read
        if BROWSER == "chromium":
            return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        with open(firefox_log, encoding="utf-8", errors="replace") as log:
            log.seek(firefox_log_read)
            lines = log.readlines()
            firefox_log_read = log.tell()
        # Uncaught errors of the page name its address. Firefox prints some
        # of its own too (it cannot reach its update and experiment
        # servers here): those name its resource:// or chrome:// files in
        # the message or the stack lines under it.
        origins = (URL, SHARED_URL)
        errors = []
        for index, line in enumerate(lines):
            entry = line + "".join(itertools.takewhile(continues, lines[index + 1:]))
            if line.startswith("console.error:") and not ("resource://" in entry or "chrome://" in entry):
                errors.append(entry.strip())
            elif line.startswith("JavaScript error:") and any(o in line for o in origins):
                errors.append(entry.strip())
        return errors

    def open(self, url):
        """Opens a page with empty session storage and waits until it is ready."""
        driver.get(url)
        driver.execute_script("sessionStorage.clear()")
        driver.get(url)
        self.wait(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true",
                  "the page did not become ready")

    def wait(self, condition, message, timeout=JOB_DEADLINE):
        # The dashboard and the queue place re-render their elements while a
        # condition reads them; an element replaced between find and read is
        # asked again on the next poll, not taken for a failure.
        try:
            return WebDriverWait(driver, timeout, poll_frequency=0.1,
                                 ignored_exceptions=[StaleElementReferenceException]).until(condition)
        except TimeoutException:
            self.fail(f"{message}; terminal:\n{self.terminal()}\nerror banner: {self.text('error')!r}")

    def el(self, element_id):
        return driver.find_element(By.ID, element_id)

    def text(self, element_id):
        return self.el(element_id).text

    def shot(self, name):
        path = os.path.join(SHOTS, f"{BROWSER}-{name}.png")
        driver.save_screenshot(path)
        return path

    def terminal(self):
        """The terminal's visible text, one line per row, trailing blanks cut.

        Read in one script: xterm redraws its rows (the cursor's blink
        too), and rows looked up before a redraw are stale after it."""
        try:
            texts = driver.execute_script(
                "return Array.from(document.querySelectorAll("
                "'#terminal .xterm-rows > div'), (row) => row.textContent);")
        except Exception:  # noqa: BLE001 - before the page exists
            return ""
        lines = [t.replace("\u00a0", " ").rstrip() for t in texts or []]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)

    def terminal_shows(self, *texts, context=""):
        """Waits until the terminal shows each of `texts` (failing, with
        `context`, if it never does), and returns its text: xterm draws what
        it is given at its next frame. (The page shows a verdict only once
        the output before it is drawn: test 2c.)"""
        self.wait(lambda d: all(text in self.terminal() for text in texts),
                  f"{context}{': ' if context else ''}the terminal does not show {texts!r}")
        return self.terminal()

    def use_key(self, key):
        """Types `key` into the page's key form and submits it."""
        field = self.el("key-input")
        self.assertTrue(field.is_displayed(), "the page asks for a key")
        field.send_keys(key)
        self.el("key-save").click()

    def type_code(self, lines):
        """Replaces the editor's text by typing `lines`, as a person would."""
        content = driver.find_element(By.CSS_SELECTOR, "#editor .cm-content")
        content.click()
        content.send_keys(Keys.CONTROL, "a")
        content.send_keys(Keys.DELETE)
        for index, line in enumerate(lines):
            content.send_keys(line)
            content.send_keys(Keys.ESCAPE)  # close an autocompletion popup
            if index < len(lines) - 1:
                content.send_keys(Keys.ENTER)
        self.assertEqual(self.code(), "\n".join(lines))

    def code(self):
        lines = driver.find_elements(By.CSS_SELECTOR, "#editor .cm-line")
        return "\n".join(l.get_attribute("textContent") for l in lines)

    def run_and_wait(self, status=None):
        self.el("run").click()
        self.wait(lambda d: self.text("v-status").lower() not in ("idle", "submitting", "queued", "running")
                  or self.el("error").is_displayed(),
                  "no verdict")
        verdict = self.verdict()
        if status:
            self.assertEqual(verdict["status"], status, verdict)
        return verdict

    def verdict(self):
        return {
            "status": self.text("v-status").lower().replace(" ", "_"),
            "reason": self.text("v-reason"),
            "exit": self.text("v-exit"),
            "wall": self.text("v-wall"),
            "cpu": self.text("v-cpu"),
            "memory": self.text("v-memory"),
            "start": self.text("v-start"),
            "detail": self.text("v-detail"),
        }

    def type_in_terminal(self, text):
        box = driver.find_element(By.CSS_SELECTOR, "#terminal .xterm-helper-textarea")
        box.send_keys(text)

    def plot_points(self, svg_id):
        """How many points the line of a dashboard plot has (0: no line yet)."""
        lines = driver.find_elements(By.CSS_SELECTOR, f"#{svg_id} polyline")
        return len(lines[0].get_attribute("points").split()) if lines else 0

    def assert_fits_the_screen(self):
        width = driver.execute_script("return document.documentElement.scrollWidth")
        inner = driver.execute_script("return window.innerWidth")
        self.assertLessEqual(width, inner, "the page scrolls sideways on a laptop screen")
        for element_id in ["run", "stop", "language"]:
            bottom = driver.execute_script(
                "return arguments[0].getBoundingClientRect().bottom", self.el(element_id))
            self.assertLess(bottom, HEIGHT, f"#{element_id} is below the fold")


class Playground(Page):
    def test_1_page_loads_with_every_language_and_no_console_error(self):
        self.open(f"{URL}/")
        _, catalog = http("GET", f"{URL}/v1/languages")
        options = Select(self.el("language")).options
        self.assertEqual([o.get_attribute("value") for o in options],
                         [l["id"] for l in catalog["languages"]])
        self.assertEqual(Select(self.el("language")).first_selected_option.get_attribute("value"), "python")
        self.assertEqual(self.code(), 'print("Hello, world!")\n')
        self.assertEqual(self.text("file-name"), "main.py")
        self.assertTrue(self.el("key-form").is_displayed(), "the page asks for a key")
        self.assertEqual(self.text("v-status").lower(), "idle")
        # Highlighting: the editor marks up the Python source.
        self.assertTrue(driver.find_elements(By.CSS_SELECTOR, "#editor .cm-line span"),
                        "no syntax highlighting")
        # Every language has a template that is not empty.
        for option in options:
            Select(self.el("language")).select_by_value(option.get_attribute("value"))
            self.assertIn("Hello, world!", self.code(), option.get_attribute("value"))
        Select(self.el("language")).select_by_value("python")
        self.assert_fits_the_screen()
        self.shot("01-loaded")

    def test_2_python_hello_world_runs_and_its_output_appears(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.assertFalse(self.el("key-form").is_displayed(), "the key form stays open")
        verdict = self.run_and_wait("succeeded")
        self.terminal_shows("Hello, world!")
        self.assertEqual((verdict["reason"], verdict["exit"]), ("exited", "0"), verdict)
        for figure in ("wall", "cpu"):
            self.assertRegex(verdict[figure], r"^\d+ ms$", verdict)
        self.assertRegex(verdict["memory"], r"^\d+(\.\d)? (MiB|KiB)$", verdict)
        # The server keeps warm python sandboxes, their interpreter started
        # ahead: the run starts on one.
        self.assertEqual(verdict["start"], "warm runtime", verdict)
        self.assertRegex(self.text("job-id"), r"^job [0-9a-f-]{36}$")
        self.assertEqual(driver.execute_script("return sessionStorage.getItem('code-runner.api-key')"), KEY)
        self.shot("02-hello-world")

    def test_2b_every_languages_template_runs_and_says_hello(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        _, catalog = http("GET", f"{URL}/v1/languages")
        for language in catalog["languages"]:
            Select(self.el("language")).select_by_value(language["id"])
            verdict = self.run_and_wait()
            self.assertEqual(verdict["status"], "succeeded", f"{language['id']}: {verdict}\n{self.terminal()}")
            self.terminal_shows("Hello, world!", context=language["id"])
        self.shot("02b-last-template")

    def test_2c_the_verdict_comes_after_the_last_output_is_drawn(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.type_code(["print('first line')", "print('the last line')"])
        # What the terminal shows at the moment the verdict is set: the
        # program's last output comes in the same moment as its end.
        driver.execute_script("""
            window.atVerdict = null;
            const status = document.getElementById('v-status');
            new MutationObserver(() => {
              const now = status.textContent.toLowerCase();
              if (window.atVerdict === null
                  && !['idle', 'submitting', 'queued', 'running'].includes(now)) {
                window.atVerdict = Array.from(
                  document.querySelectorAll('#terminal .xterm-rows > div'),
                  (row) => row.textContent).join('\\n');
              }
            }).observe(status, {childList: true, characterData: true, subtree: true});
        """)
        self.run_and_wait("succeeded")
        at_verdict = driver.execute_script("return window.atVerdict")
        self.assertIn("the last line", at_verdict or "", f"the terminal when the verdict came: {at_verdict!r}")
        self.shot("02c-verdict-after-output")

    def test_3_interactive_program_reads_two_typed_lines(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.assertFalse(self.el("key-form").is_displayed(), "the key form stays open")
        self.type_code([
            'first = input("first? ")',
            'second = input("second? ")',
            'print("you said", first, "and", second)',
        ])
        self.el("run").click()
        self.wait(lambda d: "first?" in self.terminal(), "no first prompt")
        # The program waits in input(): the page says so (input_wanted).
        self.wait(lambda d: self.el("input-wanted").is_displayed(), "no waiting-for-input prompt")
        self.assertEqual(self.el("terminal").get_attribute("data-waiting"), "true")
        self.assertIn("waiting for your input", self.text("input-wanted"))
        self.shot("03-waiting-for-input")
        self.type_in_terminal("alpha\n")
        self.wait(lambda d: "second?" in self.terminal(), "no second prompt")
        self.wait(lambda d: self.el("input-wanted").is_displayed(), "no prompt for the second input")
        self.type_in_terminal("beta\n")
        self.wait(lambda d: self.text("v-status").lower() == "succeeded", "the program did not succeed")
        self.assertFalse(self.el("input-wanted").is_displayed(), "the prompt stays after the end")
        terminal = self.terminal_shows("you said alpha and beta")
        self.assertIn("first? alpha", terminal)
        self.assertIn("second? beta", terminal)
        self.assertIn("you said alpha and beta", terminal)
        self.shot("03-interactive")

    def test_4_stop_ends_a_running_loop_with_killed(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.assertFalse(self.el("key-form").is_displayed(), "the key form stays open")
        self.type_code([
            "import time",
            "i = 0",
            'while True: print("tick", i, flush=True); i += 1; time.sleep(0.2)',
        ])
        self.el("run").click()
        self.wait(lambda d: "tick 3" in self.terminal(), "the loop did not print")
        self.assertTrue(self.el("stop").is_enabled())
        self.el("stop").click()
        self.wait(lambda d: self.text("v-status").lower() not in ("running", "queued"), "stop did not end it")
        verdict = self.verdict()
        self.assertEqual((verdict["status"], verdict["reason"]), ("failed", "killed"), verdict)
        self.assertIn("stopped", verdict["detail"])
        self.assertFalse(self.el("stop").is_enabled())
        self.assertTrue(self.el("run").is_enabled())
        self.shot("04-stopped")

    def test_4c_a_program_refused_a_process_says_so(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.type_code([
            "import os, time",
            "while True: os.fork() == 0 and (time.sleep(30), os._exit(0))",
        ])
        # The parent forks until the pids limit refuses it (BlockingIOError).
        verdict = self.run_and_wait("failed")
        self.terminal_shows("BlockingIOError")
        self.assertEqual((verdict["reason"], verdict["exit"]), ("exited", "1"), verdict)
        self.assertIn("a process start was refused at the process limit", verdict["detail"])
        self.shot("04c-process-limit")

    def test_4b_a_queued_run_shows_its_place_in_the_queue(self):
        # Every slot busy with a sleeper of the key's anonymous user, and two
        # more of them queued; the tab's user then waits behind one of them
        # (users take turns) and the page says so.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{URL}/metrics", timeout=30) as response:
            metrics = response.read().decode()
        slots = int(float(re.search(r"^code_runner_slots_max (\S+)$", metrics, re.M).group(1)))
        # Two minutes of wall time (the default is 10 s): a slow machine must
        # not see a sleeper end, and its slot free, before the page's run.
        sleeper = {"language": "python", "limits": {"wall_ms": 120000},
                   "files": [{"name": "main.py", "content": "import time\ntime.sleep(120)\n"}]}
        blockers = []
        for _ in range(slots + 2):
            status, body = http("POST", f"{URL}/v1/jobs", KEY, sleeper)
            self.assertEqual(status, 202, body)
            blockers.append(body["id"])
        try:
            def running():
                return sum(http("GET", f"{URL}/v1/jobs/{i}", KEY)[1]["status"] == "running" for i in blockers)
            self.wait(lambda d: running() == slots, "the sleepers did not fill the slots")
            self.open(f"{URL}/")
            self.use_key(KEY)
            self.type_code(['print("my turn")'])
            self.el("run").click()
            self.wait(lambda d: "ahead of you" in self.text("v-detail"), "no place in the queue shown")
            verdict = self.verdict()
            self.assertEqual(verdict["status"], "queued", verdict)
            self.assertTrue(verdict["detail"].startswith("1 ahead of you"), verdict)
            self.shot("04b-queued-place")
        finally:
            for job in blockers:
                http("DELETE", f"{URL}/v1/jobs/{job}", KEY)
        self.wait(lambda d: self.text("v-status").lower() == "succeeded", "the queued run did not run")
        self.terminal_shows("my turn")
        self.assertEqual(self.text("v-detail"), "")

    def test_5_compile_error_shows_the_compilers_message(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.assertFalse(self.el("key-form").is_displayed(), "the key form stays open")
        Select(self.el("language")).select_by_value("c")
        self.assertEqual(self.text("file-name"), "main.c")
        self.type_code(["int main(void) { return 0 }"])
        verdict = self.run_and_wait("failed")
        terminal = self.terminal_shows("main.c")
        # gcc quotes with ‘’ in a UTF-8 locale, with '' in the C locale.
        self.assertRegex(terminal, r"main\.c:1:26: error: expected [‘']; ?[’'] before [‘']\}[’'] token")
        self.assertEqual(verdict["reason"], "compile: exited", verdict)
        self.assertEqual(verdict["exit"], "1", verdict)
        self.assertIn("compile stage failed", verdict["detail"])
        self.shot("05-compile-error")

    def test_6_a_wrong_key_shows_a_clear_error(self):
        self.expected_errors = ("/v1/jobs - Failed to load resource: the server responded with a status of 401",)
        self.open(f"{URL}/")
        self.use_key("not-a-configured-key-123")
        self.el("run").click()
        self.wait(lambda d: self.el("error").is_displayed(), "no error shown")
        self.assertEqual(
            self.text("error"),
            "The API key was refused (401: invalid api key). Check it and enter it again.")
        self.assertTrue(self.el("key-form").is_displayed(), "the page asks for the key again")
        self.assertEqual(self.text("v-status").lower(), "idle")
        self.assertIsNone(driver.execute_script("return sessionStorage.getItem('code-runner.api-key')"))
        self.shot("06-wrong-key")

    def test_7_shared_playground_key_needs_no_key(self):
        self.open(f"{SHARED_URL}/playground")
        self.assertFalse(self.el("key-form").is_displayed(), "the page asks for a key")
        self.assertIn("shared playground key (at most 2 runs at once)", self.text("key-state"))
        verdict = self.run_and_wait("succeeded")
        self.terminal_shows("Hello, world!")
        self.assertEqual(verdict["exit"], "0")
        self.assertFalse(driver.execute_script("return Object.keys(sessionStorage).some(k => k.endsWith('api-key'))"))
        self.shot("07-shared-key")

    def job_id(self):
        match = re.fullmatch(r"job ([0-9a-f-]{36})", self.text("job-id"))
        self.assertIsNotNone(match, self.text("job-id"))
        return match.group(1)

    def tab_user(self):
        return driver.execute_script("return sessionStorage.getItem('code-runner.user')")

    def history_of(self, user):
        """The ids of the shared key's jobs for `user`, newest first."""
        query = urllib.parse.urlencode({"user": user})
        status, page = http("GET", f"{SHARED_URL}/v1/jobs?{query}", PLAYGROUND_KEY)
        self.assertEqual(status, 200, page)
        return [job["id"] for job in page["jobs"]]

    def test_7b_each_tab_is_one_user_across_its_runs(self):
        self.open(f"{SHARED_URL}/playground")
        user = self.tab_user()
        self.assertRegex(user, r"^tab-[0-9a-f]{32}$")
        self.run_and_wait("succeeded")
        first = self.job_id()
        self.type_code(['print("second run")'])
        self.run_and_wait("succeeded")
        self.terminal_shows("second run")
        second = self.job_id()
        self.assertNotEqual(first, second)
        # Both jobs carry the tab's user, as the server stored them.
        for job_id in (first, second):
            status, job = http("GET", f"{SHARED_URL}/v1/jobs/{job_id}", PLAYGROUND_KEY)
            self.assertEqual((status, job["user"], job["status"]), (200, user, "succeeded"), job)
        self.assertEqual(self.history_of(user), [second, first])
        self.shot("07b-tab-user")
        # A reload keeps the tab's user; another tab is another user.
        driver.refresh()
        self.wait(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true",
                  "the page did not become ready again")
        self.assertEqual(self.tab_user(), user)
        original = driver.current_window_handle
        driver.switch_to.new_window("tab")
        try:
            driver.get(f"{SHARED_URL}/playground")
            self.wait(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true",
                      "the second tab did not become ready")
            other = self.tab_user()
            self.assertRegex(other, r"^tab-[0-9a-f]{32}$")
            self.assertNotEqual(other, user)
            self.run_and_wait("succeeded")
            third = self.job_id()
            self.assertEqual(self.history_of(other), [third])
            self.assertEqual(self.history_of(user), [second, first])
            self.shot("07c-second-tab")
        finally:
            driver.close()
            driver.switch_to.window(original)

    # The Tests panel.

    def rows_of_tests(self):
        return driver.find_elements(By.CSS_SELECTOR, "#test-list > li.test")

    def fill_test(self, row, stdin, expected, name=None):
        if name is not None:
            row.find_element(By.CSS_SELECTOR, ".test-name").send_keys(name)
        row.find_element(By.CSS_SELECTOR, ".test-stdin").send_keys(stdin)
        row.find_element(By.CSS_SELECTOR, ".test-expected").send_keys(expected)

    def record_ticks(self):
        """Records, in the page, each state a test row passes through
        ("0 running", "0 accepted", …), as the events change it."""
        driver.execute_script("""
            window.testTicks = [];
            const list = document.getElementById("test-list");
            new MutationObserver((records) => {
                for (const record of records) {
                    const row = record.target;
                    const now = row.dataset.state === "done" ? row.dataset.verdict : row.dataset.state;
                    if (row.lastTick === now) continue;
                    row.lastTick = now;
                    window.testTicks.push(`${[...list.children].indexOf(row)} ${now}`);
                }
            }).observe(list, {attributes: true, subtree: true, attributeFilter: ["data-state", "data-verdict"]});
        """)

    def grade_and_wait(self):
        self.el("grade").click()
        self.wait(lambda d: d.find_elements(By.ID, "tests-verdict") or self.el("error").is_displayed(),
                  "the tests did not end")

    def badge(self, row):
        badge = row.find_element(By.CSS_SELECTOR, ".verdict-badge")
        return badge.get_attribute("data-verdict"), badge.text.lower()

    def test_7d_tests_panel_grades_each_test_live(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.type_code([
            "a, b = map(int, input().split())",
            "print(a + b)",
        ])
        self.assertFalse(self.el("tests-view").is_displayed(), "the Tests panel shows before its tab is chosen")
        self.el("tab-tests").click()
        self.assertTrue(self.el("tests-view").is_displayed())
        self.assertFalse(self.el("terminal").is_displayed(), "the terminal shows under the Tests tab")
        self.assertEqual(Select(self.el("check")).first_selected_option.get_attribute("value"), "trim")
        self.assertFalse(self.el("stop-on-failure").is_selected())
        # The panel starts with one empty test; a second is added.
        self.assertEqual(len(self.rows_of_tests()), 1)
        self.el("add-test").click()
        first, second = self.rows_of_tests()
        self.assertEqual(self.text("tests-tally"), "2")
        self.fill_test(first, "1 2", "3", name="small")
        self.fill_test(second, "2 2", "5")
        self.record_ticks()
        self.grade_and_wait()
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))
        first, second = self.rows_of_tests()
        # Each row ticked off live, in order, from its own test events.
        self.assertEqual(driver.execute_script("return window.testTicks"),
                         ["0 waiting", "1 waiting", "0 running", "0 accepted", "1 running", "1 wrong_answer"])
        self.assertEqual(self.badge(first), ("accepted", "accepted"))
        self.assertRegex(first.find_element(By.CSS_SELECTOR, ".test-figures").text,
                         r"^\d+ ms wall · \d+ ms cpu · \d+(\.\d)? (MiB|KiB) · 1/1 points$")
        self.assertEqual(first.find_element(By.CSS_SELECTOR, ".test-detail").text, "")
        self.assertEqual(self.badge(second), ("wrong_answer", "wrong answer"))
        self.assertRegex(second.find_element(By.CSS_SELECTOR, ".test-figures").text,
                         r"^\d+ ms wall · \d+ ms cpu · \d+(\.\d)? (MiB|KiB) · 0/1 points$")
        detail = second.find_element(By.CSS_SELECTOR, ".test-detail")
        self.assertEqual(detail.find_element(By.CSS_SELECTOR, ".diff-where").text, "first difference: line 1")
        self.assertEqual([e.text for e in detail.find_elements(By.CSS_SELECTOR, ".diff dt, .diff dd")],
                         ["expected", "5", "got", "4"])
        # The summary: passed/total · score/max_score · overall verdict.
        self.assertEqual(self.text("tests-summary"), "1/2 passed · score 1/2 · WRONG ANSWER")
        self.assertEqual(self.el("tests-verdict").get_attribute("data-verdict"), "wrong_answer")
        self.assert_fits_the_screen()
        self.shot("07d-tests")
        # The job the server ran: not interactive, graded as the page says.
        status, job = http("GET", f"{URL}/v1/jobs/{self.job_id()}", KEY)
        self.assertEqual(status, 200, job)
        result = job["result"]
        self.assertEqual((job["status"], result["passed"], result["total"], result["verdict"]),
                         ("failed", 1, 2, "wrong_answer"), result)
        self.assertEqual([(t["name"], t["verdict"]) for t in result["tests"]],
                         [("small", "accepted"), ("2", "wrong_answer")])
        self.assertIsNone(result["run"])
        # The Run button still runs the program interactively, in the terminal.
        self.el("run").click()
        self.wait(lambda d: self.el("terminal").is_displayed(), "Run does not show the terminal")
        self.wait(lambda d: self.text("v-status").lower() == "running", "the program does not run")
        self.type_in_terminal("20 22\n")
        self.wait(lambda d: self.text("v-status").lower() == "succeeded", "the program did not succeed")
        self.assertEqual(self.terminal_shows("42"), "20 22\n42")
        # Its rows keep their verdicts.
        self.el("tab-tests").click()
        self.assertEqual([self.badge(r)[0] for r in self.rows_of_tests()], ["accepted", "wrong_answer"])
        # A reload keeps the tab's tests (not their verdicts).
        driver.refresh()
        self.wait(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true",
                  "the page did not become ready again")
        self.el("tab-tests").click()
        rows = self.rows_of_tests()
        self.assertEqual([(r.find_element(By.CSS_SELECTOR, ".test-name").get_attribute("value"),
                           r.find_element(By.CSS_SELECTOR, ".test-stdin").get_attribute("value"),
                           r.find_element(By.CSS_SELECTOR, ".test-expected").get_attribute("value"),
                           r.get_attribute("data-state")) for r in rows],
                         [("small", "1 2", "3", "idle"), ("", "2 2", "5", "idle")])

    def test_7e_tests_panel_compile_error_and_a_refused_test(self):
        self.expected_errors = ("/v1/jobs - Failed to load resource: the server responded with a status of 400",)
        self.open(f"{URL}/")
        self.use_key(KEY)
        Select(self.el("language")).select_by_value("c")
        self.type_code(["int main(void) { return 0 }"])
        self.el("tab-tests").click()
        self.el("add-test").click()
        first, second = self.rows_of_tests()
        self.fill_test(first, "1", "1")
        self.fill_test(second, "2", "2")
        self.grade_and_wait()
        self.assertFalse(self.el("error").is_displayed(), self.text("error"))
        # The compile error is said once, with the compiler's message;
        # every test is skipped, without repeating why.
        self.assertEqual(self.el("tests-verdict").get_attribute("data-verdict"), "compile_error")
        summary = self.text("tests-summary")
        self.assertTrue(summary.startswith("0/2 passed · score 0/2 · COMPILE ERROR\n"), summary)
        self.assertIn("the compile stage failed (exit code 1); no test ran", summary)
        self.assertRegex(self.el("tests-summary").find_element(By.CSS_SELECTOR, ".compile-output").text,
                         r"main\.c:1:26: error: expected [‘']; ?[’'] before [‘']\}[’'] token")
        for row in self.rows_of_tests():
            self.assertEqual(self.badge(row), ("skipped", "skipped"))
            self.assertEqual(row.find_element(By.CSS_SELECTOR, ".test-detail").text, "")
            self.assertEqual(row.find_element(By.CSS_SELECTOR, ".test-figures").text, "")
        self.assertEqual(len(driver.find_elements(By.CSS_SELECTOR, "#tests-view [data-verdict='compile_error']")), 1)
        self.shot("07e-tests-compile-error")
        # A test the server refuses: its message, naming the field, and the
        # field marked on its row; no test has a verdict.
        first.find_element(By.CSS_SELECTOR, ".test-points input").send_keys("-1")
        self.el("grade").click()
        self.wait(lambda d: self.el("error").is_displayed(), "no error shown")
        message = "The server refused the job (400): tests[0].points: must be a number from 0 to 1000000."
        self.assertEqual(self.text("error"), message)
        self.assertEqual(self.text("tests-summary"), "Not run: test 1, points: must be a number from 0 to 1000000")
        points = first.find_element(By.CSS_SELECTOR, ".test-points input")
        self.assertEqual(points.get_attribute("aria-invalid"), "true")
        self.assertEqual(second.find_element(By.CSS_SELECTOR, ".test-points input").get_attribute("aria-invalid"), None)
        for row in self.rows_of_tests():
            self.assertEqual(row.get_attribute("data-state"), "idle")
        self.assertTrue(self.el("grade").is_enabled())
        self.shot("07f-tests-refused")

    def test_7f_tests_panel_float_check_and_stop_on_failure(self):
        self.open(f"{URL}/")
        self.use_key(KEY)
        self.type_code([
            "import time",
            "x = float(input())",
            "time.sleep(0.8)",
            "print(x / 3)",
        ])
        self.el("tab-tests").click()
        self.assertFalse(self.el("float-options").is_displayed())
        Select(self.el("check")).select_by_value("float")
        self.assertTrue(self.el("float-options").is_displayed())
        self.el("float-abs").send_keys("0.001")
        self.el("stop-on-failure").click()
        self.el("add-test").click()
        self.el("add-test").click()
        rows = self.rows_of_tests()
        for row, (stdin, expected) in zip(rows, [("1", "0.3333"), ("2", "0.7"), ("3", "1")]):
            self.fill_test(row, stdin, expected)
        self.el("grade").click()
        self.wait(lambda d: rows[0].get_attribute("data-state") == "running", "the first test does not run")
        self.assertEqual(self.badge(rows[0]), ("running", "running…"))
        self.assertEqual([self.badge(r) for r in rows[1:]], [("waiting", "waiting")] * 2)
        self.assertFalse(self.el("grade").is_enabled())
        self.assertFalse(rows[0].find_element(By.CSS_SELECTOR, ".test-stdin").is_enabled())
        self.assertRegex(self.text("tests-summary"), r"^running test 1 · 0/3 done$")
        self.shot("07g-tests-running")
        self.wait(lambda d: d.find_elements(By.ID, "tests-verdict"), "the tests did not end")
        self.assertEqual([self.badge(r)[0] for r in rows], ["accepted", "wrong_answer", "skipped"])
        detail = rows[1].find_element(By.CSS_SELECTOR, ".test-detail")
        self.assertEqual(detail.find_element(By.CSS_SELECTOR, ".diff-where").text, "first difference: line 1, token 1")
        self.assertEqual([e.text for e in detail.find_elements(By.CSS_SELECTOR, ".diff dd")],
                         ["0.7", "0.6666666666666666"])
        self.assertEqual(rows[2].find_element(By.CSS_SELECTOR, ".test-detail").text,
                         "not run: test 2 was not accepted (stop_on_failure)")
        self.assertEqual(self.text("tests-summary"), "1/3 passed · score 1/3 · WRONG ANSWER")
        self.shot("07h-tests-float")
        # Stop stops the grading: the test that is running ends killed, the
        # rest are skipped, and the summary says Stop did it.
        self.el("grade").click()
        self.wait(lambda d: rows[0].get_attribute("data-state") == "running", "the first test does not run again")
        self.assertEqual(self.el("stop").get_attribute("title"),
                         "Stop the grading: kill the test that is running and skip the rest")
        self.el("stop").click()
        self.wait(lambda d: d.find_elements(By.ID, "tests-verdict"), "the tests did not end after Stop")
        self.assertEqual(self.badge(rows[0]), ("runtime_error", "runtime error"))
        self.assertEqual(rows[0].find_element(By.CSS_SELECTOR, ".test-detail").text, "killed on request (a kill signal)")
        self.assertEqual([self.badge(r)[0] for r in rows[1:]], ["skipped", "skipped"])
        self.assertEqual(self.text("tests-summary").splitlines()[1:],
                         ["Stopped: the test that was running was killed, the rest were skipped"])

        self.shot("07i-tests-stopped")


class Dashboard(Page):
    def test_8_dashboard_shows_a_running_job(self):
        status, job = http("POST", f"{URL}/v1/jobs", KEY, {
            "language": "python",
            "files": [{"name": "main.py", "content": "import time\nprint('busy', flush=True)\ntime.sleep(60)\n"}],
            "limits": {"wall_ms": 90000},
        })
        self.assertEqual(status, 202, job)
        try:
            deadline = time.monotonic() + JOB_DEADLINE
            while http("GET", f"{URL}/v1/jobs/{job['id']}", KEY)[1]["status"] != "running":
                self.assertLess(time.monotonic(), deadline, "the job did not start")
                time.sleep(0.1)
            self.open(f"{URL}/dashboard")
            self.use_key(ADMIN_KEY)
            row = f"#jobs tr[data-job='{job['id']}']"
            self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, row), "the job is not listed")
            cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"{row} td")]
            self.assertEqual(cells[1:4], ["RUNNING", "python", "a"], cells)
            self.assertRegex(cells[6], r"^\d+ s so far$")
            # Slots come from the worker's heartbeat, refreshed every interval.
            slots = "#workers tbody tr td:nth-child(2)"
            self.wait(lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, slots)] == ["1 / 4"],
                      "the worker does not show one slot of four in use")
            worker = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#workers tbody td")]
            self.assertEqual(cells[4], worker[0])
            self.assertEqual(self.text("t-slots"), "1 / 4")
            # The worker keeps two warm python sandboxes (its pool refills
            # what the running job took).
            warm = "#workers tbody tr td:nth-child(3)"
            self.wait(lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, warm)] == ["python 2/2"],
                      "the worker does not show its warm sandboxes")
            self.assertEqual(self.text("t-warm"), "2")
            self.assertEqual(self.text("t-workers"), "1")
            self.assertEqual(self.text("t-queue"), "0")
            # Nothing waits: no key is taking turns.
            self.assertEqual(self.text("t-tenants"), "0 keys taking turns")
            self.assertEqual([c.text for c in driver.find_elements(By.CSS_SELECTOR, "#waiting tbody td")],
                             ["nothing waits"])
            # The plots: the server samples every 5 s; two samples make a line.
            self.wait(lambda d: self.plot_points("p-queue") >= 2, "the queue depth plot has no line", timeout=12)
            self.assertLessEqual(driver.execute_script("return document.documentElement.scrollWidth"),
                                 driver.execute_script("return window.innerWidth"))
            self.shot("08-dashboard")
        finally:
            http("DELETE", f"{URL}/v1/jobs/{job['id']}", KEY)

    def test_8b_dashboard_shows_a_worker_waiting_for_memory(self):
        # The second server's pool asks for a python sandbox and has a memory
        # reserve (a petabyte) the machine does not have: it starts none.
        self.open(f"{SHARED_URL}/dashboard")
        self.use_key(SHARED_ADMIN_KEY)
        warm = "#workers tbody tr td:nth-child(3)"
        self.wait(lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, warm)]
                  == ["python 0/1 · waiting for memory"],
                  "the worker does not show that its pool waits for memory")
        held = driver.find_element(By.CSS_SELECTOR, warm)
        self.assertIn("held", held.get_attribute("class").split())
        self.assertEqual(
            held.get_attribute("title"),
            "The worker starts no warm sandbox: its machine has less memory available than "
            "CODE_RUNNER_WARM_MEMORY_RESERVE_MB.")
        self.assertEqual(self.text("t-warm"), "0")
        self.assertLessEqual(driver.execute_script("return document.documentElement.scrollWidth"),
                             driver.execute_script("return window.innerWidth"))
        self.shot("08b-dashboard-waiting-for-memory")

    def test_9_dashboard_refuses_a_key_without_admin(self):
        self.expected_errors = ("/v1/dashboard - Failed to load resource: the server responded with a status of 403",)
        self.open(f"{URL}/dashboard")
        self.use_key(KEY)
        self.wait(lambda d: self.el("error").is_displayed(), "no error shown")
        self.assertEqual(
            self.text("error"),
            "This key has no admin scope: the dashboard needs a key configured as name:key:admin.")
        self.assertTrue(self.el("key-form").is_displayed())
        self.assertFalse(self.el("board").is_displayed())
        self.shot("09-dashboard-not-admin")


if __name__ == "__main__":
    unittest.main(verbosity=2)
