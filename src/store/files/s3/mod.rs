//! The S3 backend of the file store (`CODE_RUNNER_FILE_BACKEND=s3`): a
//! file's bytes in an object of an S3-compatible bucket, its metadata in
//! Redis as with the Redis backend (the key's storage account, its last
//! use), which names the object.
//!
//! Keys: `fileobj:<key>:<sha256>` — string, the name of the object
//! holding the file's bytes, expiring when the file has gone unused for
//! its keep time (every use renews it); `files:objects` — sorted set,
//! every object the backend wrote, scored by when it may be deleted: its
//! file's expiry, 0 once its file is deleted or replaced, and a grace
//! (six hours) while its upload goes on.
//!
//! An object is named `<prefix>/<key>/<sha256>/<upload id>`: a new name
//! for every upload, so that deleting the bytes of a file that went never
//! deletes those of the same file put again since.
//!
//! A put uploads the bytes first (registered in `files:objects` before,
//! so that bytes of an upload that never finishes go too), then keeps the
//! file in one script that checks the budget again: no metadata ever
//! names bytes that are not there. The Lua sweep of the storage account
//! cannot call S3: instead [`S3Files::collect_garbage`], run every second
//! by each API process, deletes the objects that are due, each first taken
//! out of the set by a script, so one process deletes it.

mod http;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_redis::redis::{AsyncCommands, Script};
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::redis::STORAGE;
use super::{ByteStream, FileBackend, FilePut, PutFailure, StreamError};
use crate::store::redis::Redis;
use crate::store::{StoreError, now_ms, unexpected};

/// Bytes up to which a file is written in one request; a larger one in
/// parts of this size (S3's parts have at least 5 MiB).
const PART_BYTES: usize = 8 << 20;

/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// How long an upload may take before its object may be deleted.
const UPLOAD_GRACE: Duration = Duration::from_secs(6 * 3600);

/// When an object that could not be deleted is tried again.
const DELETE_RETRY: Duration = Duration::from_secs(60);

/// Most objects one garbage collection deletes.
const COLLECT_BATCH: usize = 100;

/// A script of this module: its keys and inputs bound to named locals,
/// then its own text.
fn script(storage: bool, inputs: &str, text: &str) -> Script {
    Script::new(&format!(
        "{}local meta_key, stored_key, expiry_key, objects_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n{inputs}\n{text}",
        if storage { STORAGE } else { "" }
    ))
}

static BEGIN: LazyLock<Script> = LazyLock::new(|| {
    script(
        true,
        "local member, object, size, now, keep_ms, budget, grace_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])",
        include_str!("begin.lua"),
    )
});
static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        true,
        "local member, object, size, now, keep_ms, budget = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])",
        include_str!("commit.lua"),
    )
});
static TOUCH: LazyLock<Script> = LazyLock::new(|| {
    script(
        false,
        "local member, now, keep_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])",
        include_str!("touch.lua"),
    )
});
static DELETE: LazyLock<Script> =
    LazyLock::new(|| script(false, "local member = ARGV[1]", include_str!("delete.lua")));
static RETIRE: LazyLock<Script> = LazyLock::new(|| {
    script(
        false,
        "local member, object, now = ARGV[1], ARGV[2], tonumber(ARGV[3])",
        include_str!("retire.lua"),
    )
});

/// Where the objects go, as `CODE_RUNNER_S3_*` say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    /// The endpoint's URL; `None`: AWS's for the region.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    /// Before every object's name (no leading or trailing `/`); may be
    /// empty.
    pub prefix: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `https://endpoint/bucket/key` rather than `https://bucket.endpoint/key`.
    pub path_style: bool,
}

/// The bucket objects go to, and the prefix of their names.
#[derive(Debug, Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

impl Objects {
    /// The client of `config`'s bucket; connects to nothing yet.
    pub fn new(config: &S3Config) -> Result<Self, String> {
        let mut builder = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_http_connector(http::Connector::new()?)
            // A few quick retries: a store that is down is an error soon,
            // not minutes later.
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: 3,
                retry_timeout: Duration::from_secs(20),
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder.build().map_err(|e| e.to_string())?;
        Ok(Self {
            store: Arc::new(store),
            prefix: config.prefix.clone(),
        })
    }

