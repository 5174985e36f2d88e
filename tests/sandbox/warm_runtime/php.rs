//! PHP programs of the warm runtime conformance suite: `$argv` and
//! `$_SERVER`, the script's names and its own file, included files and
//! extensions, the start-up state, ini settings, the environment, output
//! buffering, exits and shutdown hooks, errors as the CLI shows them,
//! signals, limits, ids, descriptors, forks and child interpreters.

use super::{Case, case};

pub(super) const PHP: &[Case] = &[
    case("hello", "<?php echo 'hello', PHP_EOL;\n"),
    Case {
        args: &["a", "b c", "ünï", "--flag", ""],
        ..case(
            "argv",
            "<?php\n\
             var_export([$argv, $argc, $_SERVER['argv'], $_SERVER['argc'], $argv === $_SERVER['argv']]);\n\
             echo PHP_EOL;\n\
             var_export([array_map('strlen', $argv), $GLOBALS['argc'], array_is_list($argv)]);\n\
             echo PHP_EOL;\n",
        )
    },
    Case {
        args: &["x", "y z"],
        ..case(
            "argv_in_function_scope",
            "<?php\n\
             function args() { global $argv, $argc; return [$argv, $argc, $GLOBALS['argv'], $_SERVER['argc']]; }\n\
             var_export(args());\n\
             echo PHP_EOL;\n",
        )
    },
    Case {
        args: &["x"],
        ..case(
            "script_names",
            "<?php\n\
             var_export([$_SERVER['SCRIPT_NAME'], $_SERVER['PHP_SELF'], $_SERVER['SCRIPT_FILENAME'],\n\
             $_SERVER['PATH_TRANSLATED'], $_SERVER['DOCUMENT_ROOT'], __FILE__, __DIR__, __LINE__,\n\
             __FUNCTION__, __NAMESPACE__, realpath($argv[0]), get_included_files()]);\n\
             echo PHP_EOL;\n",
        )
    },
    case(
        "server_array",
        r#"<?php
$server = $_SERVER;
foreach (['REQUEST_TIME', 'REQUEST_TIME_FLOAT'] as $key) {
    $server[$key] = get_debug_type($server[$key]);
}
ksort($server);
var_export($server);
echo PHP_EOL;
var_export([
    $_SERVER['REQUEST_TIME'] === (int) $_SERVER['REQUEST_TIME_FLOAT'],
    abs(time() - $_SERVER['REQUEST_TIME']) < 10,
    array_keys($_SERVER),
]);
echo PHP_EOL;
"#,
    ),
    case(
        "environment",
        "<?php\n\
         $env = getenv();\n\
         ksort($env);\n\
         var_export($env);\n\
         echo PHP_EOL;\n\
         var_export([array_keys($_ENV), ini_get('variables_order'), getenv('HOME'), $_SERVER['HOME'] ?? null,\n\
         array_keys(getenv()) === array_keys($env), getenv('PWD')]);\n\
         echo PHP_EOL;\n",
    ),
    case(
        "included_files_and_include_path",
        "<?php\n\
         var_export([get_included_files(), get_include_path(), ini_get('auto_prepend_file'),\n\
         ini_get('auto_append_file'), php_ini_loaded_file(), php_ini_scanned_files(),\n\
         stream_resolve_include_path('main.php')]);\n\
         echo PHP_EOL;\n",
    ),
    case(
        "loaded_extensions",
        "<?php\n\
         var_export(get_loaded_extensions());\n\
         echo PHP_EOL;\n\
         var_export(get_loaded_extensions(true));\n\
         echo PHP_EOL;\n\
         foreach (get_loaded_extensions() as $ext) {\n\
         echo $ext, ' ', count(get_extension_funcs($ext) ?: []), PHP_EOL;\n\
         }\n",
    ),
    case(
        "state_at_start",
        r#"<?php
var_export([
    error_get_last(),
    array_keys(get_defined_vars()),
    array_keys($GLOBALS),
    get_defined_functions()['user'],
    count(get_defined_functions()['internal']),
    count(get_declared_classes()),
    array_slice(get_declared_classes(), -3),
    count(get_declared_interfaces()),
    count(get_declared_traits()),
    count(get_defined_constants()),
    get_defined_constants(true)['user'] ?? [],
    set_error_handler(null),
    set_exception_handler(null),
    spl_autoload_functions(),
    ob_get_level(),
    ob_list_handlers(),
    headers_list(),
    headers_sent(),
    http_response_code(),
    error_reporting(),
    gc_enabled(),
    debug_backtrace(),
]);
echo PHP_EOL;
$later = 1;
"#,
    ),
    case(
        "ini_settings",
        "<?php\n\
         $ini = ini_get_all(null, false);\n\
         ksort($ini);\n\
         var_export($ini);\n\
         echo PHP_EOL;\n\
         var_export(function_exists('opcache_get_status') ? opcache_get_status(false) : 'no opcache');\n\
         echo PHP_EOL;\n",
    ),
    case(
        "encodings_and_locale",
        "<?php\n\
         var_export([setlocale(LC_ALL, 0), setlocale(LC_CTYPE, 0), localeconv()['decimal_point'],\n\
         ini_get('default_charset'), iconv_get_encoding('all'), function_exists('mb_internal_encoding'),\n\
         PHP_EOL, PHP_OS, PHP_OS_FAMILY, PHP_INT_SIZE, date_default_timezone_get(),\n\
         strtoupper('é'), sprintf('%.2f', 1.5), ctype_alpha('é'), escapeshellarg('ü')]);\n\
         echo PHP_EOL;\n",
    ),
    case(
        "sapi_and_binary",
        "<?php\n\
         var_export([php_sapi_name(), PHP_SAPI, PHP_BINARY, PHP_VERSION, PHP_MAJOR_VERSION, PHP_MINOR_VERSION,\n\
         PHP_EXTRA_VERSION, PHP_DEBUG, PHP_ZTS, zend_version(), PHP_BINDIR, PHP_EXTENSION_DIR,\n\
         PHP_CONFIG_FILE_PATH, PHP_CONFIG_FILE_SCAN_DIR, php_uname('s'), php_uname('m'),\n\
         cli_get_process_title(), defined('STDIN'), defined('STDOUT'), defined('STDERR')]);\n\
         echo PHP_EOL;\n",
    ),
    case(
        "cwd_and_tmp",
        "<?php\n\
         var_export([getcwd(), scandir('.'), scandir('/tmp'), sys_get_temp_dir(), is_writable('.'),\n\
         is_writable('/tmp'), realpath('.'), getenv('TMPDIR')]);\n\
         echo PHP_EOL;\n",
    ),
    Case {
        files: &[("other.php", "<?php\n")],
        ..case(
            "entry_file_stat",
            "<?php\n\
             $uid = posix_getuid();\n\
             foreach ([__FILE__, __DIR__ . '/other.php'] as $f) {\n\
             var_export([basename($f), fileowner($f) == $uid, filegroup($f) == posix_getgid(),\n\
             sprintf('%o', fileperms($f)), filesize($f), is_readable($f), is_writable($f), filetype($f)]);\n\
             echo PHP_EOL;\n\
             }\n\
             var_export([getmyuid() == $uid, getmygid() == posix_getgid()]);\n\
             echo PHP_EOL;\n",
        )
    },
    case(
        "reads_its_own_source",
        "<?php\n\
         $source = file_get_contents(__FILE__);\n\
         var_export([strlen($source), substr_count($source, PHP_EOL), md5($source) === md5_file(__FILE__)]);\n\
         echo PHP_EOL;\n\
         echo file_get_contents(__FILE__, false, null, __COMPILER_HALT_OFFSET__);\n\
         __halt_compiler();data after halt\n\
         second ✓\n",
    ),
    case(
        "stdio_streams",
        "<?php\n\
         foreach ([STDIN, STDOUT, STDERR] as $stream) {\n\
         var_export([stream_get_meta_data($stream), get_resource_type($stream), stream_isatty($stream), posix_isatty($stream)]);\n\
         echo PHP_EOL;\n\
         }\n",
    ),
    case(
        "stdout_and_stderr",
        "<?php\n\
         echo 'out 1', PHP_EOL;\n\
         fwrite(STDERR, 'err 1' . PHP_EOL);\n\
         print 'out 2' . PHP_EOL;\n\
         file_put_contents('php://stderr', 'err 2' . PHP_EOL);\n\
         fwrite(STDOUT, 'out 3' . PHP_EOL);\n\
         file_put_contents('php://output', 'out 4' . PHP_EOL);\n\
         error_log('logged');\n\
         echo 'partial';\n",
    ),
    case(
        "large_output",
        "<?php\n\
         echo str_repeat('x', 200000), PHP_EOL;\n\
         fwrite(STDERR, str_repeat('y', 100000) . PHP_EOL);\n\
         echo 'end', PHP_EOL;\n",
    ),
    case("no_trailing_newline", "<?php echo 'partial';"),
    case(
        "inline_html",
        "before\n<?php echo 'inside', PHP_EOL; ?>\nafter\n<?= 1 + 1 ?>\nend",
    ),
    case(
        "shebang_line",
        "#!/usr/bin/env php\n\
         <?php\n\
         echo __LINE__, ' ', basename(__FILE__), PHP_EOL;\n\
         throw new Exception('line numbers count the shebang');\n",
    ),
    case(
        "unicode_and_bytes",
        "<?php\n\
         echo 'héllo ✓ 😀', PHP_EOL;\n\
         echo \"\\xff\\xfe raw\\n\";\n\
         echo strlen('ünï'), ' ', iconv_strlen('ünï'), PHP_EOL;\n",
    ),
    case(
        "output_buffers_left_open_at_exit",
        r#"<?php
register_shutdown_function(function () { echo "shutdown at level ", ob_get_level(), "\n"; });
ob_start();
echo "outer buffered\n";
ob_start(fn ($s) => strtoupper($s));
echo "inner buffered\n";
fwrite(STDERR, "stderr is not buffered\n");
"#,
    ),
    case(
        "output_buffer_chunks_and_flush",
        r#"<?php
var_export([ini_get('output_buffering'), ini_get('implicit_flush'), ob_get_level()]);
echo PHP_EOL;
ob_start(fn ($s) => $s === '' ? '' : "[$s]", 4);
echo 'ab';
echo 'cdef';
flush();
echo 'gh';
ob_flush();
echo 'tail';
ob_end_clean();
echo PHP_EOL, 'done', PHP_EOL;
"#,
    ),
    Case {
        stdin: "one\ntwo\nthree",
        ..case(
            "stdin_fgets_loop",
            "<?php\n\
             while (($line = fgets(STDIN)) !== false) {\n\
             echo strtoupper($line), '|', PHP_EOL;\n\
             }\n\
             var_export([feof(STDIN), fgets(STDIN)]);\n\
             echo PHP_EOL;\n",
        )
    },
    Case {
        stdin: "a\nb ✓\n",
        ..case(
            "stdin_stream_get_contents",
            "<?php\n\
             var_export([stream_get_contents(STDIN), stream_get_contents(STDIN),\n\
             file_get_contents('php://stdin'), feof(STDIN)]);\n\
             echo PHP_EOL;\n",
        )
    },
    Case {
        stdin: "Ada 7\n",
        ..case(
            "stdin_fscanf",
            "<?php\n\
             fscanf(STDIN, '%s %d', $name, $n);\n\
             echo 'hi ', $name, ' ', $n * 6, PHP_EOL;\n",
        )
    },
    case(
        "stdin_at_eof",
        "<?php\n\
         echo 'waiting', PHP_EOL;\n\
         var_export([fgets(STDIN), feof(STDIN), fread(STDIN, 10), stream_get_contents(STDIN)]);\n\
         echo PHP_EOL;\n",
    ),
    case("exit_code", "<?php\necho 'out', PHP_EOL;\nexit(7);\n"),
    case(
        "exit_string",
        "<?php\n\
         register_shutdown_function(fn () => print('shutdown' . PHP_EOL));\n\
         exit('bye now' . PHP_EOL);\n",
    ),
    case(
        "exit_in_a_shutdown_function",
        "<?php\n\
         register_shutdown_function(function () { echo 'first', PHP_EOL; exit(4); });\n\
         register_shutdown_function(function () { echo 'second', PHP_EOL; });\n\
         echo 'main', PHP_EOL;\n\
         exit(2);\n",
    ),
    case(
        "shutdown_functions_and_destructors",
        r#"<?php
class Noisy
{
    public function __construct(public string $name) {}
    public function __destruct() { echo "destruct {$this->name}\n"; }
}
$kept = new Noisy('global');
$gone = new Noisy('unset');
unset($gone);
register_shutdown_function(function () { echo "shutdown 1\n"; });
register_shutdown_function(function ($arg) { echo "shutdown 2 $arg\n"; }, 'with arg');
echo "main\n";
"#,
    ),
    case(
        "uncaught_exception",
        "<?php\n\
         function inner() {\n\
         throw new RuntimeException('boom');\n\
         }\n\
         function outer() {\n\
         inner();\n\
         }\n\
         outer();\n",
    ),
    Case {
        files: &[(
            "helper.php",
            "<?php\nfunction explode_here(): void\n{\n    throw new LogicException('from helper');\n}\n",
        )],
        ..case(
            "exception_in_an_included_file",
            "<?php\nrequire 'helper.php';\necho 'loaded', PHP_EOL;\nexplode_here();\n",
        )
    },
    Case {
        files: &[(
            "lib.php",
            "<?php\n\
             echo 'lib: ', __FILE__, ' ', __DIR__, ' ', $_SERVER['SCRIPT_NAME'], ' ', count(get_included_files()), PHP_EOL;\n\
             return ['value' => 42];\n",
        )],
        ..case(
            "include_a_second_file",
            "<?php\n\
             $v = include 'lib.php';\n\
             var_export([$v, include_once 'lib.php', require_once __DIR__ . '/lib.php', get_included_files()]);\n\
             echo PHP_EOL;\n\
             var_export(@include 'missing.php');\n\
             echo PHP_EOL;\n\
             include 'missing.php';\n\
             echo 'after', PHP_EOL;\n",
        )
    },
    case("parse_error", "<?php\necho 'never';\nfunction f( {\n}\n"),
    case(
        "warnings_notices_and_deprecations",
        "<?php\n\
         echo $undefined;\n\
         $a = [];\n\
         echo $a['key'];\n\
         echo intdiv(10, 4), PHP_EOL;\n\
         trigger_error('custom notice', E_USER_NOTICE);\n\
         trigger_error('custom warning', E_USER_WARNING);\n\
         trigger_error('old api', E_USER_DEPRECATED);\n\
         echo strlen(null), PHP_EOL;\n\
         var_export(error_get_last());\n\
         echo PHP_EOL;\n",
    ),
    case(
        "displayed_errors",
        "<?php\n\
         ini_set('display_errors', '1');\n\
         error_reporting(E_ALL);\n\
         echo $undefined;\n\
         echo strlen(null), PHP_EOL;\n\
         ini_set('display_errors', 'stderr');\n\
         $x = [] + 1;\n",
    ),
    Case {
        files: &[("dup.php", "<?php\nfunction twice() {}\n")],
        ..case(
            "fatal_error_in_an_included_file",
            "<?php\n\
             function twice() {}\n\
             register_shutdown_function(function () {\n\
             $e = error_get_last();\n\
             echo 'shutdown saw: ', $e['type'], ' ', $e['message'], ' at ', basename($e['file']), ':', $e['line'], PHP_EOL;\n\
             });\n\
             include 'dup.php';\n\
             echo 'never', PHP_EOL;\n",
        )
    },
    case(
        "memory_limit_fatal",
        "<?php\n\
         ini_set('memory_limit', '16M');\n\
         echo 'start', PHP_EOL;\n\
         $s = str_repeat('x', 32 * 1024 * 1024);\n\
         echo 'never', PHP_EOL;\n",
    ),
    case(
        "strict_types_type_error",
        "<?php\n\
         declare(strict_types=1);\n\
         function twice(int $n): int { return $n * 2; }\n\
         echo twice(21), PHP_EOL;\n\
         echo twice('21'), PHP_EOL;\n",
    ),
    case(
        "killed_by_its_own_sigterm",
        "<?php\n\
         register_shutdown_function(fn () => print('never' . PHP_EOL));\n\
         echo 'before', PHP_EOL;\n\
         posix_kill(posix_getpid(), SIGTERM);\n\
         usleep(200000);\n\
         echo 'after', PHP_EOL;\n",
    ),
    case(
        "killed_by_its_own_sigkill",
        "<?php\n\
         echo 'x';\n\
         posix_kill(posix_getpid(), SIGKILL);\n\
         usleep(200000);\n\
         echo 'after', PHP_EOL;\n",
    ),
    case(
        "trapped_signals",
        r#"<?php
var_export([pcntl_async_signals(), pcntl_signal_get_handler(SIGUSR1), pcntl_signal_get_handler(SIGTERM)]);
echo PHP_EOL;
$got = [];
pcntl_signal(SIGUSR1, function (int $signo) use (&$got) { $got[] = 'usr1'; });
posix_kill(posix_getpid(), SIGUSR1);
var_export([$got, pcntl_signal_dispatch(), $got]);
echo PHP_EOL;
pcntl_async_signals(true);
pcntl_signal(SIGTERM, function (int $signo) use (&$got) { $got[] = 'term'; });
posix_kill(posix_getpid(), SIGTERM);
for ($i = 0; $i < 20 && count($got) < 2; $i++) {
    usleep(10000);
}
var_export($got);
echo PHP_EOL;
"#,
    ),
    case(
        "signal_dispositions",
        "<?php\n\
         foreach (file('/proc/self/status') as $line) {\n\
         if (preg_match('/^Sig(Blk|Ign|Cgt)/', $line)) {\n\
         echo $line;\n\
         }\n\
         }\n",
    ),
    case(
        "sigpipe",
        r#"<?php
[$a, $b] = stream_socket_pair(STREAM_PF_UNIX, STREAM_SOCK_STREAM, STREAM_IPPROTO_IP);
fclose($a);
var_export([@fwrite($b, 'x'), error_get_last()['message'] ?? null]);
echo PHP_EOL;
$child = proc_open(['sh', '-c', '{ yes; echo "yes: $?" >&2; } | head -n 1'], [], $pipes);
$status = proc_close($child);
echo 'sh exited ', $status, PHP_EOL;
"#,
    ),
    case(
        "ids_and_limits",
        "<?php\n\
         $uid = posix_getuid();\n\
         var_export([$uid != 0, $uid == posix_geteuid(), posix_getgid() == posix_getegid(), $uid == posix_getgid(),\n\
         posix_getgroups() == [posix_getgid()], sprintf('%04o', umask())]);\n\
         echo PHP_EOL;\n\
         var_export(posix_getrlimit());\n\
         echo PHP_EOL;\n",
    ),
    case(
        "session_and_group",
        "<?php\n\
         $pid = posix_getpid();\n\
         var_export([posix_getsid(0) == $pid, posix_getpgrp() == $pid, posix_getpgid(0) == posix_getpgrp(),\n\
         posix_getppid() == 1, posix_isatty(STDIN), posix_ttyname(STDOUT), posix_ctermid(),\n\
         @fopen('/dev/tty', 'r')]);\n\
         echo PHP_EOL;\n",
    ),
    case(
        "descriptors",
        r#"<?php
foreach (scandir('/proc/self/fd') as $fd) {
    if ($fd === '.' || $fd === '..') {
        continue;
    }
    $link = @readlink("/proc/self/fd/$fd");
    echo $fd, ' ', $link === false ? 'gone' : preg_replace('/\[\d+\]/', '[N]', $link), PHP_EOL;
}
var_export(file_exists('/proc/self/fd/200'));
echo PHP_EOL;
"#,
    ),
    case(
        "fork_and_wait",
        r#"<?php
$pid = pcntl_fork();
if ($pid === 0) {
    echo 'child', PHP_EOL;
    exit(5);
}
pcntl_waitpid($pid, $status);
var_export([pcntl_wifexited($status), pcntl_wexitstatus($status)]);
echo PHP_EOL;
$pid = pcntl_fork();
if ($pid === 0) {
    posix_kill(posix_getpid(), SIGKILL);
    exit(0);
}
pcntl_waitpid($pid, $status);
var_export([pcntl_wifsignaled($status), pcntl_wtermsig($status)]);
echo PHP_EOL;
"#,
    ),
    Case {
        files: &[(
            "child.php",
            "<?php\necho basename(__FILE__), ' ', json_encode($argv), ' ', json_encode(get_included_files()), PHP_EOL;\n",
        )],
        ..case(
            "child_php",
            r#"<?php
exec('php -r ' . escapeshellarg('var_export([$argv, php_sapi_name(), get_included_files()]);') . ' x ' . escapeshellarg('y z'), $out, $code);
echo implode(PHP_EOL, $out), PHP_EOL, $code, PHP_EOL;
system('php -r "exit(3);"', $rc);
echo $rc, PHP_EOL;
passthru('php child.php arg', $rc);
echo $rc, PHP_EOL;
$p = proc_open(['php', '-r', 'echo strtoupper(stream_get_contents(STDIN));'], [0 => ['pipe', 'r'], 1 => ['pipe', 'w']], $pipes);
fwrite($pipes[0], 'piped');
fclose($pipes[0]);
echo stream_get_contents($pipes[1]), ' ', proc_close($p), PHP_EOL;
"#,
        )
    },
    case(
        "backtraces",
        r#"<?php
function where() { return new Exception('where'); }
$e = where();
echo basename($e->getFile()), ':', $e->getLine(), PHP_EOL, $e->getTraceAsString(), PHP_EOL;
function frames() {
    return array_map(fn ($f) => [$f['function'], $f['line'] ?? null, basename($f['file'] ?? '-')], debug_backtrace());
}
var_export(frames());
echo PHP_EOL;
"#,
    ),
    case(
        "files_in_tmp",
        "<?php\n\
         file_put_contents('/tmp/note.txt', 'kept');\n\
         var_export([file_get_contents('/tmp/note.txt'), scandir('/tmp'), sprintf('%o', fileperms('/tmp/note.txt'))]);\n\
         echo PHP_EOL;\n",
    ),
];
