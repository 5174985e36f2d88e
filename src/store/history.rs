//! The run history: an API key's jobs, newest first, for a window
//! (`CODE_RUNNER_HISTORY_DAYS`) that does not depend on how long a job's
//! full result is kept.
//!
//! Written by the job's own steps (`note_history` in `job/lib.lua`): submit
//! adds the job's id to `apikey:<name>:history` (and, for a job with a
//! user, `apikey:<name>:history:<user>`), scored by its `created_ms`,
//! trims both to the window, and writes `job:<id>:summary`; start, a
//! retry's requeue and settling copy the job's status, times, reason and
//! figures into the summary. Every one expires with the window.
//!
//! Read here, page by page: the order is `created_ms` descending, then id
//! descending (a sorted set's order among equal scores, bytewise), and a
//! page ends at a [`HistoryPosition`], the last job it examined. The next
//! page starts strictly after it, so jobs added meanwhile (newer) never
//! shift a page, and no job is seen twice or skipped. A key only ever
//! reads its own sets: no other key's job can appear.

use std::time::Duration;

use deadpool_redis::redis;

use super::redis::Redis;
use super::{StoreError, now_ms, parse_status};
use crate::job::Status;

/// How long the history lists a job unless configured otherwise: 7 days.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// Most jobs one read examines (filters may drop most of them): a page
/// with filters that match little may come back short, even empty, with
/// a position to go on from.
pub const MAX_EXAMINED: usize = 2000;

/// Most jobs of one key read at one `created_ms` (one millisecond) when a
/// page resumes amid them.
const MAX_TIED: usize = 10_000;

/// Ids of a sorted set with their scores, as `ZRANGE … WITHSCORES` gives.
type Scored = Vec<(String, f64)>;

/// The summary's fields, in the order [`entry`] reads them.
const SUMMARY_FIELDS: &[&str] = &[
    "status",
    "language",
    "user",
    "created_ms",
    "started_ms",
    "finished_ms",
    "reason",
    "cpu_ms",
    "wall_ms",
];

/// Where a page of the history ended: the last job it examined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPosition {
    pub created_ms: u64,
    pub id: String,
}

impl HistoryPosition {
    /// Whether a job at (`created_ms`, `id`) comes after this position in
    /// the history's order (older, or as old with a smaller id).
    fn is_before(&self, created_ms: u64, id: &str) -> bool {
        created_ms < self.created_ms || (created_ms == self.created_ms && id < self.id.as_str())
    }
}

/// What to list.
#[derive(Debug, Clone)]
pub struct HistoryQuery<'a> {
    pub api_key: &'a str,
    /// Only this user's jobs (`None`: every user's, the anonymous one's
    /// included).
    pub user: Option<&'a str>,
    pub status: Option<Status>,
    /// Only jobs of this language (a catalog id).
    pub language: Option<&'a str>,
    /// Only jobs created at or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Most jobs on the page (at least 1).
    pub limit: usize,
    /// Start after this position (`None`: with the newest job).
    pub after: Option<HistoryPosition>,
}

/// One job as the history shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub id: String,
    pub status: Status,
    pub language: String,
    /// `None`: the key's anonymous user.
    pub user: Option<String>,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// The result's error reason (`worker_lost`, …), else its run stage's
    /// reason (`exited`, `wall_timeout`, …).
    pub reason: Option<String>,
    /// The CPU and wall time of the stages that ran (compile and run).
    pub cpu_ms: Option<u64>,
    pub wall_ms: Option<u64>,
}

/// A page of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    pub jobs: Vec<HistoryEntry>,
    /// Where the next page starts; `None`: there is none.
    pub next: Option<HistoryPosition>,
}

/// The run history's reads.
#[derive(Debug, Clone)]
pub struct History {
    redis: Redis,
}

impl History {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// One page of `query.api_key`'s history, newest first. Jobs older
    /// than the window or `since_ms`, or whose summary has expired, are
    /// not listed. At most [`MAX_EXAMINED`] jobs are examined: a page that
    /// reached it without filling has a `next` position all the same.
    pub async fn list(&self, query: &HistoryQuery<'_>) -> Result<HistoryPage, StoreError> {
        let keys = &self.redis.keys;
        let set = match query.user {
            Some(user) => keys.user_history(query.api_key, user),
            None => keys.history(query.api_key),
        };
        let window_start = now_ms().saturating_sub(self.redis.history_window_ms());
        let min_ms = query.since_ms.unwrap_or(0).max(window_start);
        let limit = query.limit.max(1);
        let mut conn = self.redis.conn().await?;
        let mut jobs = Vec::new();
        let mut position = query.after.clone();
        let mut examined = 0;
        loop {
            let batch = (limit - jobs.len() + 1).clamp(50, 500);
            let ids = page_of_ids(&mut conn, &set, position.as_ref(), min_ms, batch).await?;
            let summaries = read_summaries(&mut conn, &self.redis, &ids).await?;
            let exhausted = ids.len() < batch;
            for ((id, created_ms), summary) in ids.into_iter().zip(summaries) {
                let Some(entry) = entry(&id, created_ms, summary)? else {
                    examined += 1;
                    position = Some(HistoryPosition { created_ms, id });
                    continue;
                };
                if !matches(&entry, query) {
                    examined += 1;
                    position = Some(HistoryPosition { created_ms, id });
                    continue;
                }
                if jobs.len() == limit {
                    // One more match: the page is full and a next one
                    // has something.
                    return Ok(HistoryPage {
                        jobs,
                        next: position,
                    });
                }
                examined += 1;
                position = Some(HistoryPosition { created_ms, id });
                jobs.push(entry);
            }
            if exhausted {
                return Ok(HistoryPage { jobs, next: None });
            }
            if examined >= MAX_EXAMINED {
                return Ok(HistoryPage {
                    jobs,
                    next: position,
                });
            }
        }
    }
}

