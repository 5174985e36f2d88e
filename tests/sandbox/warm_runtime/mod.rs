//! Warm runtimes conform: every program of these suites gives byte for byte
//! the same stdout, stderr, exit code, signal, reason and status when it
//! runs cold and when it runs on a runtime started ahead in a warm sandbox
//! (docs/warm-runtimes.md), under runc and under runsc.
//!
//! The programs cover what a runtime started before its program could get
//! wrong: argv, `__main__`/`__file__`/`require.main`, the working directory,
//! the module search path and the loaded modules, the environment, stdio
//! buffering and encodings, exit codes and exit hooks, uncaught exceptions
//! and their tracebacks, signals, resource limits, ids, descriptors, child
//! processes and threads. Nothing here may print what differs between two
//! sandboxes by design (their uid, pid or host name).

use crate::common;

mod php;
mod r;
mod ruby;

use code_runner::sandbox::SandboxEngine as _;
use std::time::{Duration, Instant};

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{FileSpec, JobSpec, StartKind, Status};
use code_runner::protocol::Reason;
use code_runner::sandbox::{JobIo, WarmPool};
use common::*;
use php::PHP;
use r::R;
use ruby::RUBY;

/// One program of a suite.
struct Case {
    name: &'static str,
    source: &'static str,
    stdin: &'static str,
    args: &'static [&'static str],
    /// Other files beside the entry.
    files: &'static [(&'static str, &'static str)],
}

const fn case(name: &'static str, source: &'static str) -> Case {
    Case {
        name,
        source,
        stdin: "",
        args: &[],
        files: &[],
    }
}

