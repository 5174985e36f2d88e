//! Jobe's `run_spec` as a job, checked in the order Jobe's
//! `RunSpecifier` checks it, each refusal in Jobe's words.

use serde_json::{Map, Value};

use crate::job::limits::{LimitPolicy, LimitsRequest};
use crate::job::{FileSpec, JobSpec};
use crate::languages::{Language, LanguageCatalog};

/// Jobe's language ids and ours.
pub(super) const JOBE_LANGUAGES: &[(&str, &str)] = &[
    ("c", "c"),
    ("cpp", "cpp"),
    ("python3", "python"),
    ("java", "java"),
    ("nodejs", "javascript"),
    ("php", "php"),
    ("pascal", "pascal"),
    ("octave", "octave"),
];

/// The source code Jobe answers "overload" (21) to without running it: its
/// own test of that answer (`LanguageTask::prepareExecutionEnvironment`).
pub(super) const OVERLOAD_TEST: &str = "!** TESTING OVERLOAD EXCEPTION **!";

/// Jobe's shortest file id (`MIN_FILE_IDENTIFIER_SIZE`).
const MIN_FILE_ID: usize = 8;

/// Jobe's defaults where a request sets no parameter.
/// (Jobe's `streamsize` and `disklimit` defaults, 2 and 20 MB, are not
/// copied: unset, the server's own defaults apply, so that a Jobe run
/// holds no more of its key's storage budget than any other job.)
const DEFAULT_CPUTIME_SECS: f64 = 5.0;

/// A checked run: the job, and the files it names by Jobe id (`[id,
/// name]`), still to be found in the store.
#[derive(Debug)]
pub(super) struct JobeRun {
    /// Jobe's language id, in lower case.
    pub jobe_id: String,
    pub spec: JobSpec,
    pub file_list: Vec<(String, String)>,
    /// Jobe's own overload test: answered 21, not run.
    pub overload_test: bool,
}

/// Our language for a Jobe language id (lower case), if it is on offer.
pub(super) fn our_language<'a>(
    jobe_id: &str,
    catalog: &'a LanguageCatalog,
) -> Option<&'a Language> {
    JOBE_LANGUAGES
        .iter()
        .find(|(jobe, _)| *jobe == jobe_id)
        .and_then(|(_, ours)| catalog.find(ours))
}

/// The body of `POST runs` as a job; the error is Jobe's message for a 400.
pub(super) fn jobe_run(
    body: &Value,
    catalog: &LanguageCatalog,
    policy: &LimitPolicy,
    max_cputime_secs: u64,
) -> Result<JobeRun, String> {
    let body = body.as_object().ok_or("Non-JSON post data received")?;
    let run = body
        .get("run_spec")
        .and_then(Value::as_object)
        .ok_or("No run_spec attribute found in post data")?;
    let required = |attr: &str| match run.get(attr) {
        None | Some(Value::Null) => Err(format!(
            "run_spec is missing the required attribute '{attr}'"
        )),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(format!("run_spec attribute '{attr}' must be a string")),
    };
    // In Jobe's order: the source first.
    let sourcecode = required("sourcecode")?;
    let jobe_id = required("language_id")?.to_lowercase();
    let language = our_language(&jobe_id, catalog)
        .ok_or_else(|| format!("Language '{jobe_id}' is not known"))?;
    let input = match run.get("input") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(_) => return Err("run_spec attribute 'input' must be a string".into()),
    };
    let empty = Map::new();
    let parameters = match run.get("parameters") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(parameters)) => parameters,
        // PHP's empty array: how a client without parameters may send them.
        Some(Value::Array(items)) if items.is_empty() => &empty,
        Some(_) => return Err("run_spec attribute 'parameters' must be an object".into()),
    };
    let max_cpu_secs = max_cputime_secs.min(policy.maximum.cpu_ms / 1000);
    let cputime = number(parameters, "cputime").unwrap_or(DEFAULT_CPUTIME_SECS);
    if cputime.trunc() > max_cpu_secs as f64 {
        return Err(format!(
            "cputime exceeds maximum allowed on this Jobe server ({max_cpu_secs} secs)"
        ));
    }
    let sourcefilename = match run.get("sourcefilename") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if is_valid_source_filename(name) => {
            // Jobe ignores the name old CodeRunners give every Java program.
            (name != "prog.java").then(|| name.clone())
        }
        Some(_) => return Err("The sourcefilename for the run_spec is illegal".into()),
    };
    let file_list = match run.get("file_list") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(files)) => files.iter().map(file_specifier).collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("Invalid file specifier: {}", print_r(other))),
    };

    let entry = entry_name(&jobe_id, sourcefilename, &sourcecode, language);
    let mut files = vec![FileSpec {
        name: entry.clone(),
        content: sourcecode.clone(),
        ..Default::default()
    }];
    files.extend(file_list.iter().map(|(_, name)| FileSpec {
        name: name.clone(),
        ..Default::default()
    }));
    let mut metadata = Map::new();
    metadata.insert("via".into(), "jobe".into());
    let main_class = match parameters.get("main_class") {
        Some(Value::String(class)) if jobe_id == "java" && !class.is_empty() => {
            Some(format!("{}.java", class.replace('.', "/")))
        }
        _ => None,
    };
    let spec = JobSpec {
        language: language.id.clone(),
        files,
        entry: Some(main_class.unwrap_or(entry)),
        stdin: input,
        args: words(parameters, "runargs")?,
        compile_args: compile_args(&jobe_id, parameters)?,
        interpreter_args: words(parameters, "interpreterargs")?,
        limits: limits(&jobe_id, parameters, cputime, policy),
        virtual_memory_mb: virtual_memory(&jobe_id, parameters),
        metadata,
        ..Default::default()
    };
    Ok(JobeRun {
        jobe_id,
        spec,
        file_list,
        overload_test: sourcecode == OVERLOAD_TEST,
    })
}

