//! The stages a prepared job runs: the catalog's commands with their placeholders filled in.

use std::collections::BTreeMap;

use super::limits::{CompileLimits, Limits};
use super::{JobSpec, WORKSPACE};
use crate::languages::Language;
use crate::protocol::{Bundle, BundleFile, Prestart, StageLimits, StageSpec};

/// The catalog's argv with its placeholders filled in (see
/// `runner-images/languages.toml`): `{entry}`, `{entry_stem}`,
/// `{entry_base}` (the entry's path without its extension),
/// `{entry_class}` (that path as a dotted class name, for the JVM), and
/// `{sources}`, an argument of its own that becomes every submitted file
/// with one of the language's extensions, the entry first.
fn expand(argv: &[String], entry: &str, sources: &[String]) -> Vec<String> {
    let file_name = entry.rsplit('/').next().unwrap_or(entry);
    let stem = file_name
        .rsplit_once('.')
        .map_or(file_name, |(stem, _)| stem);
    let base = &entry[..entry.len() - (file_name.len() - stem.len())];
    let class = base.replace('/', ".");
    let mut expanded = Vec::with_capacity(argv.len() + sources.len());
    for arg in argv {
        if arg == "{sources}" {
            expanded.extend(sources.iter().cloned());
            continue;
        }
        expanded.push(
            arg.replace("{entry}", entry)
                .replace("{entry_stem}", stem)
                .replace("{entry_base}", base)
                .replace("{entry_class}", &class),
        );
    }
    expanded
}

/// The files `{sources}` stands for: the entry, then every other file whose
/// extension is one of the language's, in the order given.
pub(super) fn source_files(language: &Language, entry: &str, files: &[BundleFile]) -> Vec<String> {
    let is_source = |path: &str| {
        std::path::Path::new(path)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| language.extensions.contains(&e.to_lowercase()))
    };
    std::iter::once(entry.to_string())
        .chain(
            files
                .iter()
                .map(|f| f.path.clone())
                .filter(|p| p != entry && is_source(p)),
        )
        .collect()
}