/// Up to `count` ids of `set` after `after` in newest-first order, with
/// their `created_ms`, none older than `min_ms`.
async fn page_of_ids(
    conn: &mut super::redis::Connection,
    set: &str,
    after: Option<&HistoryPosition>,
    min_ms: u64,
    count: usize,
) -> Result<Vec<(String, u64)>, StoreError> {
    let range = |max: String, limit: usize| {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(set)
            .arg(max)
            .arg(min_ms)
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .arg("WITHSCORES");
        cmd
    };
    let scored = |entries: Scored| -> Vec<(String, u64)> {
        entries
            .into_iter()
            .map(|(id, score)| (id, score as u64))
            .collect()
    };
    let Some(after) = after else {
        let entries: Scored = range("+inf".into(), count).query_async(conn).await?;
        return Ok(scored(entries));
    };
    // The jobs as old as the position with a smaller id, then the older
    // ones: the position's own job need not be in this set (a page of
    // another filter, or trimmed), so no rank is used.
    let (tied, older): (Scored, Scored) = redis::pipe()
        .add_command(range(after.created_ms.to_string(), MAX_TIED))
        .add_command(range(format!("({}", after.created_ms), count))
        .query_async(conn)
        .await?;
    Ok(scored(tied)
        .into_iter()
        .filter(|(id, created_ms)| {
            *created_ms == after.created_ms && after.is_before(*created_ms, id)
        })
        .chain(scored(older))
        .take(count)
        .collect())
}

async fn read_summaries(
    conn: &mut super::redis::Connection,
    redis: &Redis,
    ids: &[(String, u64)],
) -> Result<Vec<Vec<Option<String>>>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for (id, _) in ids {
        pipe.cmd("HMGET")
            .arg(redis.keys.summary(id))
            .arg(SUMMARY_FIELDS);
    }
    Ok(pipe.query_async(conn).await?)
}

/// A job from its summary's fields; `None` when the summary is gone.
fn entry(
    id: &str,
    created_ms: u64,
    fields: Vec<Option<String>>,
) -> Result<Option<HistoryEntry>, StoreError> {
    let mut fields = fields.into_iter();
    let mut next = || fields.next().flatten();
    let Some(status) = next() else {
        return Ok(None);
    };
    let number = |value: Option<String>| value.and_then(|v| v.parse::<u64>().ok());
    Ok(Some(HistoryEntry {
        id: id.to_string(),
        status: parse_status(id, &status)?,
        language: next().unwrap_or_default(),
        user: next().filter(|u| !u.is_empty()),
        created_ms: number(next()).unwrap_or(created_ms),
        started_ms: number(next()),
        finished_ms: number(next()),
        reason: next(),
        cpu_ms: number(next()),
        wall_ms: number(next()),
    }))
}

fn matches(entry: &HistoryEntry, query: &HistoryQuery<'_>) -> bool {
    query.status.is_none_or(|s| s == entry.status)
        && query.language.is_none_or(|l| l == entry.language)
        && query.user.is_none_or(|u| entry.user.as_deref() == Some(u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_newest_first_then_the_larger_id() {
        let position = HistoryPosition {
            created_ms: 100,
            id: "b".into(),
        };
        assert!(position.is_before(99, "z"));
        assert!(position.is_before(100, "a"));
        assert!(!position.is_before(100, "b"));
        assert!(!position.is_before(100, "c"));
        assert!(!position.is_before(101, "a"));
    }

    #[test]
    fn a_summary_reads_as_an_entry_and_a_gone_one_as_none() {
        let fields = |values: &[Option<&str>]| values.iter().map(|v| v.map(String::from)).collect();
        let full = fields(&[
            Some("succeeded"),
            Some("python"),
            Some("u1"),
            Some("1000"),
            Some("1100"),
            Some("1300"),
            Some("exited"),
            Some("12"),
            Some("40"),
        ]);
        assert_eq!(
            entry("j", 1000, full).unwrap(),
            Some(HistoryEntry {
                id: "j".into(),
                status: Status::Succeeded,
                language: "python".into(),
                user: Some("u1".into()),
                created_ms: 1000,
                started_ms: Some(1100),
                finished_ms: Some(1300),
                reason: Some("exited".into()),
                cpu_ms: Some(12),
                wall_ms: Some(40),
            })
        );
        let queued = fields(&[
            Some("queued"),
            Some("c"),
            Some(""),
            Some("5"),
            None,
            None,
            None,
            None,
            None,
        ]);
        let queued = entry("k", 5, queued).unwrap().unwrap();
        assert_eq!(
            (queued.user, queued.started_ms, queued.cpu_ms),
            (None, None, None)
        );
        assert_eq!(entry("gone", 5, vec![None; 9]).unwrap(), None);
        assert!(matches!(
            entry("bad", 5, fields(&[Some("nonsense")])),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
