//! The usage ledger: what each API key's jobs used, per UTC day and per
//! user (`usage:<key>:<YYYY-MM-DD>`), and the daily quotas checked against
//! it at submit.
//!
//! The ledger is written only by the job's steps, atomically with them
//! (`lib.lua`): submit adds the job to the day's `submitted` (what the
//! jobs-per-day quota counts), and `settle_job` adds an ended job's
//! figures to the day it ended — once, whatever ends it (a late result
//! that replaces a verdict adds only the difference to what was counted).
//! A job counts when it ends after it started at least once: succeeded,
//! failed, timed out, cancelled while running, or given up on (`error`
//! after a start: lost, past its deadline). A job cancelled while queued,
//! or dead-lettered before any start, used nothing and is not counted.
//!
//! The day is computed in Lua (`usage_day`) and in Rust ([`Day`]) with the
//! same algorithm (Howard Hinnant's `civil_from_days`); a test holds them
//! equal over three centuries.
//!
//! One day's hash holds the key's totals under the figure's name (`jobs`,
//! `cpu_ms`, `wall_ms`, `output_bytes`, `submitted`) and each user's under
//! `<figure>:<user>` (`cpu_ms:alice`; `cpu_ms:` for the key's anonymous
//! user). It expires the retention after the day ends.
//!
//! Figures of a job: `cpu_ms` and `wall_ms` are the sums over its result's
//! stages (compile and run; a graded job's compile, tests, checker and
//! `restarts`); `output_bytes` is the output it keeps (stdout
//! and stderr of every stage). An attempt the platform gave up on without
//! a result (a lost worker) adds no figures of its own: they were never
//! reported.

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_redis::redis;

use super::StoreError;
use super::redis::Redis;

/// One UTC calendar day, as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(i64);

const MS_PER_DAY: u64 = 86_400_000;

impl Day {
    /// The day Unix time `ms` falls on.
    pub fn from_ms(ms: u64) -> Self {
        Day((ms / MS_PER_DAY) as i64)
    }

    /// The day `days` after 1970-01-01.
    pub fn from_days(days: i64) -> Self {
        Day(days)
    }

    /// Days since 1970-01-01.
    pub fn days(self) -> i64 {
        self.0
    }

    /// `YYYY-MM-DD`, strictly: four-digit year, a real month and day.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        let digits = |range: std::ops::Range<usize>| -> Option<i64> {
            let part = text.get(range)?;
            part.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| part.parse().ok())?
        };
        if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
            return None;
        }
        let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
        if !(1..=12).contains(&month) || day < 1 {
            return None;
        }
        let parsed = Day(days_from_civil(year, month, day));
        // A day past its month's end comes back as another date.
        (parsed.civil() == (year, month, day)).then_some(parsed)
    }

    /// The year, month and day of the month.
    pub fn civil(self) -> (i64, i64, i64) {
        civil_from_days(self.0)
    }

    /// When the day begins, in Unix ms (0 for days before 1970).
    pub fn start_ms(self) -> u64 {
        u64::try_from(self.0).map_or(0, |d| d * MS_PER_DAY)
    }

    /// The day `n` days later (earlier when negative).
    pub fn plus(self, n: i64) -> Self {
        Day(self.0 + n)
    }
}

impl std::fmt::Display for Day {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (y, m, d) = self.civil();
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

/// Howard Hinnant's `days_from_civil`: the proleptic Gregorian date as days
/// since 1970-01-01. `lib.lua` computes the inverse the same way.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's `civil_from_days` (as `usage_day` in `lib.lua`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A key's daily quotas (its entry in `CODE_RUNNER_API_KEYS`), checked at
/// submit; `None`: no quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotas {
    /// CPU seconds the key's jobs may use per UTC day.
    pub key_cpu_seconds: Option<u64>,
    /// CPU seconds one user's jobs may use per UTC day.
    pub user_cpu_seconds: Option<u64>,
    /// Jobs one user may submit per UTC day.
    pub user_jobs: Option<u64>,
}

/// Which quota refused a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// `cpu_seconds_per_day`: the key's CPU seconds.
    KeyCpuSeconds,
    /// `user_cpu_seconds_per_day`: the user's CPU seconds.
    UserCpuSeconds,
    /// `user_jobs_per_day`: the user's submissions.
    UserJobs,
}

impl Quota {
    /// Its option's name in a key entry.
    pub fn option(self) -> &'static str {
        match self {
            Quota::KeyCpuSeconds => "cpu_seconds_per_day",
            Quota::UserCpuSeconds => "user_cpu_seconds_per_day",
            Quota::UserJobs => "user_jobs_per_day",
        }
    }

    pub(super) fn from_option(name: &str) -> Option<Self> {
        [Quota::KeyCpuSeconds, Quota::UserCpuSeconds, Quota::UserJobs]
            .into_iter()
            .find(|q| q.option() == name)
    }

    /// The quota's limit in `quotas`.
    pub fn limit(self, quotas: &Quotas) -> Option<u64> {
        match self {
            Quota::KeyCpuSeconds => quotas.key_cpu_seconds,
            Quota::UserCpuSeconds => quotas.user_cpu_seconds,
            Quota::UserJobs => quotas.user_jobs,
        }
    }
}

/// What jobs used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Figures {
    /// Jobs that ended (having started).
    pub jobs: u64,
    pub cpu_ms: u64,
    pub wall_ms: u64,
    pub output_bytes: u64,
    /// Jobs accepted (what `user_jobs_per_day` counts).
    pub submitted: u64,
}

