//! The Redis backend of the file store (`CODE_RUNNER_FILE_BACKEND=redis`):
//! a file's bytes in Redis beside its metadata.
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

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_redis::redis::Script;
use futures_util::StreamExt;

use super::{ByteStream, FileBackend, FilePut, PutFailure};
use crate::store::redis::Redis;
use crate::store::{StoreError, now_ms, unexpected};

pub(crate) const STORAGE: &str = include_str!("../storage.lua");

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

/// The files of every key, bytes and all in Redis.
#[derive(Debug, Clone)]
pub struct RedisFiles {
    redis: Redis,
}

impl RedisFiles {
    pub(in crate::store) fn new(redis: Redis) -> Self {
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
    async fn put_bytes(
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
    async fn size_of(
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
    async fn get_bytes(
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
    async fn read_bytes(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
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
    async fn delete_file(&self, api_key: &str, digest: &str) -> Result<bool, StoreError> {
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

#[async_trait]
impl FileBackend for RedisFiles {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// The bytes are gathered first: a Redis value is written whole.
    async fn put(
        &self,
        api_key: &str,
        digest: &str,
        mut content: ByteStream,
        size: Option<u64>,
        keep: Duration,
        budget: u64,
    ) -> Result<FilePut, PutFailure> {
        let mut bytes = Vec::with_capacity(size.map_or(0, |s| usize::try_from(s).unwrap_or(0)));
        while let Some(chunk) = content.next().await {
            bytes.extend_from_slice(&chunk.map_err(PutFailure::Body)?);
        }
        Ok(self
            .put_bytes(api_key, digest, &bytes, keep, budget)
            .await?)
    }

    async fn size(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<u64>, StoreError> {
        self.size_of(api_key, digest, keep).await
    }

    async fn open(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<(u64, ByteStream)>, StoreError> {
        Ok(self.get_bytes(api_key, digest, keep).await?.map(|bytes| {
            let size = bytes.len() as u64;
            let bytes = Bytes::from(bytes);
            let stream: ByteStream = futures_util::stream::once(async move { Ok(bytes) }).boxed();
            (size, stream)
        }))
    }

    async fn read(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_bytes(api_key, digest).await
    }

    async fn delete(&self, api_key: &str, digest: &str) -> Result<bool, StoreError> {
        self.delete_file(api_key, digest).await
    }
}
