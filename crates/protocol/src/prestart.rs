//! A warm runtime: the [`Prestart`] the host sends before the bundle, and
//! the rules (one statement each, shared by the supervisor and the host)
//! of which bundle's first stage may run on it.

use serde::{Deserialize, Serialize};

use crate::{BundleFile, StageSpec};

/// A warm runtime (kind `prestart`, only before the bundle): the language's
/// runtime started ahead of the job, waiting for it.
///
/// The supervisor starts `argv` as `uid`/`gid` with `env` in `cwd`, in a
/// session of its own, with pipes for its stdin, stdout and stderr and a
/// descriptor 200, the read end of a control pipe. The runtime is
/// expected to start up and then block reading descriptor 200 (a hook of the
/// runtime's own: see `runner-images/*/warm-runtime*`); it must not run any
/// of the job's code before that read returns.
///
/// The bundle's first stage runs on it when that stage's argv starts with
/// `stage_argv` and its env, cwd and ids are those here; the rest of its
/// argv (the job's args) is then written to descriptor 200, each argument
/// followed by a NUL byte, and the pipe closed. Before that the
/// supervisor sets the runtime's rlimits to the stage's. Otherwise the
/// runtime is killed before the first stage and the stages start as
/// always.
///
/// Some runtimes (php) open their main script before any hook can
/// run, and read it only after: for them `preopened` names that file (in
/// `cwd`). The supervisor creates it empty, as the runtime's ids, before
/// starting the runtime; the runtime fits only a bundle that carries that
/// file, whose content is then written into the same file (the one the
/// runtime holds open); an unused runtime's empty file is removed before
/// the bundle's files are written.
///
/// Others (ruby) read the first byte of their main script before any hook
/// can run, and the rest only after: for them `fed` names that file (in
/// `cwd`). The supervisor makes it a FIFO, as the runtime's ids, holds it
/// open and writes one byte into it, [`FED_LEAD`], before starting the
/// runtime; the runtime reads it (and puts it back), and its hook takes it
/// back out of the script's buffer before it waits. The runtime fits only
/// a bundle that carries that file with content the rule of
/// [`Prestart::feeds`] accepts. The FIFO is then replaced by the job's
/// regular file (the runtime has it open already), and the release also
/// writes that file's content into the FIFO and closes it. An unused
/// runtime's FIFO is removed before the bundle's files are written. The
/// supervisor uses a fed runtime only once it holds the FIFO open (seen in
/// `/proc`): one that opened its script after the job's file replaced the
/// FIFO would read that file instead, and a hookless one would run it
/// before its release.
///
/// A fed runtime may also be `hookless` (R): it opens its script at its
/// start and reads it only once started up, with no hook of its own in
/// between, so it waits for its program by itself, reading the FIFO. It
/// has no descriptor 200 and its FIFO no lead byte; it fits only a job
/// without args (the runtime took its command line at its start) and takes
/// any content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prestart {
    pub uid: u32,
    pub gid: u32,
    /// What is started (may hold the hook, e.g. node's `--require`).
    pub argv: Vec<String>,
    /// The stage's command this runtime stands for (without the job's args).
    pub stage_argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The file (a name in `cwd`) the runtime opens at its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preopened: Option<String>,
    /// The file (a name in `cwd`) the runtime reads its program from
    /// through a FIFO the supervisor feeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fed: Option<String>,
    /// A fed runtime without a hook (see [`Prestart`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hookless: bool,
}

/// The byte a fed runtime's FIFO holds before its job (see [`Prestart`]):
/// one its hook takes out again. Not `#` (the runtime would read on,
/// looking for a `#!` line, before its hook could run); should the hook
/// not take it, the script does not parse, rather than run shifted.
pub const FED_LEAD: u8 = 0xEF;

impl Prestart {
    /// Whether a fed runtime (see [`Prestart`]) runs `content` exactly as a
    /// cold start of the file would. The one statement of the rule. Not
    /// when the content
    /// - starts with `#!`: a cold start reads the line's switches from it
    ///   (and `-x` when it does not name ruby), the fed one read
    ///   [`FED_LEAD`] first;
    /// - has a line that starts with `__END__`: `DATA` would be the FIFO
    ///   (no `rewind`, no `stat` of the file), and the parser stops
    ///   reading there.
    pub fn feeds(content: &[u8]) -> bool {
        !content.starts_with(b"#!")
            && !content
                .split(|&byte| byte == b'\n')
                .any(|line| line.starts_with(b"__END__"))
    }

    /// Whether the bundle's files (written into `workspace`) suit this
    /// runtime: a `preopened` or `fed` file must be among them, in the
    /// runtime's `cwd`, and a fed one's content must be one
    /// [`Prestart::feeds`] accepts (any content, for a `hookless` one).
    pub fn takes_files(&self, workspace: &str, files: &[BundleFile]) -> bool {
        let file = |name: &String| {
            let file = files.iter().find(|file| file.path == *name);
            file.filter(|_| workspace == self.cwd)
        };
        self.preopened
            .as_ref()
            .is_none_or(|name| file(name).is_some())
            && self.fed.as_ref().is_none_or(|name| {
                file(name).is_some_and(|file| self.hookless || Prestart::feeds(&file.content))
            })
    }

