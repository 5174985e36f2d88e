//! Hostile programs on php's, ruby's and R's warm runtimes: memory, pids,
//! CPU, wall, output and disk limits hold on a released runtime as on any
//! stage.

use crate::common;

use code_runner::job::limits::LimitsRequest;
use code_runner::job::{StartKind, Status};
use code_runner::protocol::Reason;
use common::*;

use super::on_runtime_pool;

/// A hostile program on php's, ruby's or R's warm runtime, and how it must end.
struct Hostile {
    language: &'static str,
    entry: &'static str,
    source: &'static str,
    limits: LimitsRequest,
    status: Status,
    reason: Reason,
    /// What stdout must start with.
    stdout: &'static str,
}

impl Hostile {
    /// Allocates past `memory_mb`: ends `memory_limit`.
    fn memory(
        language: &'static str,
        entry: &'static str,
        source: &'static str,
        memory_mb: u64,
    ) -> Self {
        Self::failing(
            language,
            entry,
            source,
            LimitsRequest {
                memory_mb: Some(memory_mb),
                ..Default::default()
            },
            Reason::MemoryLimit,
        )
    }

    /// Spins past 1 s of CPU, well within its wall limit: `cpu_timeout`.
    fn cpu(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            status: Status::TimedOut,
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    cpu_ms: Some(1000),
                    wall_ms: Some(20_000),
                    ..Default::default()
                },
                Reason::CpuTimeout,
            )
        }
    }

    /// Sleeps past 1 s of wall time: `wall_timeout`.
    fn wall(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            status: Status::TimedOut,
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    wall_ms: Some(1000),
                    ..Default::default()
                },
                Reason::WallTimeout,
            )
        }
    }

    /// Prints `%08d\n` lines for ever past 100 000 bytes: `output_limit`,
    /// the first bytes kept.
    fn output(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self {
            stdout: "00000000\n00000001\n",
            ..Self::failing(
                language,
                entry,
                source,
                LimitsRequest {
                    output_bytes: Some(100_000),
                    ..Default::default()
                },
                Reason::OutputLimit,
            )
        }
    }

    /// Writes 64 MB into an 8 MB disk: the program fails (exits non-zero).
    fn disk(language: &'static str, entry: &'static str, source: &'static str) -> Self {
        Self::failing(
            language,
            entry,
            source,
            LimitsRequest {
                disk_mb: Some(8),
                ..Default::default()
            },
            Reason::Exited,
        )
    }

    fn failing(
        language: &'static str,
        entry: &'static str,
        source: &'static str,
        limits: LimitsRequest,
        reason: Reason,
    ) -> Self {
        Self {
            language,
            entry,
            source,
            limits,
            status: Status::Failed,
            reason,
            stdout: "",
        }
    }
}

