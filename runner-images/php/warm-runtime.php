<?php
// code-runner's warm runtime for PHP (see docs/warm-runtimes.md).
//
// Every php of this image prepends this file (conf.d/99-code-runner.ini), so
// a cold start and a warm one include the same files; it does something only
// when descriptor 200 is a pipe and its parent is the supervisor: the
// supervisor started `php main.php` before the job came, with its control
// pipe as descriptor 200. PHP has then done
// its whole start-up and opened main.php, an empty file the supervisor made,
// but has not read it. This waits for the job's args (each followed by a NUL
// byte, then EOF), appends them to $argv and $_SERVER['argv'] (and their
// counts) as a cold start has them, sets the request time to now, closes the
// pipe (php://fd/200 is a copy of it, so descriptor 200 itself is closed
// through FFI) and returns; meanwhile the supervisor wrote the job's main.php
// into that same file. PHP then compiles and runs it exactly as on a cold
// start. A closure, so no name of this file is left defined.
(static function (): void {
    // Not a file test of /proc/self/fd/200: PHP resolves that link itself,
    // to "pipe:[…]", and finds nothing. php://fd/200 is a dup(2) of the
    // descriptor, which fails when there is none.
    $pipe = @fopen('php://fd/200', 'rb');
    if ($pipe === false) {
        error_clear_last();
        return;
    }
    if ((fstat($pipe)['mode'] & 0170000) !== 0010000) {
        fclose($pipe);
        return;
    }
    // Only the runtime the supervisor (PID 1) started waits: a child that
    // the job's program gave a pipe of its own as descriptor 200 does not.
    $libc = FFI::cdef('int close(int fd); int getppid(void);');
    if ($libc->getppid() !== 1) {
        fclose($pipe);
        return;
    }
    $data = stream_get_contents($pipe);
    fclose($pipe);
    $libc->close(200);
    $args = explode("\0", $data);
    array_pop($args);
    foreach ($args as $arg) {
        $GLOBALS['argv'][] = $arg;
        $_SERVER['argv'][] = $arg;
    }
    $GLOBALS['argc'] = count($GLOBALS['argv']);
    $_SERVER['argc'] = $GLOBALS['argc'];
    $now = microtime(true);
    $_SERVER['REQUEST_TIME_FLOAT'] = $now;
    $_SERVER['REQUEST_TIME'] = (int) $now;
})();
