//! Files by digest: bytes a key uploads once (`PUT /v1/files/{sha256}`)
//! and names afterwards, kept until unused for a set time.
//!
//! What a file is — whose it is, its size, its last use, its place in its
//! key's storage account (`apikey:<name>:stored`, `f:<sha256>`, beside the
//! key's jobs: one budget for both, `storage.lua`) — is in Redis whatever
//! the backend, so budgets stay atomic and fleet-wide. Where its bytes
//! live is the operator's choice (`CODE_RUNNER_FILE_BACKEND`), behind one
//! interface, [`FileBackend`]:
//!
//! - [`redis`]: in Redis beside the metadata (`file:<key>:<sha256>`),
//!   written and read with it by one script: small deployments;
//! - [`s3`]: in an S3-compatible bucket, the metadata in Redis naming the
//!   object: fleets and large files.
//!
//! [`Files`] is the handle every part of the daemon uses.

pub mod redis;
pub mod s3;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use sha2::{Digest, Sha256};

use super::StoreError;

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

/// Why the bytes of a file put or read stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// More bytes came than a file may have.
    #[error("the file has more than {limit} bytes")]
    TooLarge { limit: u64 },
    /// The bytes hash to `actual`, not to the digest they were put as.
    #[error("the bytes' SHA-256 is {actual}")]
    Digest { actual: String },
    /// The bytes could not be read (the client went, the store failed).
    #[error("{0}")]
    Read(String),
}

/// A file's bytes as they come: chunks, or why they stopped.
pub type ByteStream = BoxStream<'static, Result<Bytes, StreamError>>;

