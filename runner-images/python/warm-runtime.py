# code-runner's warm runtime for Python (see docs/warm-runtimes.md).
#
# Run by warm-runtime.pth while Python imports `site`, and only when
# descriptor 200 is a pipe: the supervisor started `python3 -u main.py` before
# the job came, with its control pipe as descriptor 200. Here Python has done
# its whole start-up except running the main script; it waits for the job's
# args (each followed by a NUL byte, then EOF), puts them where a cold start
# would have them (sys.argv, sys.orig_argv), closes the pipe and returns.
# Python then runs main.py exactly as it does on a cold start: same
# __main__, tracebacks, sys.path[0], exit handling. Nothing is left behind:
# this runs in a namespace of its own and imports nothing new.
import os
import sys

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
