//! Jobe's REST API (what Moodle's CodeRunner calls) against a real
//! `code-runner serve`, redis-server and dockerd, with the programs of
//! CodeRunner questions in real languages: each Jobe outcome from a real
//! compiler or runtime's behaviour, Jobe's parameters (compileargs,
//! interpreterargs, runargs, memorylimit, numprocs, cputime), support
//! files by id, and Java named by its main class. (Every route and
//! refusal is tested without Docker in the `api` binary.)

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::common;

use common::daemon::{Daemon, DaemonBuilder, KEY_A, Role};
use common::redis_server::RedisServer;

const JOBE: &str = "/jobe/index.php/restapi";

async fn serve() -> (Daemon, RedisServer) {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .start()
        .await;
    (daemon, redis)
}

/// `POST runs` of `spec` as key a: Jobe's result object.
async fn run(daemon: &Daemon, spec: Value) -> Value {
    let response = daemon
        .http
        .post(format!("{}{JOBE}/runs", daemon.url))
        .header("X-API-KEY", KEY_A)
        .json(&json!({ "run_spec": spec }))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{spec}: {answer}");
    answer
}

fn c(source: &str) -> Value {
    json!({"language_id": "c", "sourcecode": source, "sourcefilename": "prog.c"})
}

fn with(mut spec: Value, parameters: Value) -> Value {
    spec["parameters"] = parameters;
    spec
}

#[tokio::test]
async fn c_programs_get_jobes_outcomes() {
    let (daemon, _redis) = serve().await;
    let hello = run(
        &daemon,
        c("#include <stdio.h>\nint main() {\n    printf(\"Hello world\\n\");\n}\n"),
    )
    .await;
    assert_eq!(
        (
            &hello["outcome"],
            &hello["stdout"],
            &hello["cmpinfo"],
            &hello["stderr"]
        ),
        (&json!(15), &json!("Hello world\n"), &json!(""), &json!(""))
    );
    let missing_semicolon = run(&daemon, c("int main() {\n    return 0\n}\n")).await;
    assert_eq!(missing_semicolon["outcome"], 11);
    assert!(
        missing_semicolon["cmpinfo"]
            .as_str()
            .unwrap()
            .contains("error: expected ‘;’"),
        "{missing_semicolon}"
    );
    // Jobe's defaults make warnings errors.
    let unused = run(
        &daemon,
        c("int main() {\n    int unused;\n    return 0;\n}\n"),
    )
    .await;
    assert_eq!(unused["outcome"], 11, "{unused}");
    assert!(
        unused["cmpinfo"]
            .as_str()
            .unwrap()
            .contains("-Werror=unused-variable")
    );
    // compileargs replace Jobe's defaults (here with a word gcc takes for a
    // file, as Jobe's own test does).
    let nonsense = run(
        &daemon,
        with(
            c("int main() { return 0; }\n"),
            json!({"compileargs": ["std=c89"]}),
        ),
    )
    .await;
    assert_eq!(nonsense["outcome"], 11, "{nonsense}");
    assert!(nonsense["cmpinfo"].as_str().unwrap().contains("std=c89"));
    let segfault = run(
        &daemon,
        c("#include <stdio.h>\nint main() {\n    char *s = NULL;\n    printf(\"%c\", *s);\n}\n"),
    )
    .await;
    assert_eq!(segfault["outcome"], 12, "{segfault}");
    let spin = run(
        &daemon,
        with(
            c("int main() {\n    while (1) {}\n}\n"),
            json!({"cputime": 1}),
        ),
    )
    .await;
    assert_eq!(
        (&spin["outcome"], &spin["stderr"]),
        (&json!(13), &json!(""))
    );
    // memorylimit bounds the address space, as under Jobe: malloc fails.
    let malloc = run(
        &daemon,
        c("#include <stdio.h>\n#include <stdlib.h>\nint main() {\n    char *p = malloc(2000000000);\n    printf(p == NULL ? \"NULL\\n\" : \"allocated\\n\");\n}\n"),
    )
    .await;
    assert_eq!(
        (&malloc["outcome"], &malloc["stdout"]),
        (&json!(15), &json!("NULL\n"))
    );
    let recursion = run(
        &daemon,
        c("#include <stdio.h>\nvoid f(int i, int d) {\n    if (i == 0) puts(\"never\");\n    else f(i + d, d);\n}\nint main() {\n    f(3, 1);\n}\n"),
    )
    .await;
    assert_eq!(recursion["outcome"], 12, "{recursion}");
    // numprocs bounds the processes.
    let forks = run(
        &daemon,
        with(
            c("#include <stdio.h>\n#include <unistd.h>\nint main() {\n    int ok = 0;\n    for (int i = 0; i < 200; i++) {\n        int pid = fork();\n        if (pid == 0) { while (1) {} }\n        if (pid > 0) ok++;\n    }\n    printf(ok > 5 && ok <= 20 ? \"OK\\n\" : \"%d\\n\", ok);\n}\n"),
            json!({"numprocs": 20}),
        ),
    )
    .await;
    assert_eq!(
        (&forks["outcome"], &forks["stdout"]),
        (&json!(15), &json!("OK\n"))
    );
    let bytes = run(
        &daemon,
        c("#include <stdio.h>\nint main() {\n    printf(\"Hi\\n\\01\\300\\n\");\n}\n"),
    )
    .await;
    assert_eq!(bytes["stdout"], "Hi\n\\x01\\xc0\n");
}

