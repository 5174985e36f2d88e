//! Python programs of the warm runtime conformance suite: `sys.argv`,
//! `__main__`, the search path, `site` and the loaded modules, the working
//! directory, the environment, flags, encodings and locale, stdin and
//! `input()`, exits and `atexit` hooks, exceptions and their tracebacks,
//! warnings, limits, ids, descriptors, signals, child interpreters, forks
//! and threads.

use super::{Case, case};

pub(super) const PYTHON: &[Case] = &[
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