const PYTHON: &[Case] = &[
    case("hello", "print('hello')\n"),
    Case {
        args: &["a", "b c", "ünï", "--flag", ""],
        ..case(
            "argv",
            "import sys\nprint(sys.argv)\nprint(sys.orig_argv)\n",
        )
    },
    case(
        "main_module",
        "print(__name__, __file__, __spec__, __package__, __cached__, __doc__)\n\
         print(type(__loader__).__name__, __loader__.name, __loader__.path)\n\
         print(sorted(globals()), type(__builtins__))\n",
    ),
    case(
        "search_path",
        "import sys\nprint(sys.path)\nprint(sorted(sys.path_importer_cache))\n",
    ),
    case("loaded_modules", "import sys\nprint(sorted(sys.modules))\n"),
    case(
        "site_left_as_it_was",
        "import site, sys\n\
         print([(name, f.__module__, f.__qualname__) for name, f in sorted(vars(site).items())\n\
                if callable(f) and not isinstance(f, type)])\n\
         print(sys.excepthook, sys.displayhook, sys.__interactivehook__.__qualname__)\n",
    ),
    case(
        "cwd_and_workspace",
        "import os\nprint(os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('/tmp')))\n",
    ),
    case(
        "environment",
        "import os, json\nprint(json.dumps(dict(os.environ), sort_keys=True))\n",
    ),
    case(
        "flags_and_encodings",
        "import sys\nprint(sys.flags)\n\
         print(sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding,\n\
               sys.stdout.errors, sys.stdin.encoding, sys.stderr.errors)\n\
         print(sys.getfilesystemencoding(), sys.getdefaultencoding(), sys.getrecursionlimit())\n\
         print(sys.stdin.isatty(), sys.stdout.isatty(), sys.executable, sys.prefix, sys.platlibdir)\n",
    ),
    case(
        "site_and_locale",
        "import site, locale, time\n\
         print(site.ENABLE_USER_SITE, site.getsitepackages(), site.getusersitepackages())\n\
         print(locale.getlocale(), locale.getpreferredencoding(False), time.tzname, time.timezone)\n",
    ),
    Case {
        stdin: "one\ntwo\nthree",
        ..case(
            "stdin_lines",
            "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='')\nprint('|')\n",
        )
    },
    Case {
        stdin: "Ada\n7\n",
        ..case(
            "input_prompts",
            "name = input('name? ')\nn = int(input('n? '))\nprint('hi', name, n * 6)\n",
        )
    },
    case("input_at_eof", "print('waiting')\ninput('> ')\n"),
    case("exit_code", "import sys\nprint('out')\nsys.exit(3)\n"),
    case("exit_message", "import sys\nsys.exit('bye now')\n"),
    case("system_exit_none", "raise SystemExit\n"),
    case(
        "os_exit_skips_flushing_hooks",
        "import os, atexit\natexit.register(print, 'never')\nprint('x', end='')\nos._exit(7)\n",
    ),
    case(
        "uncaught_exception",
        "def inner():\n    return 1 / 0\n\ndef outer():\n    inner()\n\nouter()\n",
    ),
    case(
        "chained_exceptions",
        "try:\n    {}['key']\nexcept KeyError as error:\n    raise ValueError('bad value') from error\n",
    ),
    case("syntax_error", "print('never')\ndef f(:\n    pass\n"),
    case(
        "recursion_error",
        "def down(n):\n    return down(n + 1)\n\ndown(0)\n",
    ),
    Case {
        files: &[(
            "helper.py",
            "VALUE = 42\nprint('helper loaded', __name__)\n",
        )],
        ..case(
            "import_from_workspace",
            "import helper\nprint(helper.__file__, helper.VALUE)\n",
        )
    },
    case("import_missing", "import not_a_module_anywhere\n"),
    case(
        "atexit_hooks",
        "import atexit\natexit.register(print, 'second')\natexit.register(print, 'first')\nprint('main')\n",
    ),
    case(
        "atexit_after_an_exception",
        "import atexit\natexit.register(print, 'cleanup ran')\nraise RuntimeError('failed')\n",
    ),
    case(
        "stdout_and_stderr",
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nsys.stdout.write('raw out\\n')\n",
    ),
    case(
        "warnings",
        "import warnings\nwarnings.warn('careful')\nwarnings.warn('old', DeprecationWarning)\nprint('done')\n",
    ),
    case(
        "resource_limits",
        "import resource as r\n\
         for name in ('RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE', 'RLIMIT_NPROC',\n\
                      'RLIMIT_AS', 'RLIMIT_STACK', 'RLIMIT_DATA', 'RLIMIT_MEMLOCK'):\n\
             print(name, r.getrlimit(getattr(r, name)))\n",
    ),
    case(
        "ids_and_session",
        "import os\n\
         uid = os.getuid()\n\
         print(uid != 0, uid == os.geteuid() == os.getgid() == os.getegid(), os.getgroups())\n\
         print(os.getppid(), os.getpgrp() == os.getpid(), os.getsid(0) == os.getpid(), os.umask(0o22))\n",
    ),
    case(
        "descriptors",
        "import os\nprint(sorted(os.listdir('/proc/self/fd')))\n\
         print([os.get_inheritable(fd) for fd in (0, 1, 2)])\n\
         print(os.path.basename(os.readlink('/proc/self/fd/0')).split(':')[0])\n",
    ),
    case(
        "signal_handlers",
        "import signal\n\
         print([str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE,\n\
                                                  signal.SIGCHLD, signal.SIGHUP)])\n",
    ),
    case(
        "killed_by_its_own_signal",
        "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\nprint('after')\n",
    ),
    case(
        "keyboard_interrupt",
        "print('start')\nraise KeyboardInterrupt\n",
    ),
    case(
        "child_python",
        "import subprocess, sys\n\
         r = subprocess.run([sys.executable, '-u', '-c', 'import sys; print(sys.argv, sys.orig_argv)'],\n\
                            capture_output=True, text=True)\n\
         print(repr(r.stdout), repr(r.stderr), r.returncode)\n",
    ),
    case(
        "fork",
        "import os\npid = os.fork()\nif pid == 0:\n    print('child')\n    os._exit(5)\n\
         _, status = os.waitpid(pid, 0)\nprint('parent', os.waitstatus_to_exitcode(status))\n",
    ),
    case(
        "threads",
        "import threading\nout = []\n\
         threads = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n\
         for t in threads:\n    t.start()\nfor t in threads:\n    t.join()\n\
         print(sorted(out), threading.active_count(), threading.current_thread().name)\n",
    ),
    case(
        "unicode_and_bytes",
        "import sys\nprint('héllo ✓ 😀')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'\\xff\\xfe raw\\n')\n",
    ),
    case("large_output", "print('x' * 200000)\nprint('end')\n"),
    case("no_trailing_newline", "print('partial', end='')\n"),
    case(
        "files_in_tmp",
        "import os\nopen('/tmp/note.txt', 'w').write('kept')\nprint(open('/tmp/note.txt').read(), os.listdir('/tmp'))\n",
    ),
    case(
        "compiled_code_tracebacks",
        "src = 'def f():\\n    raise LookupError(\"inside\")\\nf()\\n'\nexec(compile(src, 'virtual.py', 'exec'))\n",
    ),
    case(
        "garbage_collector_settings",
        "import gc, sys\nprint(gc.get_threshold(), gc.isenabled(), sys.getswitchinterval())\n",
    ),
];