/// A numeric parameter, as Jobe's `getParam` takes it: a number or a
/// numeric string; anything else is as if unset.
fn number(parameters: &Map<String, Value>, name: &str) -> Option<f64> {
    match parameters.get(name)? {
        Value::Number(n) => n.as_f64(),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// A list parameter of shell words (`compileargs`, `linkargs`,
/// `interpreterargs`, `runargs`): Jobe joins them into a shell command, so
/// each is split as sh would.
fn words(parameters: &Map<String, Value>, name: &str) -> Result<Vec<String>, String> {
    let items = match parameters.get(name) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(format!("parameter '{name}' must be a list of strings")),
    };
    let mut words = Vec::new();
    for item in items {
        let text = match item {
            Value::String(text) => text.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err(format!("parameter '{name}' must be a list of strings")),
        };
        words.extend(
            shlex::split(&text)
                .ok_or_else(|| format!("parameter '{name}' has unbalanced quotes: {text}"))?,
        );
    }
    Ok(words)
}

/// `compileargs` (Jobe's defaults when unset: warnings are errors, C99 for
/// C) then `linkargs`. C and C++ are compiled without optimisation first,
/// as Jobe compiles them (our `-O2` finds more to warn about, and Jobe's
/// `-Werror` would make that an error), unless `compileargs` asks.
fn compile_args(jobe_id: &str, parameters: &Map<String, Value>) -> Result<Vec<String>, String> {
    let mut args = match jobe_id {
        "c" | "cpp" => vec!["-O0".to_string()],
        _ => Vec::new(),
    };
    args.extend(if parameters.contains_key("compileargs") {
        words(parameters, "compileargs")?
    } else {
        let defaults: &[&str] = match jobe_id {
            "c" => &["-Wall", "-Werror", "-std=c99"],
            "cpp" => &["-Wall", "-Werror"],
            _ => &[],
        };
        defaults.iter().map(|s| s.to_string()).collect()
    });
    args.extend(words(parameters, "linkargs")?);
    Ok(args)
}

/// The job's limits from Jobe's parameters: `cputime` seconds of CPU and
/// twice that of wall time (Jobe's kill time), `memorylimit` (MB; 0 or
/// unset: the language's own), `numprocs` (Java at least 256, as Jobe),
/// `streamsize` (MB of output) and `disklimit` (MB; -1: the maximum), each
/// kept within the server's maximum — except `cputime`, refused above it
/// before this. Unset, each but `cputime` is the server's default.
fn limits(
    jobe_id: &str,
    parameters: &Map<String, Value>,
    cputime: f64,
    policy: &LimitPolicy,
) -> LimitsRequest {
    let max = policy.maximum;
    let within = |value: f64, max: u64| Some((value.max(1.0) as u64).min(max));
    let cputime = if cputime > 0.0 {
        cputime
    } else {
        DEFAULT_CPUTIME_SECS
    };
    let cpu_ms = (cputime * 1000.0) as u64;
    let memory = number(parameters, "memorylimit").filter(|mb| *mb > 0.0 && jobe_id != "java");
    let numprocs =
        number(parameters, "numprocs").map(|n| if jobe_id == "java" { n.max(256.0) } else { n });
    LimitsRequest {
        cpu_ms: within(cpu_ms as f64, max.cpu_ms),
        wall_ms: within((cpu_ms * 2) as f64, max.wall_ms),
        memory_mb: memory.and_then(|mb| within(mb, max.memory_mb)),
        pids: numprocs.and_then(|n| within(n, max.pids)),
        output_bytes: number(parameters, "streamsize")
            .and_then(|mb| within(mb * 1024.0 * 1024.0, max.output_bytes)),
        disk_mb: number(parameters, "disklimit").and_then(|mb| {
            if mb < 0.0 {
                Some(max.disk_mb)
            } else {
                within(mb, max.disk_mb)
            }
        }),
        ..Default::default()
    }
}

/// Jobe's memory limit is on each process's address space: `memorylimit`
/// MB (Jobe's default 400 for C, C++ and Pascal, whose `malloc` then fails
/// as under Jobe); for the interpreted languages only when asked (their
/// runtimes' reservations differ from Jobe's machines'); never for Java
/// (Jobe lets the JVM manage its memory).
fn virtual_memory(jobe_id: &str, parameters: &Map<String, Value>) -> Option<u64> {
    const DEFAULT_MEMORYLIMIT_MB: f64 = 400.0;
    let asked = number(parameters, "memorylimit");
    let mb = match jobe_id {
        "java" => return None,
        "c" | "cpp" | "pascal" => asked.unwrap_or(DEFAULT_MEMORYLIMIT_MB),
        _ => asked?,
    };
    (mb > 0.0).then(|| {
        (mb as u64).clamp(
            *crate::job::VIRTUAL_MEMORY_MB.start(),
            *crate::job::VIRTUAL_MEMORY_MB.end(),
        )
    })
}

/// The name the source is saved as: the request's, or Jobe's default
/// (`prog.<ext>`; for Java the class with `main`). A C, C++ or Pascal
/// source whose name has not the language's extension gets it added
/// (CodeRunner names its tester `__tester__.c`, but a name like
/// `__tester__.python3` Jobe's compilers take only with `-x`).
fn entry_name(
    jobe_id: &str,
    sourcefilename: Option<String>,
    sourcecode: &str,
    language: &Language,
) -> String {
    let extension = match jobe_id {
        "c" => "c",
        "cpp" => "cpp",
        "pascal" => "pas",
        "python3" => "py",
        "nodejs" => "js",
        "php" => "php",
        "java" => "java",
        _ => "txt",
    };
    let Some(name) = sourcefilename else {
        return match jobe_id {
            "java" => format!(
                "{}.java",
                java_main_class(sourcecode).unwrap_or_else(|| "prog".into())
            ),
            _ => format!("prog.{extension}"),
        };
    };
    let compiled = matches!(jobe_id, "c" | "cpp" | "pascal");
    let known = std::path::Path::new(&name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| language.extensions.contains(&e.to_lowercase()));
    if compiled && !known {
        format!("{name}.{extension}")
    } else {
        name
    }
}

/// The public class with a `main` method, found as Jobe finds it: the one
/// match of `public class Name … static void main(String`, or none.
fn java_main_class(source: &str) -> Option<String> {
    let mut found = None;
    let mut rest = source;
    while let Some(at) = rest.find("public") {
        let before_ok = at == 0 || !is_word(rest[..at].chars().next_back().unwrap_or(' '));
        let after = &rest[at + "public".len()..];
        rest = after;
        if !before_ok {
            continue;
        }
        let Some(after) = after.strip_prefix(char::is_whitespace).map(str::trim_start) else {
            continue;
        };
        let Some(after) = after
            .strip_prefix("class")
            .and_then(|a| a.strip_prefix(char::is_whitespace))
        else {
            continue;
        };
        let after = after.trim_start();
        let name: String = after.chars().take_while(|c| is_word(*c)).collect();
        if name.is_empty() {
            continue;
        }
        let body = &after[name.len()..];
        let Some(open) = body.find('{') else { continue };
        let has_main = body[open..].split("void").skip(1).any(|tail| {
            tail.trim_start()
                .strip_prefix("main")
                .map(str::trim_start)
                .and_then(|t| t.strip_prefix('('))
                .is_some_and(|t| t.trim_start().starts_with("String"))
        });
        if has_main {
            if found.is_some() {
                return None;
            }
            found = Some(name);
        }
    }
    found
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Jobe's test of a source file name: nothing a file system, a URI or a
/// shell treats specially, no control characters, and not starting with
/// `.` or `-`.
fn is_valid_source_filename(name: &str) -> bool {
    const RESERVED: &str = "<>:\"/\\|?*#[]@!$&'()+,;={}^~`";
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && !name.chars().any(|c| {
            RESERVED.contains(c) || (c as u32) < 0x20 || matches!(c as u32, 0x7f | 0xa0 | 0xad)
        })
}

/// One `file_list` entry: `[id, name]` (a third element is allowed, as
/// Jobe allows it), the id at least 8 letters and digits, the name letters,
/// digits, `-`, `_` and `.`.
fn file_specifier(file: &Value) -> Result<(String, String), String> {
    let invalid = || format!("Invalid file specifier: {}", print_r(file));
    let items = file.as_array().ok_or_else(invalid)?;
    if !(2..=3).contains(&items.len()) {
        return Err(invalid());
    }
    let (Some(id), Some(name)) = (items[0].as_str(), items[1].as_str()) else {
        return Err(invalid());
    };
    let id_ok = id.len() >= MIN_FILE_ID && id.chars().all(|c| c.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.chars().any(|c| c.is_ascii_alphanumeric());
    if !id_ok || !name_ok {
        return Err(invalid());
    }
    Ok((id.to_string(), name.to_string()))
}

/// A value as PHP's `print_r` shows it, as Jobe's message quotes it.
fn print_r(value: &Value) -> String {
    fn show(value: &Value, indent: usize) -> String {
        match value {
            Value::Array(items) => {
                let pad = " ".repeat(indent);
                let mut out = format!("Array\n{pad}(\n");
                for (i, item) in items.iter().enumerate() {
                    out.push_str(&format!("{pad}    [{i}] => {}\n", show(item, indent + 8)));
                }
                out.push_str(&format!("{pad})\n"));
                out
            }
            Value::Object(map) => {
                let pad = " ".repeat(indent);
                let mut out = format!("stdClass Object\n{pad}(\n");
                for (key, item) in map {
                    out.push_str(&format!("{pad}    [{key}] => {}\n", show(item, indent + 8)));
                }
                out.push_str(&format!("{pad})\n"));
                out
            }
            Value::String(text) => text.clone(),
            Value::Bool(true) => "1".into(),
            Value::Bool(false) | Value::Null => String::new(),
            Value::Number(n) => n.to_string(),
        }
    }
    show(value, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> LanguageCatalog {
        LanguageCatalog::embedded().unwrap()
    }

    fn run(spec: Value) -> Result<JobeRun, String> {
        jobe_run(
            &json!({ "run_spec": spec }),
            &catalog(),
            &LimitPolicy::default(),
            120,
        )
    }

    #[test]
    fn refusals_come_in_jobes_order_and_words() {
        let refused = |body: Value| {
            jobe_run(&body, &catalog(), &LimitPolicy::default(), 120)
                .map(|_| ())
                .unwrap_err()
        };
        assert_eq!(refused(json!("x")), "Non-JSON post data received");
        assert_eq!(
            refused(json!({"run": {}})),
            "No run_spec attribute found in post data"
        );
        assert_eq!(
            run(json!({"language_id": "c"})).unwrap_err(),
            "run_spec is missing the required attribute 'sourcecode'"
        );
        assert_eq!(
            run(json!({"sourcecode": ""})).unwrap_err(),
            "run_spec is missing the required attribute 'language_id'"
        );
        assert_eq!(
            run(json!({"sourcecode": "", "language_id": "Cobol"})).unwrap_err(),
            "Language 'cobol' is not known"
        );
        assert_eq!(
            run(json!({"sourcecode": "", "language_id": "c", "parameters": {"cputime": 121}}))
                .unwrap_err(),
            "cputime exceeds maximum allowed on this Jobe server (120 secs)"
        );
        for name in ["../x.c", ".hidden", "a b?c", "tab\there", "a/b"] {
            assert_eq!(
                run(json!({"sourcecode": "", "language_id": "c", "sourcefilename": name}))
                    .unwrap_err(),
                "The sourcefilename for the run_spec is illegal",
                "{name}"
            );
        }
        assert_eq!(
            run(json!({"sourcecode": "", "language_id": "c", "file_list": [["short", "f"]]}))
                .unwrap_err(),
            "Invalid file specifier: Array\n(\n    [0] => short\n    [1] => f\n)\n"
        );
        assert!(
            run(json!({"sourcecode": "", "language_id": "c",
                "file_list": [["abcdefgh12", "bad/name"]]}))
            .unwrap_err()
            .starts_with("Invalid file specifier: ")
        );
        assert_eq!(
            run(json!({"sourcecode": "", "language_id": "python3",
                "parameters": {"runargs": ["'open"]}}))
            .unwrap_err(),
            "parameter 'runargs' has unbalanced quotes: 'open"
        );
    }

    #[test]
    fn a_run_spec_becomes_a_job_with_jobes_defaults() {
        let job = run(json!({
            "language_id": "python3",
            "sourcecode": "print(1)",
            "sourcefilename": "__tester__.python3",
            "input": "x\n",
            "file_list": [["abcdef0123", "data.txt"]],
            "parameters": {"cputime": "15", "interpreterargs": ["-c \"print(\\\"Blah\\\")\""],
                "runargs": ["Arg1", "Arg2"], "numprocs": 20, "memorylimit": 300}
        }))
        .unwrap();
        let spec = &job.spec;
        assert_eq!(spec.language, "python");
        assert_eq!(spec.entry.as_deref(), Some("__tester__.python3"));
        assert_eq!(spec.files[0].content, "print(1)");
        assert_eq!(spec.files[1].name, "data.txt");
        assert_eq!(
            job.file_list,
            [("abcdef0123".to_string(), "data.txt".to_string())]
        );
        assert_eq!(spec.stdin, "x\n");
        assert_eq!(spec.interpreter_args, ["-c", "print(\"Blah\")"]);
        assert_eq!(spec.args, ["Arg1", "Arg2"]);
        assert!(spec.compile_args.is_empty());
        assert_eq!(spec.limits.cpu_ms, Some(15_000));
        assert_eq!(spec.limits.wall_ms, Some(30_000));
        assert_eq!(spec.limits.pids, Some(20));
        assert_eq!(spec.limits.memory_mb, Some(300));
        assert_eq!(spec.virtual_memory_mb, Some(300));
        assert_eq!(spec.limits.output_bytes, None);
        assert_eq!(spec.limits.disk_mb, None);
        assert!(!job.overload_test);

        let c = run(json!({"language_id": "C", "sourcecode": "int main(){}",
            "parameters": {"linkargs": ["-lm"], "streamsize": 4, "disklimit": -1}}))
        .unwrap();
        assert_eq!(c.spec.limits.output_bytes, Some(4 << 20));
        assert_eq!(
            c.spec.limits.disk_mb,
            Some(LimitPolicy::default().maximum.disk_mb)
        );
        assert_eq!(c.spec.entry.as_deref(), Some("prog.c"));
        assert_eq!(
            c.spec.compile_args,
            ["-O0", "-Wall", "-Werror", "-std=c99", "-lm"]
        );
        assert_eq!(c.spec.virtual_memory_mb, Some(400));
        assert_eq!(c.spec.limits.cpu_ms, Some(5_000));
        assert_eq!(c.spec.limits.memory_mb, None);
        let c = run(
            json!({"language_id": "c", "sourcecode": "", "sourcefilename": "__tester__",
            "parameters": {"compileargs": ["std=c89"]}}),
        )
        .unwrap();
        assert_eq!(c.spec.entry.as_deref(), Some("__tester__.c"));
        assert_eq!(c.spec.compile_args, ["-O0", "std=c89"]);

        let overload = run(json!({"language_id": "python3", "sourcecode": OVERLOAD_TEST}));
        assert!(overload.unwrap().overload_test);
    }

    #[test]
    fn java_is_named_by_its_main_class_and_takes_a_main_class_parameter() {
        let source = "import java.util.*;\npublic class Hello {\n  public static void main(String[] args) {}\n}\n";
        let java = run(json!({"language_id": "java", "sourcecode": source,
            "sourcefilename": "prog.java", "parameters": {"numprocs": 20}}))
        .unwrap();
        assert_eq!(java.spec.entry.as_deref(), Some("Hello.java"));
        assert_eq!(java.spec.files[0].name, "Hello.java");
        assert_eq!(java.spec.limits.pids, Some(256));
        assert_eq!(java.spec.virtual_memory_mb, None);
        assert_eq!(java_main_class("public class Thing { void f() {} }"), None);
        assert_eq!(
            java_main_class("class A {}\npublic class B{static public void main (String[] a){}}"),
            Some("B".into())
        );
        let chosen = run(json!({"language_id": "java", "sourcecode": source,
            "parameters": {"main_class": "pkg.Main"}}))
        .unwrap();
        assert_eq!(chosen.spec.entry.as_deref(), Some("pkg/Main.java"));
    }
}