/// The environment of every stage of a job: a fixed base, the language's,
/// then the job's own.
fn stage_env(
    language: &Language,
    job_env: &BTreeMap<String, String>,
    egress: bool,
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = BTreeMap::from([
        (
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
        ("HOME".to_string(), "/tmp".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TMPDIR".to_string(), "/tmp".to_string()),
    ]);
    env.extend(language.env.clone());
    env.extend(job_env.clone());
    if egress {
        // The supervisor's relay to the job's egress proxy; set after the
        // job's own variables, so they always name it.
        let proxy = super::egress_proxy_url();
        for name in super::PROXY_VARIABLES {
            env.insert(name.to_string(), proxy.clone());
        }
    }
    env.into_iter().collect()
}

/// The runtime a warm sandbox of `language` starts ahead of its job, as
/// `uid` (see [`Prestart`]): the language's `warm_runtime` command for its
/// default entry file, standing for its run command, with the environment
/// of a job that sets none. `None` when the language has no warm runtime.
///
/// A job's run stage then runs on it exactly when [`runs_on`] says so.
pub fn warm_runtime(language: &Language, uid: u32) -> Option<Prestart> {
    let argv = language.warm_runtime.as_ref()?;
    let entry = language.source_file.as_str();
    let sources = [entry.to_string()];
    Some(Prestart {
        uid,
        gid: uid,
        argv: expand(argv, entry, &sources),
        stage_argv: expand(&language.run, entry, &sources),
        env: stage_env(language, &BTreeMap::new(), false),
        cwd: WORKSPACE.into(),
        preopened: language.warm_runtime_opens_entry.then(|| entry.to_string()),
        fed: language.warm_runtime_feeds_entry.then(|| entry.to_string()),
        hookless: language.warm_runtime_hookless,
    })
}

/// Whether the supervisor runs `bundle`'s first stage on the runtime
/// `prestart` started: not a graded bundle's (each run needs a fresh
/// process), and otherwise by [`Prestart::args_of`] and
/// [`Prestart::takes_files`], the rule the supervisor applies too.
pub fn runs_on(prestart: &Prestart, bundle: &Bundle) -> bool {
    bundle.runs.is_none()
        && prestart.takes_files(&bundle.workspace, &bundle.files)
        && bundle
            .stages
            .first()
            .is_some_and(|stage| prestart.args_of(stage).is_some())
}

/// The run command `run` (expanded from the catalog's `template`) with
/// the job's `interpreter_args` before the first argument that names the
/// entry (`{entry…}`), or right after the program when none does (a
/// compiled program's first arguments).
fn with_interpreter_args(run: Vec<String>, template: &[String], args: &[String]) -> Vec<String> {
    if args.is_empty() {
        return run;
    }
    let at = template
        .iter()
        .position(|arg| arg.contains("{entry"))
        .unwrap_or(1)
        .min(run.len());
    let mut argv = run;
    argv.splice(at..at, args.iter().cloned());
    argv
}

pub(super) fn build_stages(
    spec: &JobSpec,
    language: &Language,
    entry: &str,
    sources: &[String],
    limits: &Limits,
    compile_limits: Option<&CompileLimits>,
) -> Vec<StageSpec> {
    let env = stage_env(language, &spec.env, spec.network_allow().is_some());
    let fsize_bytes = limits.disk_mb * 1024 * 1024;
    let nofile = 256;

    let mut stages = Vec::new();
    if let (Some(compile), Some(compile_limits)) = (&language.compile, compile_limits) {
        let mut argv = expand(compile, entry, sources);
        argv.extend(spec.compile_args.iter().cloned());
        stages.push(StageSpec {
            name: "compile".into(),
            argv,
            env: env.clone(),
            cwd: WORKSPACE.into(),
            stdin: false,
            watch_input: false,
            limits: StageLimits {
                wall_ms: compile_limits.wall_ms,
                idle_ms: None,
                cpu_ms: compile_limits.cpu_ms,
                output_bytes: compile_limits.output_bytes,
                fsize_bytes,
                nofile,
                nproc: None,
                cpu_quota_millis: None,
                address_space_bytes: None,
            },
            outputs: None,
        });
    }
    let mut run = with_interpreter_args(
        expand(&language.run, entry, sources),
        &language.run,
        &spec.interpreter_args,
    );
    run.extend(spec.args.iter().cloned());
    stages.push(StageSpec {
        name: "run".into(),
        argv: run,
        env,
        cwd: WORKSPACE.into(),
        stdin: true,
        // An interactive job's stream says when it waits for input.
        watch_input: spec.interactive,
        limits: StageLimits {
            wall_ms: limits.wall_ms,
            idle_ms: spec.interactive.then_some(limits.idle_ms),
            cpu_ms: limits.cpu_ms,
            output_bytes: limits.output_bytes,
            fsize_bytes,
            nofile,
            nproc: None,
            cpu_quota_millis: None,
            address_space_bytes: spec.virtual_memory_mb.map(|mb| mb << 20),
        },
        outputs: None,
    });
    stages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::limits::LimitPolicy;
    use crate::job::prepare;
    use crate::job::tests::spec;
    use crate::languages::LanguageCatalog;

    #[test]
    fn a_c_job_has_compile_then_run() {
        let job = prepare(
            &spec("c", &[("main.c", "int main(){}")]),
            &LanguageCatalog::embedded().unwrap(),
            &LimitPolicy::default(),
        )
        .unwrap();
        let names: Vec<&str> = job.bundle.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["compile", "run"]);
        assert!(job.bundle.stages[0].argv.contains(&"main.c".to_string()));
        assert!(!job.bundle.stages[0].stdin);
        assert_eq!(job.bundle.stages[1].argv, ["./main"]);
    }

    #[test]
    fn compile_args_end_the_compile_command_and_interpreter_args_precede_the_entry() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let policy = LimitPolicy::default();
        let mut c = spec("c", &[("main.c", "int main(){}")]);
        c.compile_args = vec!["-std=c89".into(), "-lcrypt".into()];
        c.interpreter_args = vec!["-v".into()];
        c.args = vec!["x".into()];
        let job = prepare(&c, &catalog, &policy).unwrap();
        assert!(job.bundle.stages[0].argv.ends_with(&[
            "-lm".to_string(),
            "-lpthread".to_string(),
            "-std=c89".to_string(),
            "-lcrypt".to_string()
        ]));
        assert_eq!(job.bundle.stages[1].argv, ["./main", "-v", "x"]);

        let mut python = spec("python", &[("test.py", "")]);
        python.interpreter_args = vec!["-c".into(), "print(1)".into()];
        python.args = vec!["a".into()];
        let job = prepare(&python, &catalog, &policy).unwrap();
        assert_eq!(
            job.bundle.stages[0].argv,
            ["python3", "-u", "-c", "print(1)", "test.py", "a"]
        );

        python.compile_args = vec!["-O".into()];
        let refused = prepare(&python, &catalog, &policy).unwrap_err();
        assert_eq!(refused.field, "compile_args");
        assert_eq!(refused.message, "python has no compile stage");
        python.compile_args.clear();
        python.interpreter_args = vec!["a\0b".into()];
        let refused = prepare(&python, &catalog, &policy).unwrap_err();
        assert_eq!(refused.field, "interpreter_args[0]");
    }

    #[test]
    fn placeholders_name_the_entry_and_every_source() {
        let sources = vec![
            "com/acme/Main.java".to_string(),
            "com/acme/Util.java".to_string(),
        ];
        let argv: Vec<String> = [
            "javac",
            "{sources}",
            "-d",
            ".",
            "{entry_class}",
            "{entry_base}.js",
            "{entry_stem}",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            expand(&argv, "com/acme/Main.java", &sources),
            [
                "javac",
                "com/acme/Main.java",
                "com/acme/Util.java",
                "-d",
                ".",
                "com.acme.Main",
                "com/acme/Main.js",
                "Main"
            ]
        );
        assert_eq!(expand(&argv[4..5], "Main", &[]), ["Main"]);
    }

    #[test]
    fn sources_are_the_entry_then_the_other_files_of_the_language() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let job = prepare(
            &spec(
                "c",
                &[
                    ("util.c", ""),
                    ("include/util.h", ""),
                    ("main.c", ""),
                    ("notes.txt", ""),
                ],
            ),
            &catalog,
            &LimitPolicy::default(),
        )
        .unwrap();
        let compile = &job.bundle.stages[0].argv;
        let main = compile.iter().position(|a| a == "main.c").unwrap();
        assert_eq!(compile[main + 1], "util.c");
        assert!(!compile.contains(&"include/util.h".to_string()));
        assert!(!compile.contains(&"notes.txt".to_string()));
    }
}