const JAVASCRIPT: &[Case] = &[
    case("hello", "console.log('hello');\n"),
    Case {
        args: &["a", "b c", "ünï", "--flag", ""],
        ..case(
            "argv",
            "console.log(JSON.stringify({argv: process.argv, argv0: process.argv0,\n\
             execArgv: process.execArgv, execPath: process.execPath}));\n",
        )
    },
    case(
        "main_module",
        "console.log(require.main === module, __filename, __dirname, module.id, module.filename,\n\
         module.loaded, module.children.length, JSON.stringify(module.paths));\n",
    ),
    case(
        "module_cache",
        "console.log(Object.keys(require.cache), require.resolve.paths('x'));\n",
    ),
    case(
        "environment",
        "const env = {...process.env};\nconsole.log(JSON.stringify(Object.keys(env).sort().map(k => [k, env[k]])));\n",
    ),
    case(
        "cwd_and_workspace",
        "const fs = require('fs');\nconsole.log(process.cwd(), fs.readdirSync('.'), fs.readdirSync('/tmp'));\n",
    ),
    Case {
        stdin: "one\ntwo\n",
        ..case(
            "stdin_read_whole",
            "const fs = require('fs');\nprocess.stdout.write(fs.readFileSync(0, 'utf8').toUpperCase());\n",
        )
    },
    Case {
        stdin: "Ada\n",
        ..case(
            "readline_question",
            "const rl = require('readline').createInterface({input: process.stdin, output: process.stdout});\n\
             rl.question('name? ', (name) => { console.log('hi ' + name); rl.close(); });\n",
        )
    },
    case("exit_code", "console.log('out');\nprocess.exit(3);\n"),
    case(
        "exit_code_property",
        "process.exitCode = 4;\nconsole.log('set');\n",
    ),
    case(
        "uncaught_exception",
        "function inner() { throw new Error('boom'); }\nfunction outer() { inner(); }\nouter();\n",
    ),
    case(
        "unhandled_rejection",
        "Promise.reject(new TypeError('nope'));\nsetTimeout(() => console.log('never'), 10);\n",
    ),
    case("syntax_error", "console.log('never');\nlet x = ;\n"),
    case(
        "import_in_commonjs",
        "import fs from 'fs';\nconsole.log(fs);\n",
    ),
    Case {
        files: &[(
            "helper.js",
            "console.log('helper', require.main === module);\nmodule.exports = 42;\n",
        )],
        ..case(
            "require_from_workspace",
            "const v = require('./helper');\nconsole.log(v, Object.keys(require.cache));\n",
        )
    },
    case("require_missing", "require('not-a-module-anywhere');\n"),
    case(
        "exit_hooks_and_timers",
        "process.on('beforeExit', () => { if (!globalThis.done) { globalThis.done = 1; console.log('beforeExit'); } });\n\
         process.on('exit', (code) => console.log('exit', code));\n\
         setImmediate(() => { console.log('immediate'); setTimeout(() => console.log('timer'), 5); });\n\
         process.nextTick(() => console.log('tick'));\nconsole.log('main');\n",
    ),
    case(
        "stdout_and_stderr",
        "console.log('to out');\nconsole.error('to err');\nconsole.warn('warned');\nprocess.stdout.write('raw\\n');\n",
    ),
    case(
        "killed_by_its_own_signal",
        "console.log('before');\nprocess.kill(process.pid, 'SIGTERM');\nsetTimeout(() => console.log('after'), 1000);\n",
    ),
    case(
        "worker_thread",
        "const { Worker } = require('worker_threads');\n\
         const w = new Worker(\"require('worker_threads').parentPort.postMessage([process.argv.length, process.execArgv])\", {eval: true});\n\
         w.on('message', (m) => console.log('worker says', JSON.stringify(m)));\n",
    ),
    Case {
        files: &[(
            "child.js",
            "console.log('child', JSON.stringify(process.execArgv), process.argv.slice(2));\n",
        )],
        ..case(
            "forked_child",
            "const { fork } = require('child_process');\n\
             fork('./child.js', ['x']).on('exit', (code) => console.log('child exited', code));\n",
        )
    },
    case(
        "spawned_node",
        "const { spawnSync } = require('child_process');\n\
         const r = spawnSync('node', ['-e', 'console.log(process.execArgv.length, process.argv.length)']);\n\
         console.log(JSON.stringify(r.stdout.toString()), r.status);\n",
    ),
    case(
        "descriptors",
        "console.log(require('fs').readdirSync('/proc/self/fd'));\n",
    ),
    case(
        "process_facts",
        "console.log(process.title, process.release.name, process.versions.node, process.ppid,\n\
         process.getuid() === process.geteuid(), process.getuid() !== 0,\n\
         process.stdout.isTTY, process.stdin.isTTY, process.stdout.constructor.name, process.stdin.constructor.name);\n",
    ),
    case(
        "error_stack",
        "function a() { return new Error('where').stack; }\nconsole.log(a());\n",
    ),
    case(
        "large_output",
        "console.log('x'.repeat(200000));\nconsole.log('end');\n",
    ),
    case("no_trailing_newline", "process.stdout.write('partial');\n"),
];

