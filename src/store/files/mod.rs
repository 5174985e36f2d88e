//! Files by digest: bytes a key uploads once (`PUT /v1/files/{sha256}`)
//! and names afterwards, kept in Redis until unused for a set time.
//!
//! Keys: `file:<api key>:<sha256>` — string, the bytes, expiring when the
//! file has gone unused for its keep time (every use renews it). The file
//! also holds `f:<sha256>` in its key's storage account
//! (`apikey:<name>:stored`, with the same time in `apikey:<name>:expiry`),
//! beside the key's jobs: one budget for both (`storage.lua`).
//!
//! Each step is one Lua script, so a file and its account entry never
//! disagree for a reader.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::Script;

use super::redis::Redis;
use super::{StoreError, now_ms, unexpected};

const STORAGE: &str = include_str!("../storage.lua");

/// A script of this module: the storage account's helpers, its inputs
/// bound to named locals, then its own text.
fn script(inputs: &str, text: &str) -> Script {
    Script::new(&format!(
        "{STORAGE}local file_key, stored_key, expiry_key = KEYS[1], KEYS[2], KEYS[3]\n{inputs}\n{text}"
    ))
}

static PUT: LazyLock<Script> = LazyLock::new(|| {
    script(
        "local member, content, now, keep_ms, budget = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])",
        include_str!("put.lua"),
    )
});
static TOUCH: LazyLock<Script> = LazyLock::new(|| {
    script(
        "local member, now, keep_ms, want_bytes = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])",
        include_str!("touch.lua"),
    )
});
static DELETE: LazyLock<Script> =
    LazyLock::new(|| script("local member = ARGV[1]", include_str!("delete.lua")));

/// What became of a file put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilePut {
    /// Kept now.
    Created,
    /// The key had it already; its time is renewed.
    Existed,
    /// Not kept: the key's jobs and files hold `held` bytes, and this file
    /// would take them over the budget.
    OverBudget { held: u64 },
}

/// The files of every key.
#[derive(Debug, Clone)]
pub struct Files {
    redis: Redis,
}

impl Files {
    pub(super) fn new(redis: Redis) -> Self {
        Self { redis }
    }

    fn keys(&self, api_key: &str, digest: &str) -> (String, String, String, String) {
        let keys = &self.redis.keys;
        (
            keys.file(api_key, digest),
            keys.stored(api_key),
            keys.expiry(api_key),
            format!("f:{digest}"),
        )
    }

    /// Keeps `content` as `api_key`'s file `digest` (the caller checked
    /// that it is the content's SHA-256) for `keep` after its last use,
    /// if the key's storage `budget` (bytes, its jobs' included) allows.
    pub async fn put(
        &self,
        api_key: &str,
        digest: &str,
        content: &[u8],
        keep: Duration,
        budget: u64,
    ) -> Result<FilePut, StoreError> {
        let (file, stored, expiry, member) = self.keys(api_key, digest);
        let mut conn = self.redis.conn().await?;
        let reply: Vec<String> = PUT
            .key(file)
            .key(stored)
            .key(expiry)
            .arg(member)
            .arg(content)
            .arg(now_ms())
            .arg(keep.as_millis() as u64)
            .arg(budget)
            .invoke_async(&mut conn)
            .await?;
        match reply.first().map(String::as_str) {
            Some("created") => Ok(FilePut::Created),
            Some("existed") => Ok(FilePut::Existed),
            Some("over_budget") => Ok(FilePut::OverBudget {
                held: reply.get(1).and_then(|h| h.parse().ok()).unwrap_or(0),
            }),
            _ => Err(unexpected("files/put.lua", reply)),
        }
    }

    /// The size of `api_key`'s file `digest`, if it has it; a use, which
    /// renews its time.
    pub async fn size(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .touch(api_key, digest, keep, false)
            .await?
            .map(|(size, _)| size))
    }

    /// The bytes of `api_key`'s file `digest`, if it has it; a use, which
    /// renews its time.
    pub async fn get(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .touch(api_key, digest, keep, true)
            .await?
            .map(|(_, bytes)| bytes))
    }

    /// The bytes of `api_key`'s file `digest` as a worker reads them for a
    /// job that names it (the API renewed its time when it took the job).
    pub async fn read(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut conn = self.redis.conn().await?;
        let bytes: Option<Vec<u8>> = deadpool_redis::redis::AsyncCommands::get(
            &mut conn,
            self.redis.keys.file(api_key, digest),
        )
        .await?;
        Ok(bytes)
    }

    async fn touch(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
        want_bytes: bool,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let (file, stored, expiry, member) = self.keys(api_key, digest);
        let mut conn = self.redis.conn().await?;
        let (outcome, size, bytes): (String, u64, Vec<u8>) = TOUCH
            .key(file)
            .key(stored)
            .key(expiry)
            .arg(member)
            .arg(now_ms())
            .arg(keep.as_millis() as u64)
            .arg(u8::from(want_bytes))
            .invoke_async(&mut conn)
            .await?;
        Ok((outcome == "found").then_some((size, bytes)))
    }

    /// Removes `api_key`'s file `digest`; whether it had it.
    pub async fn delete(&self, api_key: &str, digest: &str) -> Result<bool, StoreError> {
        let (file, stored, expiry, member) = self.keys(api_key, digest);
        let mut conn = self.redis.conn().await?;
        let existed: i64 = DELETE
            .key(file)
            .key(stored)
            .key(expiry)
            .arg(member)
            .invoke_async(&mut conn)
            .await?;
        Ok(existed == 1)
    }
}