/// Why a put kept nothing.
#[derive(Debug, thiserror::Error)]
pub enum PutFailure {
    /// The bytes sent were not the file (too many, another digest, cut off).
    #[error(transparent)]
    Body(StreamError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the bytes of files live; the metadata is in Redis either way.
#[async_trait]
pub trait FileBackend: std::fmt::Debug + Send + Sync {
    /// The backend's name, as `CODE_RUNNER_FILE_BACKEND` says it.
    fn name(&self) -> &'static str;

    /// Keeps `content` as `api_key`'s file `digest` for `keep` after its
    /// last use if the key's storage `budget` allows. `size`, when known
    /// before the bytes come, lets a put over the budget be refused before
    /// they are read. `content` ends with an error if the bytes are not
    /// the file (see [`checked`]): then nothing is kept.
    async fn put(
        &self,
        api_key: &str,
        digest: &str,
        content: ByteStream,
        size: Option<u64>,
        keep: Duration,
        budget: u64,
    ) -> Result<FilePut, PutFailure>;

    /// The size of `api_key`'s file `digest`, if it has it; a use.
    async fn size(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<u64>, StoreError>;

    /// The size and bytes of `api_key`'s file `digest`, if it has it; a
    /// use.
    async fn open(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<(u64, ByteStream)>, StoreError>;

    /// The bytes of `api_key`'s file `digest` as a worker reads them for a
    /// job (the API renewed its time when it took the job).
    async fn read(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Removes `api_key`'s file `digest`; whether it had it.
    async fn delete(&self, api_key: &str, digest: &str) -> Result<bool, StoreError>;

    /// Deletes bytes whose file is gone (expired, deleted, replaced), as
    /// many as are due up to a bound; how many. The Redis backend has
    /// nothing to do: its bytes expire with their file.
    async fn collect_garbage(&self) -> Result<usize, StoreError> {
        Ok(0)
    }
}

/// The files of every key: their metadata in Redis, their bytes where the
/// backend keeps them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Files {
    backend: Arc<dyn FileBackend>,
}

impl Files {
    pub(super) fn new(backend: Arc<dyn FileBackend>) -> Self {
        Self { backend }
    }

    /// The backend's name (`redis`, `s3`).
    pub fn backend(&self) -> &'static str {
        self.backend.name()
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
        let size = content.len() as u64;
        let bytes = Bytes::copy_from_slice(content);
        let content = futures_util::stream::once(async move { Ok(bytes) }).boxed();
        match self
            .backend
            .put(api_key, digest, content, Some(size), keep, budget)
            .await
        {
            Ok(put) => Ok(put),
            Err(PutFailure::Store(error)) => Err(error),
            Err(PutFailure::Body(error)) => Err(StoreError::Objects(error.to_string())),
        }
    }

    /// Keeps the bytes of `content` as `api_key`'s file `digest` as they
    /// come (see [`FileBackend::put`]); wrap them in [`checked`].
    pub async fn put_stream(
        &self,
        api_key: &str,
        digest: &str,
        content: ByteStream,
        size: Option<u64>,
        keep: Duration,
        budget: u64,
    ) -> Result<FilePut, PutFailure> {
        self.backend
            .put(api_key, digest, content, size, keep, budget)
            .await
    }

    /// The size of `api_key`'s file `digest`, if it has it; a use, which
    /// renews its time.
    pub async fn size(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<u64>, StoreError> {
        self.backend.size(api_key, digest, keep).await
    }

    /// The bytes of `api_key`'s file `digest`, if it has it; a use, which
    /// renews its time.
    pub async fn get(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some((size, mut stream)) = self.backend.open(api_key, digest, keep).await? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.map_err(|e| StoreError::Objects(e.to_string()))?);
        }
        Ok(Some(bytes))
    }

    /// The size and bytes of `api_key`'s file `digest` as they come, if it
    /// has it; a use, which renews its time.
    pub async fn open(
        &self,
        api_key: &str,
        digest: &str,
        keep: Duration,
    ) -> Result<Option<(u64, ByteStream)>, StoreError> {
        self.backend.open(api_key, digest, keep).await
    }

    /// The bytes of `api_key`'s file `digest` as a worker reads them for a
    /// job that names it (the API renewed its time when it took the job).
    pub async fn read(&self, api_key: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.backend.read(api_key, digest).await
    }

    /// Removes `api_key`'s file `digest`; whether it had it.
    pub async fn delete(&self, api_key: &str, digest: &str) -> Result<bool, StoreError> {
        self.backend.delete(api_key, digest).await
    }

    /// Deletes the bytes of files that are gone, if the backend keeps them
    /// apart from their metadata; how many.
    pub async fn collect_garbage(&self) -> Result<usize, StoreError> {
        self.backend.collect_garbage().await
    }
}

/// `body` as the bytes of the file `digest` of at most `limit` bytes: the
/// same chunks, ending with [`StreamError::TooLarge`] as soon as more
/// came, and with [`StreamError::Digest`] instead of their end when they
/// hash to another digest; so a backend that stops at an error keeps
/// nothing that is not the file.
pub fn checked<S>(body: S, digest: &str, limit: u64) -> ByteStream
where
    S: futures_util::Stream<Item = Result<Bytes, StreamError>> + Send + 'static,
{
    struct Check {
        body: BoxStream<'static, Result<Bytes, StreamError>>,
        hasher: Sha256,
        seen: u64,
        digest: String,
        limit: u64,
        done: bool,
    }
    let check = Check {
        body: body.boxed(),
        hasher: Sha256::new(),
        seen: 0,
        digest: digest.to_string(),
        limit,
        done: false,
    };
    futures_util::stream::unfold(check, |mut check| async move {
        if check.done {
            return None;
        }
        let item = match check.body.next().await {
            Some(Ok(chunk)) => {
                check.seen += chunk.len() as u64;
                if check.seen > check.limit {
                    Err(StreamError::TooLarge { limit: check.limit })
                } else {
                    check.hasher.update(&chunk);
                    return Some((Ok(chunk), check));
                }
            }
            Some(Err(error)) => Err(error),
            None => {
                let actual = hex::encode(std::mem::take(&mut check.hasher).finalize());
                if actual == check.digest {
                    return None;
                }
                Err(StreamError::Digest { actual })
            }
        };
        check.done = true;
        Some((item, check))
    })
    .boxed()
}