/// Text with the pids Node prints in its warnings (`(node:11)`) replaced:
/// a pid differs between any two sandboxes by design.
fn without_pids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("(node:") {
        let (head, tail) = rest.split_at(at + "(node:".len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(if digits > 0 { "PID" } else { "" });
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// What a run gave, timings aside.
#[derive(Debug, PartialEq)]
struct Seen {
    status: Status,
    stdout: String,
    stderr: String,
    exit_code: Option<i32>,
    signal: Option<String>,
    reason: Option<Reason>,
    truncated: bool,
}

fn seen(result: &code_runner::job::JobResult) -> Seen {
    let run = result.run.as_ref();
    Seen {
        status: result.status,
        stdout: run.map_or_else(String::new, |r| {
            String::from_utf8_lossy(r.stdout.as_bytes()).into_owned()
        }),
        stderr: run.map_or_else(String::new, |r| {
            without_pids(&String::from_utf8_lossy(r.stderr.as_bytes()))
        }),
        exit_code: run.and_then(|r| r.exit_code),
        signal: run.and_then(|r| r.signal.clone()),
        reason: run.map(|r| r.reason),
        truncated: run.is_some_and(|r| r.truncated),
    }
}

fn spec_of(language: &str, entry: &str, case: &Case) -> JobSpec {
    let mut spec = job(language, entry, case.source);
    spec.stdin = case.stdin.to_string();
    spec.args = case.args.iter().map(|a| a.to_string()).collect();
    for (name, content) in case.files {
        spec.files.push(FileSpec {
            name: name.to_string(),
            content: content.to_string(),
            encoding: code_runner::job::Encoding::Utf8,
        });
    }
    spec
}

/// A ready member of `pool` for `job`, waiting (up to 60 s) for one.
async fn claim(
    pool: &WarmPool,
    job: &code_runner::job::PreparedJob,
) -> code_runner::sandbox::WarmSandbox {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(warm) = pool.claim(job).await {
            return warm;
        }
        assert!(Instant::now() < until, "no warm sandbox within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `job` in a ready member of `pool` and removes its container.
///
/// It waits a moment first, so that the member's runtime has surely reached
/// its hook: a job that came while the runtime was still starting would
/// pass even with a hook that never waits (its file written before the
/// runtime read it), and a runtime that did not wait has ended by now (the
/// job then starts `warm`, not `warm_runtime`, and the test says so).
async fn run_warm(
    harness: &Harness,
    pool: &WarmPool,
    job: &code_runner::job::PreparedJob,
) -> code_runner::job::JobResult {
    tokio::time::sleep(Duration::from_millis(400)).await;
    let sandbox = claim(pool, job).await;
    let id = uuid::Uuid::new_v4().to_string();
    let outcome = harness
        .engine
        .run_job(&id, job, JobIo::default(), Some(sandbox))
        .await;
    outcome.cleanup.remove().await;
    outcome.result
}

/// Runs every case cold and on a warm runtime with `harness` and fails
/// naming each case whose runs differ.
async fn conform(harness: Harness, language: &str, entry: &str, cases: &[Case]) {
    let harness = harness.on(StartKind::WarmRuntime);
    let first = harness.prepare(&spec_of(language, entry, &cases[0]));
    let spec = harness.warm_spec(&first);
    assert!(spec.runtime.is_some(), "{language} has a warm runtime");
    let pool = WarmPool::start(&harness.engine, common::pool_settings(3));
    pool.set_targets(vec![(spec, 2)]);
    let mut differ = Vec::new();
    for case in cases {
        let job = harness.prepare(&spec_of(language, entry, case));
        let cold_id = uuid::Uuid::new_v4().to_string();
        let cold = harness.engine.run(&cold_id, &job, JobIo::default());
        let warm = run_warm(&harness, &pool, &job);
        let (cold, warm) = tokio::join!(cold, warm);
        assert_eq!(
            cold.start,
            Some(StartKind::Cold),
            "{}: {cold:#?}",
            case.name
        );
        assert_eq!(
            warm.start,
            Some(StartKind::WarmRuntime),
            "{}: {warm:#?}",
            case.name
        );
        let (cold, warm) = (seen(&cold), seen(&warm));
        if cold != warm {
            differ.push(format!(
                "{}:\n  cold: {cold:?}\n  warm: {warm:?}",
                case.name
            ));
        }
    }
    pool.shutdown(Duration::from_secs(30)).await;
    assert!(
        differ.is_empty(),
        "{} of {} {language} programs differ on a warm runtime:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
    harness.assert_clean().await;
}

#[test]
fn pids_in_node_warnings_are_masked() {
    assert_eq!(
        without_pids("(node:11) Warning: x\n(node:) y (node:7"),
        "(node:PID) Warning: x\n(node:) y (node:PID"
    );
}

#[test]
fn the_suites_are_as_large_as_promised() {
    assert!(PYTHON.len() >= 30, "{}", PYTHON.len());
    assert!(JAVASCRIPT.len() >= 20, "{}", JAVASCRIPT.len());
    assert!(PHP.len() >= 20, "{}", PHP.len());
    assert!(RUBY.len() >= 20, "{}", RUBY.len());
    assert!(R.len() >= 20, "{}", R.len());
    // R's runtime takes no args: a case with some would run plain warm.
    assert!(R.iter().all(|case| case.args.is_empty()));
    for suite in [PYTHON, JAVASCRIPT, PHP, RUBY, R] {
        let mut names: Vec<&str> = suite.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), suite.len(), "case names are unique");
    }
}

#[tokio::test]
async fn python_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "python", "main.py", PYTHON).await;
}

#[tokio::test]
async fn javascript_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "javascript", "main.js", JAVASCRIPT).await;
}