#[tokio::test]
async fn python_programs_get_jobes_outcomes_parameters_and_files() {
    let (daemon, _redis) = serve().await;
    let python = |source: &str| json!({"language_id": "python3", "sourcecode": source, "sourcefilename": "__tester__.python3"});
    let echo = run(
        &daemon,
        json!({"language_id": "python3", "sourcecode": "print(input())\nprint(input())\n",
            "input": "Line1\nLine2\n"}),
    )
    .await;
    assert_eq!(
        (&echo["outcome"], &echo["stdout"]),
        (&json!(15), &json!("Line1\nLine2\n"))
    );
    let syntax = run(&daemon, python("print('unclosed'\n")).await;
    assert_eq!(syntax["outcome"], 11, "{syntax}");
    assert!(syntax["cmpinfo"].as_str().unwrap().contains("SyntaxError"));
    let runtime = run(&daemon, python("print('before')\n1 / 0\n")).await;
    assert_eq!(
        (&runtime["outcome"], &runtime["stdout"]),
        (&json!(12), &json!("before\n"))
    );
    assert!(
        runtime["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    let interpreter = run(
        &daemon,
        with(
            python(""),
            json!({"interpreterargs": ["-c \"print(\\\"Blah\\\")\""]}),
        ),
    )
    .await;
    assert_eq!(interpreter["stdout"], "Blah\n", "{interpreter}");
    let args = run(
        &daemon,
        with(
            python("import sys\nprint(sys.argv[1:])\n"),
            json!({"runargs": ["Arg1", "'two words'"]}),
        ),
    )
    .await;
    assert_eq!(args["stdout"], "['Arg1', 'two words']\n");

    // A support file: missing, put, then read by the program.
    let id = "5d41402abc4b2a76b9719d911017c592";
    let reads = json!({"language_id": "python3", "sourcecode": "print(open('data.txt').read(), end='')\n",
        "file_list": [[id, "data.txt"]]});
    let missing = daemon
        .http
        .post(format!("{}{JOBE}/runs", daemon.url))
        .header("X-API-KEY", KEY_A)
        .json(&json!({ "run_spec": reads }))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let put = daemon
        .http
        .put(format!("{}{JOBE}/files/{id}", daemon.url))
        .header("X-API-KEY", KEY_A)
        .json(&json!({"file_contents": STANDARD.encode("hello\nfile\n")}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 204);
    let read = run(&daemon, reads).await;
    assert_eq!(
        (&read["outcome"], &read["stdout"]),
        (&json!(15), &json!("hello\nfile\n"))
    );

    // pylint as CodeRunner's style checks run it: silent on a clean file.
    let pylint = run(
        &daemon,
        python("import subprocess\nopen('s.py', 'w').write('\"\"\"Doc.\"\"\"\\nX = 1\\n')\nout = subprocess.run(['pylint', '--reports=no', 's.py'], capture_output=True, text=True)\nprint(repr(out.stdout.strip()), out.returncode)\n"),
    )
    .await;
    assert_eq!(pylint["stdout"], "'' 0\n", "{pylint}");
}

#[tokio::test]
async fn java_php_node_and_pascal_as_jobe_runs_them() {
    let (daemon, _redis) = serve().await;
    // Java without a file name: named by its public class with main.
    let main = "public class Greeter {\n    public static void main(String[] args) {\n        new Thing(\"Farewell\").show();\n    }\n}\n";
    let thing = "public class Thing {\n    private final String m;\n    public Thing(String m) { this.m = m; }\n    public void show() { System.out.println(m); }\n}\n";
    let id = "0a1b2c3d4e5f60718293";
    let put = daemon
        .http
        .put(format!("{}{JOBE}/files/{id}", daemon.url))
        .header("X-API-KEY", KEY_A)
        .json(&json!({"file_contents": STANDARD.encode(thing)}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 204);
    let java = run(
        &daemon,
        json!({"language_id": "java", "sourcecode": main, "file_list": [[id, "Thing.java"]]}),
    )
    .await;
    assert_eq!(
        (&java["outcome"], &java["stdout"]),
        (&json!(15), &json!("Farewell\n")),
        "{java}"
    );
    let broken = run(
        &daemon,
        json!({"language_id": "java", "sourcecode": "public class Broken {\n    public static void main(String[] a) { x }\n}\n"}),
    )
    .await;
    assert_eq!(broken["outcome"], 11, "{broken}");

    let php = run(
        &daemon,
        json!({"language_id": "php", "sourcecode": "<?php\necho \"hi\\n\";\n"}),
    )
    .await;
    assert_eq!(
        (&php["outcome"], &php["stdout"]),
        (&json!(15), &json!("hi\n"))
    );
    let php = run(
        &daemon,
        json!({"language_id": "php", "sourcecode": "<?php\necho \"hi\\n\"\n"}),
    )
    .await;
    assert_eq!(php["outcome"], 11, "{php}");
    assert!(php["cmpinfo"].as_str().unwrap().contains("Parse error"));

    let node = run(
        &daemon,
        json!({"language_id": "nodejs", "sourcecode": "console.log('Hello world!');\n"}),
    )
    .await;
    assert_eq!(
        (&node["outcome"], &node["stdout"]),
        (&json!(15), &json!("Hello world!\n"))
    );
    // Jobe compiles no JavaScript: a syntax error is a runtime error.
    let node = run(
        &daemon,
        json!({"language_id": "nodejs", "sourcecode": "console.log('x';\n"}),
    )
    .await;
    assert_eq!(node["outcome"], 12, "{node}");

    let pascal = run(
        &daemon,
        json!({"language_id": "pascal", "sourcecode": "begin\n  writeln('Hello world!');\nend.\n"}),
    )
    .await;
    assert_eq!(
        (&pascal["outcome"], &pascal["stdout"]),
        (&json!(15), &json!("Hello world!\n"))
    );
    let pascal = run(
        &daemon,
        json!({"language_id": "pascal", "sourcecode": "begin\n  writeln('Hello world!')\n  x;\nend.\n"}),
    )
    .await;
    assert_eq!(pascal["outcome"], 11, "{pascal}");
    assert!(!pascal["cmpinfo"].as_str().unwrap().is_empty());
}

/// `bench --scenario jobe`, the quiz burst's bench set: every run of every
/// burst is counted by its outcome and timed; a key that may hold fewer
/// runs than the burst gets Jobe's overload (21) for the rest, reported
/// and failing the run, never hidden.
#[tokio::test]
async fn the_jobe_bench_counts_every_run_of_every_burst() {
    let redis = RedisServer::start();
    let daemon = DaemonBuilder::new(Role::Serve, &redis)
        .env("CODE_RUNNER_WORKER_MAX_SANDBOXES", 2)
        .env(
            "CODE_RUNNER_API_KEYS",
            format!("a:{KEY_A},small:small-key-0123456789:2"),
        )
        .start()
        .await;
    let url = daemon.url.clone();
    let bench = |key: &'static str, language: &'static str, jobs: &'static str| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let args = [
                "--url",
                &url,
                "--key",
                key,
                "--scenario",
                "jobe",
                "--language",
                language,
                "--jobs",
                jobs,
                "--ladder",
            ];
            common::daemon::bench_json(&args)
        })
    };
    let (out, report) = bench(KEY_A, "python3", "6").await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["scenario"], "jobe");
    let sizes: Vec<u64> = report["bursts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [1, 2, 4, 6]);
    for burst in report["bursts"].as_array().unwrap() {
        let size = burst["size"].as_u64().unwrap();
        assert_eq!(burst["outcomes"], json!({"15": size}), "{report:#}");
        assert_eq!(burst["wrong_output"], 0);
        assert_eq!(burst["request_ms"]["samples"], size);
        assert!(
            burst["request_ms"]["p99"].as_f64().unwrap()
                <= burst["all_answered_ms"].as_f64().unwrap()
        );
    }
    assert_eq!(report["largest_clean_burst"], 6);
    assert_eq!(report["problems"], json!([]));

    let (out, report) = bench(KEY_A, "c", "2").await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["bursts"][1]["outcomes"], json!({"15": 2}));

    // A key that may hold 2 active jobs: a burst of 8 is partly refused.
    let (out, report) = bench("small-key-0123456789", "python3", "8").await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let last = &report["bursts"][3];
    assert_eq!(last["size"], 8);
    let outcomes = last["outcomes"].as_object().unwrap();
    let (ok, overload) = (
        outcomes.get("15").and_then(Value::as_u64).unwrap_or(0),
        outcomes.get("21").and_then(Value::as_u64).unwrap_or(0),
    );
    assert_eq!(ok + overload, 8, "{report:#}");
    assert!(overload >= 1, "{report:#}");
    assert!(!report["problems"].as_array().unwrap().is_empty());
}