    /// The object named `name` (`<key>/<sha256>/<upload id>`).
    fn path(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    /// Writes `content` to `path`: in one request if it ends within a
    /// part, else in parts as it comes (a multipart upload, aborted when
    /// the bytes stop with an error). Holds at most a few parts in memory.
    async fn upload(&self, path: &Path, mut content: ByteStream) -> Result<(), PutFailure> {
        let mut first = Vec::new();
        loop {
            match content.next().await {
                Some(Ok(chunk)) => {
                    first.extend_from_slice(&chunk);
                    if first.len() >= PART_BYTES {
                        break;
                    }
                }
                Some(Err(error)) => return Err(PutFailure::Body(error)),
                None => {
                    self.store
                        .put(path, PutPayload::from(first))
                        .await
                        .map_err(|e| failed("write", path, e))?;
                    return Ok(());
                }
            }
        }
        let upload = self
            .store
            .put_multipart(path)
            .await
            .map_err(|e| failed("write", path, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        writer.put(Bytes::from(first));
        loop {
            let next = match content.next().await {
                Some(Ok(chunk)) => writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map(|()| writer.put(chunk))
                    .map_err(|e| PutFailure::Store(failed("write", path, e))),
                Some(Err(error)) => Err(PutFailure::Body(error)),
                None => break,
            };
            if let Err(failure) = next {
                if let Err(error) = writer.abort().await {
                    tracing::warn!(%path, %error, "cannot abort the multipart upload");
                }
                return Err(failure);
            }
        }
        writer
            .finish()
            .await
            .map_err(|e| failed("write", path, e))?;
        Ok(())
    }

    /// The size and bytes of `path`; `None` when there is no such object.
    async fn get(&self, path: &Path) -> Result<Option<(u64, ByteStream)>, StoreError> {
        match self.store.get(path).await {
            Ok(result) => {
                let size = result.meta.size;
                let display = path.to_string();
                let stream = result
                    .into_stream()
                    .map(move |chunk| {
                        chunk.map_err(|e| StreamError::Read(format!("cannot read {display}: {e}")))
                    })
                    .boxed();
                Ok(Some((size, stream)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(failed("read", path, error)),
        }
    }

    /// Deletes `path`; one that is not there is deleted.
    async fn delete(&self, path: &Path) -> Result<(), StoreError> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(failed("delete", path, error)),
        }
    }
}

fn failed(what: &str, path: &Path, error: object_store::Error) -> StoreError {
    StoreError::Objects(format!("cannot {what} {path}: {error}"))
}

/// The files of every key, their bytes in a bucket.
#[derive(Debug, Clone)]
pub struct S3Files {
    redis: Redis,
    objects: Objects,
}

/// A file's keys and its member in the storage account.
struct FileKeys {
    meta: String,
    stored: String,
    expiry: String,
    objects: String,
    member: String,
}

impl S3Files {
    pub(in crate::store) fn new(redis: Redis, objects: Objects) -> Self {
        Self { redis, objects }
    }

    fn keys(&self, api_key: &str, digest: &str) -> FileKeys {
        let keys = &self.redis.keys;
        FileKeys {
            meta: keys.file_object(api_key, digest),
            stored: keys.stored(api_key),
            expiry: keys.expiry(api_key),
            objects: keys.file_objects(),
            member: format!("f:{digest}"),
        }
    }

    /// A use of the file: its size and object name, if the key has it.
    async fn touch(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<(u64, String)>, StoreError> {
        let k = self.keys(api_key, digest);
        let mut conn = self.redis.conn().await?;
        let (outcome, size, object): (String, u64, String) = TOUCH
            .key(k.meta)
            .key(k.stored)
            .key(k.expiry)
            .key(k.objects)
            .arg(k.member)
            .arg(now_ms())
            .arg(keep.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok((outcome == "found").then_some((size, object)))
    }

    /// Makes `object` due now, so the garbage collection deletes it.
    async fn abandon(&self, object: &str) {
        let marked: Result<(), StoreError> = async {
            let mut conn = self.redis.conn().await?;
            let () = conn.zadd(self.redis.keys.file_objects(), object, 0).await?;
            Ok(())
        }
        .await;
        if let Err(error) = marked {
            tracing::warn!(object, %error, "cannot mark an abandoned upload's object for deletion; it goes after its grace");
        }
    }
}

#[async_trait]
impl FileBackend for S3Files {
    fn name(&self) -> &'static str {
        "s3"
    }

    async fn put(
        &self,
        api_key: &str,
        digest: &str,
        mut content: ByteStream,
        size: Option<u64>,
        keep: Duration,
        budget: u64,
    ) -> Result<FilePut, PutFailure> {
        let object = format!("{api_key}/{digest}/{}", uuid::Uuid::new_v4().simple());
        let k = self.keys(api_key, digest);
        let reply: Vec<String> = {
            let mut conn = self.redis.conn().await?;
            BEGIN
                .key(&k.meta)
                .key(&k.stored)
                .key(&k.expiry)
                .key(&k.objects)
                .arg(&k.member)
                .arg(&object)
                .arg(size.map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX)))
                .arg(now_ms())
                .arg(keep.as_millis() as u64)
                .arg(budget)
                .arg(UPLOAD_GRACE.as_millis() as u64)
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::from)?
        };
        match reply.first().map(String::as_str) {
            Some("upload") => {}
            // Nothing to write, but the bytes sent must be the file still.
            Some("existed") => {
                while let Some(chunk) = content.next().await {
                    chunk.map_err(PutFailure::Body)?;
                }
                return Ok(FilePut::Existed);
            }
            Some("over_budget") => return Ok(over_budget(&reply)),
            _ => return Err(unexpected("files/s3/begin.lua", reply).into()),
        }
        let path = self.objects.path(&object);
        let sized = counted(content);
        let written = sized.1.clone();
        if let Err(failure) = self.objects.upload(&path, sized.0).await {
            self.abandon(&object).await;
            return Err(failure);
        }
        let size = written.load(std::sync::atomic::Ordering::Relaxed);
        let reply: Vec<String> = async {
            let mut conn = self.redis.conn().await?;
            Ok::<_, StoreError>(
                COMMIT
                    .key(&k.meta)
                    .key(&k.stored)
                    .key(&k.expiry)
                    .key(&k.objects)
                    .arg(&k.member)
                    .arg(&object)
                    .arg(size)
                    .arg(now_ms())
                    .arg(keep.as_millis() as u64)
                    .arg(budget)
                    .invoke_async(&mut conn)
                    .await?,
            )
        }
        // On an error, whether the file was kept is unknown: its object
        // stays registered with its grace, and goes then unless kept.
        .await?;
        match reply.first().map(String::as_str) {
            Some("created") => Ok(FilePut::Created),
            Some("existed") => Ok(FilePut::Existed),
            Some("over_budget") => Ok(over_budget(&reply)),
            Some("lost") => Err(StoreError::Objects(format!(
                "the upload of {path} took longer than {} h and its object was deleted; put the file again",
                UPLOAD_GRACE.as_secs() / 3600
            ))
            .into()),
            _ => Err(unexpected("files/s3/commit.lua", reply).into()),
        }
    }

    async fn size(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .touch(api_key, digest, keep)
            .await?
            .map(|(size, _)| size))
    }

    async fn open(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<(u64, ByteStream)>, StoreError> {
        let Some((_, object)) = self.touch(api_key, digest, keep).await? else {
            return Ok(None);
        };
        self.objects.get(&self.objects.path(&object)).await
    }

    async fn read(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let object: Option<String> = {
            let mut conn = self.redis.conn().await?;
            conn.get(self.redis.keys.file_object(api_key, digest))
                .await?
        };
        let Some(object) = object else {
            return Ok(None);
        };
        let Some((size, mut stream)) = self.objects.get(&self.objects.path(&object)).await? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.map_err(|e| StoreError::Objects(e.to_string()))?);
        }
        Ok(Some(bytes))
    }