#[tokio::test]
async fn php_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "php", "main.php", PHP).await;
}

#[tokio::test]
async fn ruby_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "ruby", "main.rb", RUBY).await;
}

#[tokio::test]
async fn ruby_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("ruby_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "ruby", "main.rb", RUBY).await;
    }
}

#[tokio::test]
async fn r_programs_conform_on_a_warm_runtime_under_runc() {
    conform(Harness::new().await, "r", "main.r", R).await;
}

#[tokio::test]
async fn r_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) = runsc_harness("r_programs_conform_on_a_warm_runtime_under_runsc").await {
        conform(harness, "r", "main.r", R).await;
    }
}

#[tokio::test]
async fn php_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) = runsc_harness("php_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "php", "main.php", PHP).await;
    }
}

#[tokio::test]
async fn python_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("python_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "python", "main.py", PYTHON).await;
    }
}

#[tokio::test]
async fn javascript_programs_conform_on_a_warm_runtime_under_runsc() {
    if let Some(harness) =
        runsc_harness("javascript_programs_conform_on_a_warm_runtime_under_runsc").await
    {
        conform(harness, "javascript", "main.js", JAVASCRIPT).await;
    }
}

/// Runs `spec` on a warm sandbox whose runtime was started ahead.
async fn on_runtime_pool(harness: &Harness, spec: &JobSpec) -> code_runner::job::JobResult {
    let job = harness.prepare(spec);
    let pool = harness.warm_pool(&job, 1).await;
    let result = run_warm(harness, &pool, &job).await;
    pool.shutdown(Duration::from_secs(30)).await;
    result
}

/// A fed runtime still starting when its job comes is waited for, and the
/// job keeps its whole wall limit. Here R's start is made 7 s slow on
/// purpose (a loaded VM once took R under gVisor past the 2 s the
/// supervisor used to wait): longer than the job's wall limit and the
/// host's grace together, so that neither may count the wait.
#[tokio::test]
async fn a_job_waits_for_a_runtime_still_starting_and_keeps_its_wall_limit() {
    let mut harness = Harness::new().await.on(StartKind::WarmRuntime);
    let slow = r#"["sh", "-c", "sleep 7; exec Rscript --vanilla \"$0\"", "{entry}"]"#;
    let catalog = code_runner::languages::EMBEDDED_CATALOG
        .replace(
            r#"run = ["Rscript", "--vanilla", "{entry}"]"#,
            &format!("run = {slow}"),
        )
        .replace(
            r#"warm_runtime = ["Rscript", "--vanilla", "{entry}"]"#,
            &format!("warm_runtime = {slow}"),
        );
    assert_eq!(catalog.matches(slow).count(), 2, "both R commands replaced");
    harness.catalog = code_runner::languages::LanguageCatalog::parse(&catalog).unwrap();
    let spec = job_with_limits(
        "r",
        "main.r",
        "cat('released\\n')\n",
        LimitsRequest {
            wall_ms: Some(1000),
            ..Default::default()
        },
    );
    let result = on_runtime_pool(&harness, &spec).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(result.status, Status::Succeeded, "{result:#?}");
    let run = result.run.as_ref().unwrap();
    assert_eq!(run.reason, Reason::Exited, "{result:#?}");
    assert_eq!(run.exit_code, Some(0), "{result:#?}");
    assert_eq!(stdout(&result), "released\n");
    assert!(run.wall_ms < 1000, "{result:#?}");
    harness.assert_clean().await;
}

