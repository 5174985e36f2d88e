"""Drives a server through the unmodified judge0 SDK (PyPI `judge0`).

    python judge0_client.py URL KEY SCENARIO

Prints what the SDK returned, as JSON. Scenarios: statuses, batch, polling.
"""
import json
import sys
import time

import judge0
from judge0 import Status, Submission

url, key, scenario = sys.argv[1:4]
client = judge0.Client(url, headers={"X-Auth-Token": key})


def seen(submission):
    return {
        "status": int(submission.status) if submission.status is not None else None,
        "stdout": submission.stdout,
        "stderr": submission.stderr,
        "compile_output": submission.compile_output,
        "message": submission.message,
        "exit_code": submission.exit_code,
        "exit_signal": submission.exit_signal,
        "time": submission.time,
        "memory": submission.memory,
        "token": str(submission.token) if submission.token else None,
    }


C_ID = 50
out = {"languages": len(client.languages), "batch_size": client.config.max_submission_batch_size}
if scenario == "statuses":
    cases = {
        "accepted": Submission(source_code="print(input()[::-1])", language=judge0.PYTHON,
                               stdin="olleh", expected_output="hello"),
        "wrong_answer": Submission(source_code="print('nope')", language=judge0.PYTHON,
                                   expected_output="hello"),
        "time_limit": Submission(source_code="while True:\n    pass", language=judge0.PYTHON,
                                 cpu_time_limit=1, wall_time_limit=5),
        "compilation_error": Submission(source_code="int main(void) { return nope; }", language=C_ID),
        "sigsegv": Submission(source_code="int main(void) { volatile int *p = 0; return *p; }",
                              language=C_ID),
        "sigxfsz": Submission(source_code="import sys\nsys.stdout.write('x' * (3 << 20))",
                              language=judge0.PYTHON),
        "sigfpe": Submission(source_code="int main(void) { volatile int a = 10, z = 0; return a / z; }",
                             language=C_ID),
        "sigabrt": Submission(source_code="#include <stdlib.h>\nint main(void) { abort(); }", language=C_ID),
        "nzec": Submission(source_code="import sys\nprint('bye', file=sys.stderr)\nsys.exit(3)",
                           language=judge0.PYTHON),
        "other": Submission(source_code="x = bytearray(400 << 20)\nprint(len(x))", language=judge0.PYTHON,
                            memory_limit=65536),
        "cpp_alias": Submission(source_code="#include <iostream>\nint main(){std::cout<<\"c++\\n\";}",
                                language=judge0.CPP),
        "java": Submission(source_code="public class Main { public static void main(String[] a) { System.out.println(a.length + \" \" + a[1]); } }",
                           language=judge0.JAVA, command_line_arguments="x 'y z'"),
        "unicode": Submission(source_code="print(input() + ' ✓')", language=judge0.PYTHON, stdin="ünï"),
    }
    for name, submission in cases.items():
        result = judge0.run(client=client, submissions=submission)
        out[name] = seen(result)
elif scenario == "batch":
    submissions = [
        Submission(source_code=f"print({n} * {n})", language=judge0.PYTHON) for n in range(5)
    ]
    results = judge0.run(client=client, submissions=submissions)
    out["batch"] = [seen(r) for r in results]
elif scenario == "polling":
    submission = Submission(source_code="import time\ntime.sleep(2)\nprint('late')", language=judge0.PYTHON)
    client.create_submission(submission)
    statuses = []
    deadline = time.time() + 60
    while time.time() < deadline:
        client.get_submission(submission, fields=["status", "stdout"])
        statuses.append(int(submission.status))
        if submission.is_done():
            break
        time.sleep(0.2)
    out["statuses"] = statuses
    out["final"] = seen(submission)
print(json.dumps(out))