    /// The job's args when `stage` is the command this runtime stands for:
    /// its argv starts with `stage_argv`, with the same environment and
    /// working directory, and stdin from the job; a `hookless` runtime's
    /// only without args. The one statement of the rule: the supervisor
    /// decides by it (with the ids), the host predicts and reports by it.
    pub fn args_of<'a>(&self, stage: &'a StageSpec) -> Option<&'a [String]> {
        let fits = stage.stdin
            && stage.cwd == self.cwd
            && stage.env == self.env
            && stage.argv.starts_with(&self.stage_argv)
            && (!self.hookless || stage.argv.len() == self.stage_argv.len());
        fits.then(|| &stage.argv[self.stage_argv.len()..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::tests::limits;

    fn fed_prestart() -> Prestart {
        Prestart {
            uid: 1000,
            gid: 1000,
            argv: vec!["ruby".into(), "main.rb".into()],
            stage_argv: vec!["ruby".into(), "main.rb".into()],
            env: vec![],
            cwd: "/workspace".into(),
            preopened: None,
            fed: Some("main.rb".into()),
            hookless: false,
        }
    }

    /// A run stage of `argv` in /workspace, with stdin and no env.
    fn stage(argv: &[&str]) -> StageSpec {
        StageSpec {
            name: "run".into(),
            argv: argv.iter().map(|arg| arg.to_string()).collect(),
            env: vec![],
            cwd: "/workspace".into(),
            stdin: true,
            watch_input: false,
            limits: limits(),
            outputs: None,
        }
    }

    fn file(path: &str, content: &[u8]) -> BundleFile {
        BundleFile {
            path: path.into(),
            content: content.to_vec(),
            executable: false,
        }
    }

    #[test]
    fn a_fed_runtime_takes_only_content_its_parser_reads_as_a_cold_start_does() {
        for fine in [
            &b""[..],
            b"puts 1\n",
            b"# comment\nputs 1\n",
            b"# encoding: ascii-8bit\n",
            b"x = 1 # __END__\n",
            b" __END__\n",
            b"puts 1\n#!not first\n",
            b"\xEF\xBB\xBFputs 1\n",
        ] {
            assert!(Prestart::feeds(fine), "{:?}", String::from_utf8_lossy(fine));
        }
        for refused in [
            &b"#!/usr/bin/env ruby -w\nputs 1\n"[..],
            b"#!",
            b"puts DATA.read\n__END__\ndata\n",
            b"__END__",
            b"p 1\n__END__x\n",
        ] {
            assert!(
                !Prestart::feeds(refused),
                "{:?}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn a_fed_runtime_takes_its_file_with_fitting_content() {
        let prestart = fed_prestart();
        let ws = "/workspace";
        assert!(prestart.takes_files(ws, &[file("lib.rb", b"x"), file("main.rb", b"p 1")]));
        assert!(!prestart.takes_files(ws, &[file("lib.rb", b"x")]));
        assert!(!prestart.takes_files("/elsewhere", &[file("main.rb", b"p 1")]));
        assert!(!prestart.takes_files(ws, &[file("main.rb", b"#!ruby\np 1")]));
        let with_args = stage(&["ruby", "main.rb", "a"]);
        assert_eq!(prestart.args_of(&with_args), Some(&with_args.argv[2..]));
        assert_eq!(prestart.args_of(&stage(&["ruby", "other.rb"])), None);
        let plain = Prestart {
            fed: None,
            ..prestart
        };
        assert!(plain.takes_files(ws, &[]));
    }

    #[test]
    fn a_hookless_runtime_takes_any_content_and_no_args() {
        let prestart = Prestart {
            argv: vec!["Rscript".into(), "--vanilla".into(), "main.r".into()],
            stage_argv: vec!["Rscript".into(), "--vanilla".into(), "main.r".into()],
            fed: Some("main.r".into()),
            hookless: true,
            ..fed_prestart()
        };
        let ws = "/workspace";
        for content in [&b"#!/usr/bin/Rscript\nprint(1)\n"[..], b"", b"x\n__END__\n"] {
            assert!(prestart.takes_files(ws, &[file("main.r", content)]));
        }
        assert!(!prestart.takes_files(ws, &[file("other.r", b"print(1)")]));
        let bare = stage(&["Rscript", "--vanilla", "main.r"]);
        assert_eq!(prestart.args_of(&bare), Some(&[][..]));
        assert_eq!(
            prestart.args_of(&stage(&["Rscript", "--vanilla", "main.r", "a"])),
            None
        );
        assert_eq!(
            prestart.args_of(&stage(&["Rscript", "--vanilla", "main.r", ""])),
            None
        );
    }
}