#[tokio::test]
async fn a_job_whose_environment_entry_or_script_needs_a_fresh_runtime_is_not_given_one() {
    let harness = Harness::new().await.on(StartKind::WarmRuntime);
    // An env var Python reads only at its start: the runtime started
    // without it cannot honour it, so the program starts afresh (and sees it).
    let mut seeded = python(
        "import os, sys\nprint(os.environ['PYTHONHASHSEED'], sys.flags.hash_randomization)\n",
    );
    seeded.env.insert("PYTHONHASHSEED".into(), "0".into());
    // Node's options are read at its start too.
    let mut node = job(
        "javascript",
        "main.js",
        "console.log(process.env.NODE_OPTIONS);\n",
    );
    node.env
        .insert("NODE_OPTIONS".into(), "--max-old-space-size=64".into());
    // With its args, a ruby job runs on the runtime.
    let mut with_args = job("ruby", "main.rb", "p ARGV\n");
    with_args.args = vec!["x".into(), "y z".into()];
    // R took its command line at its start: with args, a fresh one.
    let mut r_with_args = job("r", "main.r", "cat(commandArgs(TRUE), sep = '|')\n");
    r_with_args.args = vec!["x".into(), "y z".into()];
    let cases = [
        (seeded, StartKind::Warm, "0 0\n"),
        // Another entry file than the one the runtime was started for.
        (
            job("python", "app.py", "print(__file__)\n"),
            StartKind::Warm,
            "/workspace/app.py\n",
        ),
        (node, StartKind::Warm, "--max-old-space-size=64\n"),
        // Ruby reads a `#!` line's switches at its start, before it is fed.
        (
            job(
                "ruby",
                "main.rb",
                "#!/usr/bin/env ruby -w\np $VERBOSE, __LINE__\n",
            ),
            StartKind::Warm,
            "true\n2\n",
        ),
        // And `DATA` after `__END__` is the script's file, which a fed
        // runtime's is not.
        (
            job(
                "ruby",
                "main.rb",
                "DATA.rewind\np DATA.read.lines.size, DATA.stat.file?\n__END__\nthe data\n",
            ),
            StartKind::Warm,
            "4\ntrue\n",
        ),
        (with_args, StartKind::WarmRuntime, "[\"x\", \"y z\"]\n"),
        (r_with_args, StartKind::Warm, "x|y z"),
        (
            job("r", "main.r", "cat(length(commandArgs(TRUE)), 'args')\n"),
            StartKind::WarmRuntime,
            "0 args",
        ),
        // A job without any of these runs on the runtime.
        (
            python("print('on the runtime')\n"),
            StartKind::WarmRuntime,
            "on the runtime\n",
        ),
    ];
    for (spec, start, expected) in &cases {
        let result = on_runtime_pool(&harness, spec).await;
        assert_eq!(result.start, Some(*start), "{result:#?}");
        assert_eq!(stdout(&result), *expected, "{result:#?}");
    }
    harness.assert_clean().await;
}

/// A runtime's hook waits only in the runtime the supervisor started: a
/// program that passes a pipe of its own as descriptor 200 to a python3,
/// php or ruby (with the hook) child (its write end still open) does not make that child wait for a
/// job, cold or on a warm runtime.
#[tokio::test]
async fn a_child_given_a_pipe_as_descriptor_200_does_not_wait_for_a_job() {
    let python_parent = python(
        "import os, subprocess\n\
         read, write = os.pipe()\n\
         os.dup2(read, 200)\n\
         child = subprocess.run(['python3', '-c', 'import sys; print(\"child ran\", sys.argv)'],\n\
                                pass_fds=(200,), capture_output=True, text=True, timeout=5)\n\
         print(child.stdout, end='')\n\
         print('exit', child.returncode)\n",
    );
    let php_parent = job(
        "php",
        "main.php",
        "<?php\n\
         $child = proc_open(['php', '-r', 'echo \"child ran \", count($argv), \"\\n\";'],\n\
             [1 => ['pipe', 'w'], 200 => ['pipe', 'r']], $pipes);\n\
         stream_set_timeout($pipes[1], 5);\n\
         echo stream_get_contents($pipes[1]);\n\
         fclose($pipes[1]);\n\
         fclose($pipes[200]);\n\
         echo 'exit ', proc_close($child), \"\\n\";\n",
    );
    let ruby_parent = job(
        "ruby",
        "main.rb",
        "read, write = IO.pipe\n\
         child = ['ruby', '-r/usr/local/lib/code-runner/warm-runtime.rb', '-e', 'puts \"child ran #{ARGV.size}\"']\n\
         print IO.popen(child, 200 => read, &:read)\n\
         puts \"exit #{$?.exitstatus}\"\n",
    );
    let parents = [
        (python_parent, "child ran ['-c']\nexit 0\n"),
        (php_parent, "child ran 1\nexit 0\n"),
        (ruby_parent, "child ran 0\nexit 0\n"),
    ];
    for start in [StartKind::Cold, StartKind::WarmRuntime] {
        let harness = Harness::new().await.on(start);
        for (parent, expected) in &parents {
            let result = harness.run(parent).await;
            assert_eq!(result.start, Some(start), "{result:#?}");
            assert_eq!(stdout(&result), *expected, "{start:?}: {result:#?}");
        }
        harness.assert_clean().await;
    }
}