    async fn delete(&self, api_key: &str, digest: &str) -> Result<bool, StoreError> {
        let k = self.keys(api_key, digest);
        let object: String = {
            let mut conn = self.redis.conn().await?;
            DELETE
                .key(k.meta)
                .key(k.stored)
                .key(k.expiry)
                .key(k.objects)
                .arg(k.member)
                .invoke_async(&mut conn)
                .await?
        };
        if object.is_empty() {
            return Ok(false);
        }
        // The file is gone whatever becomes of its bytes now: the garbage
        // collection deletes them if this cannot.
        if let Err(error) = self.retire(&object).await {
            tracing::warn!(object, %error, "cannot delete a deleted file's object yet");
        }
        Ok(true)
    }

    async fn collect_garbage(&self) -> Result<usize, StoreError> {
        let due: Vec<String> = {
            let mut conn = self.redis.conn().await?;
            conn.zrangebyscore_limit(
                self.redis.keys.file_objects(),
                "-inf",
                now_ms(),
                0,
                COLLECT_BATCH as isize,
            )
            .await?
        };
        let mut deleted = 0;
        let mut first_error = None;
        for object in due {
            match self.retire(&object).await {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(deleted),
        }
    }
}

impl S3Files {
    /// Deletes `object` if it is due and no other process took it first;
    /// whether this one deleted it. An object that cannot be deleted is
    /// tried again after [`DELETE_RETRY`].
    async fn retire(&self, object: &str) -> Result<bool, StoreError> {
        let mut parts = object.rsplitn(3, '/');
        let (Some(_upload), Some(digest), Some(api_key)) =
            (parts.next(), parts.next(), parts.next())
        else {
            // Not a name this backend writes: let it be.
            let mut conn = self.redis.conn().await?;
            let () = conn.zrem(self.redis.keys.file_objects(), object).await?;
            return Ok(false);
        };
        let k = self.keys(api_key, digest);
        let taken: i64 = {
            let mut conn = self.redis.conn().await?;
            RETIRE
                .key(k.meta)
                .key(k.stored)
                .key(k.expiry)
                .key(&k.objects)
                .arg(k.member)
                .arg(object)
                .arg(now_ms())
                .invoke_async(&mut conn)
                .await?
        };
        if taken != 1 {
            return Ok(false);
        }
        if let Err(error) = self.objects.delete(&self.objects.path(object)).await {
            let retry = now_ms() + DELETE_RETRY.as_millis() as u64;
            let mut conn = self.redis.conn().await?;
            let () = conn.zadd(&k.objects, object, retry).await?;
            return Err(error);
        }
        Ok(true)
    }
}

fn over_budget(reply: &[String]) -> FilePut {
    FilePut::OverBudget {
        held: reply.get(1).and_then(|h| h.parse().ok()).unwrap_or(0),
    }
}

/// `content`, counting the bytes that pass.
fn counted(content: ByteStream) -> (ByteStream, Arc<std::sync::atomic::AtomicU64>) {
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = Arc::clone(&count);
    let stream = content
        .inspect(move |chunk| {
            if let Ok(chunk) = chunk {
                counter.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .boxed();
    (stream, count)
}
