//! JavaScript (Node.js) programs of the warm runtime conformance suite:
//! `process.argv`, `require.main` and the module cache, the environment and
//! the working directory, stdin read whole and by `readline`, exit codes,
//! exit hooks and timers, uncaught exceptions and rejections, `require`
//! from the workspace, signals, worker threads, forked and spawned
//! children, descriptors and stacks.

use super::{Case, case};

pub(super) const JAVASCRIPT: &[Case] = &[
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