#[tokio::test]
async fn a_job_that_does_not_fit_a_runtime_holding_its_entry_file_never_sees_that_file() {
    let harness = Harness::new().await.on(StartKind::WarmRuntime);
    // A PHP runtime holds an empty main.php open: a job with another entry
    // runs in a plain warm sandbox without it.
    let listing = "<?php echo basename(__FILE__), ' ', implode(',', scandir('.')), ' ', getenv('PHPRC') ?: '-', \"\\n\";\n";
    let other = job("php", "index.php", listing);
    let result = on_runtime_pool(&harness, &other).await;
    assert_eq!(result.start, Some(StartKind::Warm), "{result:#?}");
    assert_eq!(stdout(&result), "index.php .,..,index.php -\n");
    // An env var PHP reads at its start.
    let mut configured = job("php", "main.php", listing);
    configured.env.insert("PHPRC".into(), "/tmp".into());
    let result = on_runtime_pool(&harness, &configured).await;
    assert_eq!(result.start, Some(StartKind::Warm), "{result:#?}");
    assert_eq!(stdout(&result), "main.php .,..,main.php /tmp\n");
    // The same job on its default entry, without env, runs on the runtime,
    // its own content read from the file the runtime held open.
    let plain = job("php", "main.php", listing);
    let result = on_runtime_pool(&harness, &plain).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(stdout(&result), "main.php .,..,main.php -\n");
    harness.assert_clean().await;
}

/// A hostile program on php's, ruby's or R's warm runtime, and how it must end.
struct Hostile {
    language: &'static str,
    entry: &'static str,
    source: &'static str,
    limits: LimitsRequest,
    status: Status,
    reason: Reason,
    /// What stdout must start with.
    stdout: &'static str,
}

impl Hostile {
    /// Allocates past `memory_mb`: ends `memory_limit`.
    fn memory(
        language: &'static str,
        entry: &'static str,
        source: &'static str,
        memory_mb: u64,
    ) -> Self {
        Self::failing(
            language,
            entry,
            source,
            LimitsRequest {
                memory_mb: Some(memory_mb),
                ..Default::default()
            },
            Reason::MemoryLimit,
        )
    }

    /// Spins past 1 s of CPU, well within its wall limit: `cpu_timeout`.
    fn cpu(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            status: Status::TimedOut,
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    cpu_ms: Some(1000),
                    wall_ms: Some(20_000),
                    ..Default::default()
                },
                Reason::CpuTimeout,
            )
        }
    }

    /// Sleeps past 1 s of wall time: `wall_timeout`.
    fn wall(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            status: Status::TimedOut,
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    wall_ms: Some(1000),
                    ..Default::default()
                },
                Reason::WallTimeout,
            )
        }
    }

    /// Prints `%08d\n` lines for ever past 100 000 bytes: `output_limit`,
    /// the first bytes kept.
    fn output(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            stdout: "00000000\n00000001\n",
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    output_bytes: Some(100_000),
                    ..Default::default()
                },
                Reason::OutputLimit,
            )
        }
    }

    /// Writes 64 MB into an 8 MB disk: the program fails (exits non-zero).
    fn disk(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self::failing(
            language,
            entry,
            source,
            LimitsRequest {
                disk_mb: Some(8),
                ..Default::default()
            },
            Reason::Exited,
        )
    }

    fn failing(
        language: &'static str,
        entry: &'static str,
        source: &'static str,
        limits: LimitsRequest,
        reason: Reason,
    ) -> Self {
        Self {
            language,
            entry,
            source,
            limits,
            status: Status::Failed,
            reason,
            stdout: "",
        }
    }
}

