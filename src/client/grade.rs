//! `code-runner run FILE --tests DIR`: the tests of a directory of
//! `NAME.in` / `NAME.out` pairs, and the table of verdicts printed at the
//! end. The exit code is 0 only when every test was accepted.

use std::path::Path;

use crate::exit;
use crate::job::JobResult;
use crate::job::grading::{Grading, TestSpec, Verdict};

/// Exit code of a graded run with a test not accepted (or a compile error).
pub const NOT_ALL_PASSED: u8 = 1;

fn text(bytes: Vec<u8>, what: &Path) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|_| {
        format!(
            "{} is not UTF-8 text; tests are read as text",
            what.display()
        )
    })
}

/// The tests of `dir`, sorted by name: each `NAME.in` is a test's stdin and
/// its `NAME.out`, when there is one, the expected stdout. An `.out` with
/// no `.in`, or a directory with no `.in` at all, is an error.
pub fn tests_from_dir(dir: &Path) -> Result<Vec<TestSpec>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the tests directory {}: {e}", dir.display()))?;
    let mut inputs = std::collections::BTreeSet::new();
    let mut outputs = std::collections::BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".in") {
            inputs.insert(stem.to_string());
        } else if let Some(stem) = name.strip_suffix(".out") {
            outputs.insert(stem.to_string());
        }
    }
    if let Some(orphan) = outputs.difference(&inputs).next() {
        return Err(format!(
            "{}: {orphan}.out has no {orphan}.in",
            dir.display()
        ));
    }
    if inputs.is_empty() {
        return Err(format!(
            "{} holds no NAME.in files (each test is NAME.in, with NAME.out for its expected output)",
            dir.display()
        ));
    }
    inputs
        .into_iter()
        .map(|name| {
            let input = dir.join(format!("{name}.in"));
            let stdin = text(
                std::fs::read(&input)
                    .map_err(|e| format!("cannot read {}: {e}", input.display()))?,
                &input,
            )?;
            let output = dir.join(format!("{name}.out"));
            let expected_stdout = match std::fs::read(&output) {
                Ok(bytes) => Some(text(bytes, &output)?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("cannot read {}: {e}", output.display())),
            };
            Ok(TestSpec {
                name: Some(name),
                stdin,
                expected_stdout,
                ..TestSpec::default()
            })
        })
        .collect()
}

fn millis(ms: u64) -> String {
    format!("{ms} ms")
}

fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The table of a graded job's verdicts, one line per test, then the
/// summary line.
pub fn table(grading: &Grading) -> String {
    let width = grading
        .tests
        .iter()
        .map(|t| t.name.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:>3}  {:<width$}  {:<14}  {:>9}  {:>9}  {:>10}  details\n",
        "#", "test", "verdict", "wall", "cpu", "memory"
    );
    for test in &grading.tests {
        let o = &test.outcome;
        let verdict = match (o.verdict, o.time_limit) {
            (Verdict::TimeLimit, Some(limit)) => format!(
                "time_limit/{}",
                match limit {
                    crate::job::grading::TimeLimit::Wall => "wall",
                    crate::job::grading::TimeLimit::Cpu => "cpu",
                }
            ),
            (verdict, _) => verdict.as_str().to_string(),
        };
        let details = match (&o.difference, &o.message) {
            (Some(d), _) => format!(
                "line {}{}: expected {}, got {}",
                d.line,
                d.token.map(|t| format!(" token {t}")).unwrap_or_default(),
                d.expected
                    .as_deref()
                    .map_or("(end)".to_string(), |e| format!("{e:?}")),
                d.got
                    .as_deref()
                    .map_or("(end)".to_string(), |g| format!("{g:?}")),
            ),
            (None, Some(message)) => message.clone(),
            (None, None) => String::new(),
        };
        let ran = o.verdict != Verdict::Skipped;
        out.push_str(&format!(
            "{:>3}  {:<width$}  {:<14}  {:>9}  {:>9}  {:>10}  {}\n",
            test.index + 1,
            test.name,
            verdict,
            if ran { millis(o.wall_ms) } else { "-".into() },
            if ran { millis(o.cpu_ms) } else { "-".into() },
            if ran {
                mebibytes(o.memory_peak_bytes)
            } else {
                "-".into()
            },
            details.trim_end(),
        ));
    }
    out.push_str(&format!(
        "passed {}/{}, score {}/{}: {}\n",
        grading.passed,
        grading.total,
        grading.score,
        grading.max_score,
        grading.verdict.as_str()
    ));
    out
}

/// Prints a graded job's table (and its compiler's output when the compile
/// failed) and returns the exit code: 0 when every test was accepted, 1
/// when one was not, the platform's codes otherwise.
pub fn finish(result: &JobResult, grading: &Grading) -> u8 {
    if grading.verdict == Verdict::CompileError
        && let Some(compile) = &result.compile
    {
        eprint!("{}", String::from_utf8_lossy(compile.stderr.as_bytes()));
        eprint!("{}", String::from_utf8_lossy(compile.stdout.as_bytes()));
    }
    print!("{}", table(grading));
    match result.status {
        crate::job::Status::Succeeded => 0,
        crate::job::Status::Failed | crate::job::Status::TimedOut => NOT_ALL_PASSED,
        _ => {
            let (code, message) = exit::for_result(result);
            if let Some(message) = message {
                eprintln!("code-runner: {message}");
            }
            code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_of_pairs_is_tests_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.in"), "2 2\n").unwrap();
        std::fs::write(dir.path().join("b.out"), "4\n").unwrap();
        std::fs::write(dir.path().join("a.in"), "1 1\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let tests = tests_from_dir(dir.path()).unwrap();
        assert_eq!(tests.len(), 2);
        assert_eq!(
            (
                tests[0].name.as_deref(),
                tests[0].stdin.as_str(),
                tests[0].expected_stdout.as_deref()
            ),
            (Some("a"), "1 1\n", None)
        );
        assert_eq!(
            (
                tests[1].name.as_deref(),
                tests[1].expected_stdout.as_deref()
            ),
            (Some("b"), Some("4\n"))
        );
        std::fs::write(dir.path().join("c.out"), "x").unwrap();
        assert!(
            tests_from_dir(dir.path())
                .unwrap_err()
                .ends_with("c.out has no c.in")
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(
            tests_from_dir(empty.path())
                .unwrap_err()
                .contains("holds no NAME.in files")
        );
    }
}