/// The limits the supervisor sets on a released runtime (rlimits by
/// `prlimit`, its watch of wall, CPU and output) and the container's
/// (memory, pids) hold on php's warm runtime (the one that holds its entry
/// file open), ruby's (the one fed its script) and R's (fed, hookless) as
/// on any stage;
/// python's run every hostile test of `limits` and `escape` (their
/// `warm_runtime::` halves).
#[tokio::test]
async fn hostile_php_ruby_and_r_programs_on_a_warm_runtime_hit_their_limits() {
    let harness = Harness::new().await.on(StartKind::WarmRuntime);
    let cases = [
        Hostile::memory(
            "php",
            "main.php",
            "<?php ini_set('memory_limit', '-1'); $c = []; for (;;) { $c[] = str_repeat('x', 8 << 20); }\n",
            64,
        ),
        Hostile {
            language: "php",
            entry: "main.php",
            source: "<?php echo \"forking\\n\"; $said = false;\nfor (;;) { $p = pcntl_fork(); if ($p === 0) { sleep(30); exit(0); } if ($p < 0 && !$said) { echo \"fork refused\\n\"; $said = true; } }\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(2000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "forking\nfork refused\n",
        },
        Hostile::cpu("php", "main.php", "<?php for (;;) {}\n"),
        Hostile::wall("php", "main.php", "<?php sleep(3600);\n"),
        Hostile::output(
            "php",
            "main.php",
            "<?php for ($i = 0; ; $i++) { printf(\"%08d\\n\", $i); }\n",
        ),
        Hostile::memory(
            "ruby",
            "main.rb",
            "chunks = []\nloop { chunks << 'x' * (8 << 20) }\n",
            64,
        ),
        Hostile {
            language: "ruby",
            entry: "main.rb",
            // Ruby's fork waits and tries again when the kernel refuses
            // (EAGAIN) rather than raise: count what it got in 1.5 s.
            source: "n = 0\nThread.new { sleep 1.5; puts(n < 16 ? 'capped' : \"not capped: #{n}\"); $stdout.flush }\n\
                     loop { fork { sleep 30 }; n += 1 }\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(2000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "capped\n",
        },
        Hostile::cpu("ruby", "main.rb", "loop {}\n"),
        Hostile::wall("ruby", "main.rb", "sleep 3600\n"),
        Hostile::output(
            "ruby",
            "main.rb",
            "i = 0\nloop { printf(\"%08d\\n\", i); i += 1 }\n",
        ),
        Hostile::disk(
            "ruby",
            "main.rb",
            "File.write('/tmp/big', 'x' * (64 << 20))\n",
        ),
        Hostile::memory(
            "r",
            "main.r",
            "x <- list()\nrepeat x[[length(x) + 1]] <- numeric(1e6)\n",
            128,
        ),
        Hostile {
            language: "r",
            entry: "main.r",
            source: "n <- 0\nfor (i in 1:40) {\n  rc <- suppressWarnings(system('sleep 30 &', ignore.stdout = TRUE, ignore.stderr = TRUE))\n  if (rc == 0) n <- n + 1\n}\n\
                     cat(if (n < 16) 'capped' else paste('not capped:', n), '\\n', sep = '')\nSys.sleep(30)\n",
            limits: LimitsRequest {
                pids: Some(16),
                wall_ms: Some(3000),
                ..Default::default()
            },
            status: Status::TimedOut,
            reason: Reason::WallTimeout,
            stdout: "capped\n",
        },
        Hostile::cpu("r", "main.r", "repeat {}\n"),
        Hostile::wall("r", "main.r", "Sys.sleep(3600)\n"),
        Hostile::output(
            "r",
            "main.r",
            "i <- 0\nrepeat { cat(sprintf('%08d\\n', i)); i <- i + 1 }\n",
        ),
        Hostile::disk("r", "main.r", "writeBin(raw(64 * 2^20), '/tmp/big')\n"),
    ];
    for case in &cases {
        let spec = job_with_limits(case.language, case.entry, case.source, case.limits);
        let result = on_runtime_pool(&harness, &spec).await;
        assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
        assert_eq!(result.status, case.status, "{}: {result:#?}", case.source);
        let run = result.run.as_ref().unwrap();
        assert_eq!(run.reason, case.reason, "{}: {result:#?}", case.source);
        assert!(stdout(&result).starts_with(case.stdout), "{result:#?}");
        // The cases with a pids limit are the ones that fork past it.
        assert_eq!(
            run.pids_limit_reached,
            Some(case.limits.pids.is_some()),
            "{}: {result:#?}",
            case.source
        );
        if case.reason == Reason::OutputLimit {
            // Cut at the limit, keeping exactly the first bytes.
            assert!(run.truncated);
            let expected: String = (0..20_000).map(|i| format!("{i:08}\n")).collect();
            assert_eq!(stdout(&result), expected[..100_000]);
        }
    }
    // As the sandbox's uid, not root, with no file of an earlier job.
    let who = job(
        "php",
        "main.php",
        "<?php var_export([posix_getuid() != 0, scandir('/tmp'), is_readable('/proc/1/environ')]); echo \"\\n\";\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(
        stdout(&result),
        "array (\n  0 => true,\n  1 => \n  array (\n    0 => '.',\n    1 => '..',\n  ),\n  2 => false,\n)\n"
    );
    let who = job(
        "ruby",
        "main.rb",
        "p [Process.uid != 0, Dir.children('/tmp'), File.readable?('/proc/1/environ'), Dir.children('.')]\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(stdout(&result), "[true, [], false, [\"main.rb\"]]\n");
    // R's /tmp holds only its own session directory.
    let who = job(
        "r",
        "main.r",
        "cat(Sys.info()[['effective_user']] != 'root', grepl('^Rtmp', list.files('/tmp')),\n\
             file.access('/proc/1/environ', 4) == 0, list.files('.', all.files = TRUE, no.. = TRUE), '\\n')\n",
    );
    let result = on_runtime_pool(&harness, &who).await;
    assert_eq!(result.start, Some(StartKind::WarmRuntime), "{result:#?}");
    assert_eq!(stdout(&result), "TRUE TRUE FALSE main.r \n");
    harness.assert_clean().await;
}