/// The limits the supervisor sets on a released runtime (rlimits by
/// `prlimit`, its watch of wall, CPU and output) and the container's
/// (memory, pids) hold on php's warm runtime (the one that holds its entry
/// file open), ruby's (the one fed its script) and R's (fed, hookless) as
/// on any stage;
/// python's run every hostile test of `sandbox_limits.rs` and
/// `sandbox_escape.rs`.
#[tokio::test]
async fn hostile_php_ruby_and_r_programs_on_a_warm_runtime_hit_their_limits() {
    let harness = Harness::new().await.on(StartKind::WarmRuntime);
    let cases = [
        Hostile::memory(
            "php",
            "main.php",
            "<?php ini_set('memory_limit', '-1'); $c = []; for (;;) { $c[] = str_repeat('x', 8 << 20); }\n",
            64,
        ),
        Hostile {
            language: "php",
            entry: "main.php",
            source: "<?php echo \"forking\\n\"; $said = false;\nfor (;;) { $p = pcntl_fork(); if ($p === 0) { sleep(30); exit(0); } if ($p < 0 && !$said) { echo \"fork refused\\n\"; $said = true; } }\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(2000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "forking\nfork refused\n",
        },
        Hostile::cpu("php", "main.php", "<?php for (;;) {}\n"),
        Hostile::wall("php", "main.php", "<?php sleep(3600);\n"),
        Hostile::output(
            "php",
            "main.php",
            "<?php for ($i = 0; ; $i++) { printf(\"%08d\\n\", $i); }\n",
        ),
        Hostile::memory(
            "ruby",
            "main.rb",
            "chunks = []\nloop { chunks << 'x' * (8 << 20) }\n",
            64,
        ),
        Hostile {
            language: "ruby",
            entry: "main.rb",
            // Ruby's fork waits and tries again when the kernel refuses
            // (EAGAIN) rather than raise: count what it got in 1.5 s.
            source: "n = 0\nThread.new { sleep 1.5; puts(n < 16 ? 'capped' : \"not capped: #{n}\"); $stdout.flush }\n\
                     loop { fork { sleep 30 }; n += 1 }\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(2000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "capped\n",
        },
        Hostile::cpu("ruby", "main.rb", "loop {}\n"),
        Hostile::wall("ruby", "main.rb", "sleep 3600\n"),
        Hostile::output(
            "ruby",
            "main.rb",
            "i = 0\nloop { printf(\"%08d\\n\", i); i += 1 }\n",
        ),
        Hostile::disk(
            "ruby",
            "main.rb",
            "File.write('/tmp/big', 'x' * (64 << 20))\n",
        ),
        Hostile::memory(
            "r",
            "main.r",
            "x <- list()\nrepeat x[[length(x) + 1]] <- numeric(1e6)\n",
            128,
        ),
        Hostile {
            language: "r",
            entry: "main.r",
            source: "n <- 0\nfor (i in 1:40) {\n  rc <- suppressWarnings(system('sleep 30 &', ignore.stdout = TRUE, ignore.stderr = TRUE))\n  if (rc == 0) n <- n + 1\n}\n\
                     cat(if (n < 16) 'capped' else paste('not capped:', n), '\\n', sep = '')\nSys.sleep(30)\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(3000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "capped\n",
        },
        Hostile::cpu("r", "main.r", "repeat {}\n"),
        Hostile::wall("r", "main.r", "Sys.sleep(3600)\n"),
        Hostile::output(
            "r",
            "main.r",
            "i <- 0\nrepeat { cat(sprintf('%08d\\n', i)); i <- i + 1 }\n",
        ),
        Hostile::disk("r", "main.r", "writeBin(raw(64 * 2^20), '/tmp/big')\n"),
    ];
    for case in &cases {
        let spec = job_with_limits(case.language, case.entry, case.source, case.limits);
        let result = on_runtime_pool(&harness, &spec).await;
        assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
        assert_eq!(result.status, case.status, "{}: {result:#?}", case.source);
        let run = result.run.as_ref().unwrap();
        assert_eq!(run.reason, case.reason, "{}: {result:#?}", case.source);
        assert!(stdout(&result).starts_with(case.stdout), "{result:#?}");
        // The cases with a pids limit are the ones that fork past it.
        assert_eq!(
            run.pids_limit_reached,
            Some(case.limits.pids.is_some()),
            "{}: {result:#?}",
            case.source
        );
        if case.reason == Reason::OutputLimit {
            // Cut at the limit, keeping exactly the first bytes.
            assert!(run.truncated);
            let expected: String = (0..20_000).map(|i| format!("{i:08}\n")).collect();
            assert_eq!(stdout(&result), expected[..100_000]);
        }
    }
    // As the sandbox's uid, not root, with no file of an earlier job.
    let who = job(
        "php",
        "main.php",
        "<?php var_export([posix_getuid() != 0, scandir('/tmp'), is_readable('/proc/1/environ')]); echo \"\\n\";\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(
        stdout(&result),
        "array (\n  0 => true,\n  1 => \n  array (\n    0 => '.',\n    1 => '..',\n  ),\n  2 => false,\n)\n"
    );
    let who = job(
        "ruby",
        "main.rb",
        "p [Process.uid != 0, Dir.children('/tmp'), File.readable?('/proc/1/environ'), Dir.children('.')]\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(stdout(&result), "[true, [], false, [\"main.rb\"]]\n");
    // R's /tmp holds only its own session directory.
    let who = job(
        "r",
        "main.r",
        "cat(Sys.info()[['effective_user']] != 'root', grepl('^Rtmp', list.files('/tmp')),\n\
             file.access('/proc/1/environ', 4) == 0, list.files('.', all.files = TRUE, no.. = TRUE), '\\n')\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(stdout(&result), "TRUE TRUE FALSE main.r \n");
    harness.assert_clean().await;
}
