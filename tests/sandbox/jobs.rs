//! Jobs and inputs that several of this binary's modules run: a job that
//! outlives every deadline of the tests, a Python memory bomb, and bytes as
//! the base64 a job's stdin or file takes.

use code_runner::job::JobSpec;
use code_runner::job::limits::LimitsRequest;

use crate::common::job_with_limits;

/// A bash job that prints `sleeping` and would outlive every deadline of
/// these tests by far (its wall limit is two minutes).
pub fn sleep_forever() -> JobSpec {
    job_with_limits(
        "bash",
        "main.sh",
        "echo sleeping; sleep 1000",
        LimitsRequest {
            wall_ms: Some(120_000),
            ..Default::default()
        },
    )
}

/// A Python job that allocates 8 MiB after 8 MiB for ever, with a memory
/// limit of `memory_mb`.
pub fn memory_bomb(memory_mb: u64) -> JobSpec {
    job_with_limits(
        "python",
        "main.py",
        "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))\n",
        LimitsRequest {
            memory_mb: Some(memory_mb),
            ..Default::default()
        },
    )
}

/// `bytes` in standard base64 (`stdin_encoding` or a file's `encoding`).
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