impl Figures {
    fn set(&mut self, name: &str, value: u64) -> bool {
        let slot = match name {
            "jobs" => &mut self.jobs,
            "cpu_ms" => &mut self.cpu_ms,
            "wall_ms" => &mut self.wall_ms,
            "output_bytes" => &mut self.output_bytes,
            "submitted" => &mut self.submitted,
            _ => return false,
        };
        *slot = value;
        true
    }

    pub fn add(&mut self, other: &Figures) {
        self.jobs += other.jobs;
        self.cpu_ms += other.cpu_ms;
        self.wall_ms += other.wall_ms;
        self.output_bytes += other.output_bytes;
        self.submitted += other.submitted;
    }

    pub fn is_zero(&self) -> bool {
        *self == Figures::default()
    }
}

/// One day of one key's ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayUsage {
    pub day: Day,
    /// The key's totals.
    pub total: Figures,
    /// Per user (`""`: the key's anonymous user).
    pub users: BTreeMap<String, Figures>,
}

impl DayUsage {
    /// A day's hash as stored: totals under the figure's name, a user's
    /// under `<figure>:<user>`. Fields it does not know are left out.
    fn from_hash(day: Day, hash: BTreeMap<String, u64>) -> Self {
        let mut usage = DayUsage {
            day,
            total: Figures::default(),
            users: BTreeMap::new(),
        };
        for (field, value) in hash {
            match field.split_once(':') {
                None => {
                    usage.total.set(&field, value);
                }
                Some((name, user)) => {
                    let mut figures = usage.users.get(user).copied().unwrap_or_default();
                    if figures.set(name, value) {
                        usage.users.insert(user.to_string(), figures);
                    }
                }
            }
        }
        usage
    }
}

/// The default retention of the ledger.
pub const DEFAULT_RETENTION_DAYS: u64 = 90;

/// The ledger's reads.
#[derive(Debug, Clone)]
pub struct Usage {
    redis: Redis,
}

impl Usage {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// How long a day of the ledger is kept after it ends.
    pub fn retention(&self) -> Duration {
        self.redis.usage_retention
    }

    /// The earliest day still kept on `today`.
    pub fn earliest(&self, today: Day) -> Day {
        today.plus(-((self.retention().as_secs() / 86_400) as i64))
    }

    /// The days from `from` to `to` (both included) on which `api_key`'s
    /// jobs were submitted or ended, oldest first; days without either are
    /// left out.
    pub async fn days(
        &self,
        api_key: &str,
        from: Day,
        to: Day,
    ) -> Result<Vec<DayUsage>, StoreError> {
        if to < from {
            return Ok(Vec::new());
        }
        let days: Vec<Day> = (from.days()..=to.days()).map(Day::from_days).collect();
        let mut pipe = redis::pipe();
        for day in &days {
            pipe.hgetall(self.redis.keys.usage(api_key, &day.to_string()));
        }
        let mut conn = self.redis.conn().await?;
        let hashes: Vec<BTreeMap<String, u64>> = pipe.query_async(&mut conn).await?;
        Ok(days
            .into_iter()
            .zip(hashes)
            .filter(|(_, hash)| !hash.is_empty())
            .map(|(day, hash)| DayUsage::from_hash(day, hash))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(Day::from_ms(0).to_string(), "1970-01-01");
        assert_eq!(Day::from_ms(1_796_118_900_000).to_string(), "2026-12-01");
        assert_eq!(Day::from_ms(951_782_400_000).to_string(), "2000-02-29");
        assert_eq!(Day::from_ms(86_399_999).to_string(), "1970-01-01");
        assert_eq!(Day::from_ms(86_400_000).to_string(), "1970-01-02");
        // Every day of four centuries agrees with humantime's RFC 3339.
        for days in 0..146_097 {
            let day = Day::from_days(days);
            let time = std::time::UNIX_EPOCH + Duration::from_secs(days as u64 * 86_400 + 43_200);
            let rfc = humantime::format_rfc3339_seconds(time).to_string();
            assert_eq!(day.to_string(), rfc[..10], "day {days}");
            assert_eq!(Day::parse(&rfc[..10]), Some(day));
        }
    }

    #[test]
    fn only_real_dates_parse() {
        assert_eq!(
            Day::parse("2026-12-01").map(Day::start_ms),
            Some(1_796_083_200_000)
        );
        for bad in [
            "2026-02-29",
            "2026-13-01",
            "2026-00-10",
            "2026-12-00",
            "2026-04-31",
            "2026-1-01",
            "26-12-01",
            "2026/12/01",
            "2026-12-01T",
            "+026-12-01",
            "",
            "yesterday",
        ] {
            assert_eq!(Day::parse(bad), None, "{bad:?}");
        }
        assert!(Day::parse("2024-02-29").is_some());
    }

    #[test]
    fn a_days_hash_splits_into_totals_and_users() {
        let hash: BTreeMap<String, u64> = [
            ("jobs", 3),
            ("cpu_ms", 120),
            ("submitted", 4),
            ("jobs:alice", 2),
            ("cpu_ms:alice", 100),
            ("jobs:", 1),
            ("cpu_ms:", 20),
            ("submitted:a:b", 1),
            ("unknown", 9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let day = DayUsage::from_hash(Day::from_days(1), hash);
        assert_eq!(
            day.total,
            Figures {
                jobs: 3,
                cpu_ms: 120,
                submitted: 4,
                ..Figures::default()
            }
        );
        assert_eq!(day.users["alice"].cpu_ms, 100);
        assert_eq!(day.users[""].jobs, 1);
        assert_eq!(day.users["a:b"].submitted, 1);
        assert_eq!(day.users.len(), 3);
    }
}
