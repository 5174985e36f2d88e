use super::*;
use crate::job::limits::LimitPolicy;
use crate::job::prepare;
use crate::job::tests::spec;
use crate::languages::LanguageCatalog;
use serde_json::json;

fn graded(language: &str, file: (&str, &str), extra: Value) -> JobSpec {
    let mut value = serde_json::to_value(spec(language, &[file])).unwrap();
    for (key, item) in extra.as_object().unwrap() {
        value[key] = item.clone();
    }
    serde_json::from_value(value).unwrap()
}

fn prepared(job: &JobSpec) -> Result<PreparedJob, InvalidJob> {
    prepare(
        job,
        &LanguageCatalog::embedded().unwrap(),
        &LimitPolicy::default(),
    )
}

fn refused(extra: Value) -> (String, String) {
    let error = prepared(&graded("python", ("main.py", "print(1)"), extra)).unwrap_err();
    (error.field, error.message)
}

#[test]
fn a_graded_job_compiles_then_runs_each_test_in_a_run_plan() {
    let job = prepared(&graded(
        "c",
        ("main.c", "int main(){}"),
        json!({
            "args": ["-v"],
            "tests": [
                {"stdin": "1 2\n", "expected_stdout": "3\n"},
                {"name": "big", "stdin": "", "args": ["x"], "points": 4, "limits": {"wall_ms": 500}}
            ]
        }),
    ))
    .unwrap();
    let names: Vec<&str> = job.bundle.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["compile"],
        "the run stage is the tests' template, not a stage"
    );
    let plan = job.bundle.runs.as_ref().unwrap();
    assert_eq!(
        plan.scratch,
        ["/workspace", "/tmp", "/dev/shm", "/dev/mqueue"]
    );
    let tests = job.tests.as_ref().unwrap();
    assert_eq!(tests.tests[0].name, "1");
    assert_eq!(tests.tests[0].argv, ["./main", "-v"]);
    assert_eq!(tests.tests[0].input, b"1 2\n");
    assert_eq!(tests.tests[0].expected.as_deref(), Some(&b"3\n"[..]));
    assert_eq!(
        tests.tests[1].argv,
        ["./main", "x"],
        "a test's args replace the job's"
    );
    assert_eq!((tests.tests[1].wall_ms, tests.tests[1].points), (500, 4.0));
    assert_eq!(tests.tests[0].wall_ms, job.limits.wall_ms);
    assert!(matches!(tests.check, PreparedCheck::Builtin(Check::Trim)));
    // Compile + each test's wall limit.
    assert_eq!(
        job.stages_wall_ms(),
        job.compile_limits.unwrap().wall_ms + job.limits.wall_ms + 500
    );
    assert_eq!(
        job.output_limit_bytes(),
        job.compile_limits.unwrap().output_bytes + 2 * TEST_RESULT_BYTES
    );
}

#[test]
fn bad_tests_are_refused_naming_the_field() {
    let many: Vec<Value> = (0..=MAX_TESTS).map(|_| json!({})).collect();
    assert_eq!(refused(json!({"tests": many})).0, "tests");
    assert_eq!(refused(json!({"tests": []})).0, "tests");
    assert_eq!(
        refused(json!({"tests": [{}], "interactive": true})).0,
        "tests"
    );
    assert_eq!(refused(json!({"tests": [{}], "stdin": "x"})).0, "stdin");
    let (field, message) = refused(json!({"tests": [{}, {"limits": {"wall_ms": 999_999}}]}));
    assert_eq!(field, "tests[1].limits.wall_ms");
    assert!(message.contains("may only tighten"), "{message}");
    assert_eq!(
        refused(json!({"tests": [{"limits": {"memory_mb": 64}}]})).0,
        "tests[0].limits.memory_mb"
    );
    assert_eq!(
        refused(json!({"tests": [{"points": -1}]})).0,
        "tests[0].points"
    );
    assert_eq!(refused(json!({"tests": [{"name": ""}]})).0, "tests[0].name");
    assert_eq!(
        refused(json!({"tests": [{"stdin": "!", "stdin_encoding": "base64"}]})).0,
        "tests[0].stdin"
    );
    assert_eq!(refused(json!({"check": "trim"})).0, "check");
    assert_eq!(
        refused(json!({"stop_on_failure": true})).0,
        "stop_on_failure"
    );
}

#[test]
fn checks_are_parsed_and_bad_ones_refused_naming_the_field() {
    let check = |value: Value| {
        prepared(&graded(
            "python",
            ("main.py", ""),
            json!({"tests": [{}], "check": value}),
        ))
        .map(|job| job.tests.unwrap().check)
    };
    assert!(matches!(
        check(json!("exact")),
        Ok(PreparedCheck::Builtin(Check::Exact))
    ));
    assert!(matches!(
        check(json!({"mode": "tokens"})),
        Ok(PreparedCheck::Builtin(Check::Tokens))
    ));
    match check(json!({"mode": "float", "abs": 0.5})) {
        Ok(PreparedCheck::Builtin(Check::Float { abs, rel })) => {
            assert_eq!((abs, rel), (0.5, compare::DEFAULT_REL));
        }
        other => panic!("{other:?}"),
    }
    match check(
        json!({"mode": "program", "language": "python", "files": [{"name": "check.py", "content": "exit(0)"}]}),
    ) {
        Ok(PreparedCheck::Program(checker)) => assert_eq!(checker.language.id, "python"),
        other => panic!("{other:?}"),
    }
    let field = |value: Value| check(value).unwrap_err().field;
    assert_eq!(field(json!("fuzzy")), "check.mode");
    assert_eq!(field(json!({"mode": "fuzzy"})), "check.mode");
    assert_eq!(field(json!({"abs": 1})), "check.mode");
    assert_eq!(field(json!({"mode": "float", "abs": -1})), "check.abs");
    assert_eq!(field(json!({"mode": "trim", "abs": 1})), "check.abs");
    assert_eq!(field(json!(7)), "check");
    assert_eq!(
        field(json!({"mode": "program", "files": []})),
        "check.language"
    );
    assert_eq!(
        field(
            json!({"mode": "program", "language": "cobol", "files": [{"name": "a", "content": ""}]})
        ),
        "check.language"
    );
}
