//! Which job a warm runtime serves, and how: a job waits for a runtime
//! still starting and keeps its whole wall limit; a job whose environment,
//! entry or script the runtime started ahead cannot honour runs on a fresh
//! one; a child given a pipe as the hook's descriptor does not wait for a
//! job; a job that does not fit a runtime holding its entry file never sees
//! that file.

use crate::common;

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{StartKind, Status};
use code_runner::protocol::Reason;
use common::*;

use super::on_runtime_pool;

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
