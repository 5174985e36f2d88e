//! A stage's output files: matched as the stage's uid after it ended,
//! sent between its output and its `stage_end`, for the run stage and for
//! each run of a plan (found before the run's files are wiped).

use std::time::Duration;

use code_runner_protocol::{HostMessage, OutputRequest, RunSpec, SandboxMessage};

use super::harness::{Outcome, Sandbox};

const T: Duration = Duration::from_secs(20);

fn request(patterns: &[&str]) -> Option<OutputRequest> {
    Some(OutputRequest {
        patterns: patterns.iter().map(|p| p.to_string()).collect(),
        max_files: 100,
        max_bytes: 1 << 20,
    })
}

/// Per stage, in order: its files (name, bytes) and its errors (pattern,
/// name, code); checks that every stage's outputs come before its end.
type Collected = Vec<(
    String,
    Vec<(String, Vec<u8>)>,
    Vec<(String, Option<String>, String)>,
)>;

fn by_stage(outcome: &Outcome) -> Collected {
    let mut stages: Collected = Vec::new();
    let mut open = false;
    for message in &outcome.messages {
        match message {
            SandboxMessage::StageStart(start) => {
                stages.push((start.stage.clone(), Vec::new(), Vec::new()));
                open = true;
            }
            SandboxMessage::StageEnd(_) => open = false,
            SandboxMessage::OutputFile(file) => {
                assert!(open, "an output file after the stage's end");
                stages
                    .last_mut()
                    .unwrap()
                    .1
                    .push((file.name.clone(), Vec::new()));
            }
            SandboxMessage::OutputData(data) => {
                let files = &mut stages.last_mut().unwrap().1;
                files.last_mut().unwrap().1.extend_from_slice(data);
            }
            SandboxMessage::OutputError(error) => {
                assert!(open, "an output error after the stage's end");
                stages.last_mut().unwrap().2.push((
                    error.pattern.clone(),
                    error.name.clone(),
                    error.error.clone(),
                ));
            }
            _ => {}
        }
    }
    stages
}

#[test]
fn the_run_stage_sends_its_files_even_when_it_failed() {
    let mut sb = Sandbox::start();
    let mut stage = sb.stage(
        "run",
        &[
            "/bin/sh",
            "-c",
            "mkdir out && printf 'a\\000\\377' > out/a.bin && echo b > out/b.bin && ln -s /etc/passwd out/c.bin && exit 3",
        ],
    );
    stage.outputs = request(&["out/*.bin", "missing.txt"]);
    sb.send(sb.bundle(vec![], vec![stage]));
    let outcome = sb.finish(T);
    assert_eq!(outcome.reports[0].exit_code, Some(3), "{outcome:?}");
    let stages = by_stage(&outcome);
    assert_eq!(
        stages[0].1,
        vec![
            ("out/a.bin".to_string(), b"a\0\xff".to_vec()),
            ("out/b.bin".to_string(), b"b\n".to_vec()),
        ]
    );
    assert_eq!(
        stages[0].2,
        vec![
            (
                "out/*.bin".to_string(),
                Some("out/c.bin".to_string()),
                "not_regular_file".to_string()
            ),
            ("missing.txt".to_string(), None, "not_found".to_string()),
        ]
    );
}

#[test]
fn each_run_sends_what_it_wrote_before_its_files_are_wiped() {
    let mut sb = Sandbox::start();
    let tmp = tempfile::tempdir().unwrap();
    let ws = sb.workspace().display().to_string();
    let t = tmp.path().display().to_string();
    let bundle = sb.bundle_with_runs(vec![], vec![], vec![ws.clone()], &format!("{t}/run"));
    sb.send(bundle);
    for (index, answer) in ["one", "two"].into_iter().enumerate() {
        let mut stage = sb.stage(
            &format!("test:{index}"),
            &["/bin/sh", "-c", &format!("echo {answer} > answer.txt")],
        );
        stage.outputs = request(&["answer.txt"]);
        sb.send(HostMessage::Run(Box::new(RunSpec {
            stage,
            input: Vec::new(),
            files: Vec::new(),
        })));
    }
    sb.send(HostMessage::RunsEnd);
    let outcome = sb.finish(T);
    assert!(outcome.done, "{outcome:?}");
    let stages = by_stage(&outcome);
    let answers: Vec<_> = stages.iter().map(|s| (s.0.as_str(), s.1.clone())).collect();
    assert_eq!(
        answers,
        [
            (
                "test:0",
                vec![("answer.txt".to_string(), b"one\n".to_vec())]
            ),
            (
                "test:1",
                vec![("answer.txt".to_string(), b"two\n".to_vec())]
            ),
        ]
    );
    assert!(
        !sb.workspace().join("answer.txt").exists(),
        "a run's file outlived it"
    );
}
