//! A job's output files once its sandbox is done: each file is kept inline
//! in the result while the job's inline room lasts
//! ([`OutputsPolicy::inline_max_bytes`], the run's files first, then each
//! test's in order), and the rest go to the job's key's file store, where
//! the result names them by `ref` (their SHA-256; `GET /v1/files/{sha256}`
//! reads them, kept like any file the key put). A file the store refuses
//! (over its per-file limit, over the key's storage budget, Redis failing)
//! stays in the result as an entry that says why: nothing is dropped.

use std::time::Duration;

use crate::job::JobResult;
use crate::job::outputs::OutputEntry;
use crate::store::{FilePut, Files};

/// What becomes of a job's output files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputsPolicy {
    /// Most bytes of a job's files inline in its result, all together
    /// (`CODE_RUNNER_OUTPUTS_INLINE_MAX_KB`).
    pub inline_max_bytes: u64,
    /// Largest file the store takes (`CODE_RUNNER_FILE_MAX_MB`).
    pub file_max_bytes: u64,
    /// How long a stored file is kept after its last use
    /// (`CODE_RUNNER_FILE_KEEP_SECS`).
    pub file_keep: Duration,
}

impl Default for OutputsPolicy {
    fn default() -> Self {
        Self {
            inline_max_bytes: 1 << 20,
            file_max_bytes: 64 << 20,
            file_keep: Duration::from_secs(86_400),
        }
    }
}

/// Where the files that do not fit inline go: the job's key's files, under
/// its storage budget.
pub(super) struct Storage<'a> {
    pub files: &'a Files,
    pub api_key: &'a str,
    pub budget: Option<u64>,
}

/// Settles every output file of `result` by `policy` (see the module docs).
pub(super) async fn settle(result: &mut JobResult, policy: &OutputsPolicy, storage: &Storage<'_>) {
    let mut inline_left = policy.inline_max_bytes;
    let mut lists: Vec<&mut Vec<OutputEntry>> = vec![&mut result.outputs];
    if let Some(grading) = result.grading.as_mut() {
        for test in grading.tests.iter_mut() {
            lists.push(&mut test.outputs);
        }
    }
    for list in lists {
        for entry in list.iter_mut() {
            let Some(content) = &entry.content else {
                continue;
            };
            let size = content.len() as u64;
            if size <= inline_left {
                inline_left -= size;
                continue;
            }
            let taken = std::mem::take(entry);
            *entry = store(taken, size, policy, storage).await;
        }
    }
}

/// One file that does not fit inline: stored, or why not.
async fn store(
    entry: OutputEntry,
    size: u64,
    policy: &OutputsPolicy,
    storage: &Storage<'_>,
) -> OutputEntry {
    if size > policy.file_max_bytes {
        return entry.refused(
            "too_large",
            format!(
                "{size} bytes do not fit in the result's inline room left and are more than the {} a stored file may have (CODE_RUNNER_FILE_MAX_MB)",
                policy.file_max_bytes
            ),
        );
    }
    let Some(budget) = storage.budget else {
        return entry.refused(
            "cap_reached",
            "the result's inline room is used up and the job has no storage budget to keep the file in",
        );
    };
    let (Some(digest), Some(content)) = (entry.sha256.clone(), entry.content.as_deref()) else {
        return entry;
    };
    let put = storage
        .files
        .put(storage.api_key, &digest, content, policy.file_keep, budget)
        .await;
    match put {
        Ok(FilePut::Created | FilePut::Existed) => OutputEntry {
            content: None,
            reference: Some(digest),
            ..entry
        },
        Ok(FilePut::OverBudget { held }) => entry.refused(
            "storage_refused",
            format!(
                "the result's inline room is used up, and storing the file's {size} bytes would take the key's jobs and files ({held} bytes) over its budget of {budget} bytes (CODE_RUNNER_KEY_MAX_STORED_MB)"
            ),
        ),
        Err(error) => entry.refused(
            "storage_refused",
            format!("the result's inline room is used up, and the file store failed: {error}"),
        ),
    }
}
