# code-runner's warm runtime for Python (see docs/warm-runtimes.md).
#
# Run by warm-runtime.pth while Python imports `site`, and only when
# descriptor 200 is a pipe and the parent is the supervisor (PID 1): the
# supervisor started `python3 -u main.py` before the job came, with its
# control pipe as descriptor 200. The wait is put off
# until `site` has done the rest of its work (the other site directories,
# `sitecustomize`, `usercustomize`): the last of those steps `site.main()`
# takes is wrapped for one call and put back before the wrapper returns. So
# Python has done its whole start-up except running the main script when it
# waits for the job's args (each followed by a NUL byte, then EOF); it puts
# them where a cold start would have them (sys.argv, sys.orig_argv), closes
# the pipe and returns. Python then runs main.py exactly as it does on a
# cold start: same __main__, tracebacks, sys.path[0], exit handling. Nothing
# is left behind: this runs in a namespace of its own, imports nothing new
# (`site` is the module being imported) and leaves `site` as it was.
import os
import site
import sys


def wait_for_the_job():
    chunks = []
    while True:
        chunk = os.read(200, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(200)
    args = [os.fsdecode(arg) for arg in b"".join(chunks).split(b"\0")[:-1]]
    sys.argv.extend(args)
    sys.orig_argv.extend(args)


# `site.main()` calls `execusercustomize` last when the user site is on (it
# is decided before the .pth files are read), else `execsitecustomize`.
last_step = "execusercustomize" if site.ENABLE_USER_SITE else "execsitecustomize"
step = getattr(site, last_step)


def step_then_wait():
    setattr(site, last_step, step)
    step()
    wait_for_the_job()


setattr(site, last_step, step_then_wait)
