//! Doorbells: a tiny stream a process rings to wake its own blocking read
//! over many streams (one `XREAD` over every stream it follows, on one
//! dedicated connection). A process adds a stream to follow by ringing:
//! the read returns at once and is issued again with the new stream. A
//! doorbell keeps its newest few entries and expires when nobody rings.
//! Used by an API process's events reader ([`Events::read_feeds`](super::Events::read_feeds)) and a
//! worker's control reader ([`Jobs::read_controls`](super::Jobs::read_controls)).

use std::collections::HashMap;
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};

use super::StoreError;
use super::redis::Redis;

/// Doorbell entries kept (only the newest matters).
const KEPT: usize = 16;
/// A doorbell nobody rings expires after this.
const TTL_SECS: i64 = 3600;

/// What one read of a doorbell and its streams gave.
pub(super) struct Read<T> {
    /// The doorbell's last entry id, when it rang.
    pub(super) doorbell: Option<String>,
    /// The streams with new entries (never the doorbell), in the reply's
    /// order, each with what the caller named it by.
    pub(super) streams: Vec<(T, redis::streams::StreamKey)>,
}

/// Rings doorbell `key`; returns the entry's id.
pub(super) async fn ring(redis: &Redis, key: &str) -> Result<String, StoreError> {
    let mut conn = redis.conn().await?;
    let (id,): (String,) = redis::pipe()
        .xadd_maxlen(
            key,
            redis::streams::StreamMaxlen::Approx(KEPT),
            "*",
            &[("r", "1")],
        )
        .expire(key, TTL_SECS)
        .ignore()
        .query_async(&mut conn)
        .await?;
    Ok(id)
}

/// Reads, on `conn` (dedicated: this blocks), doorbell `key` after
/// `after` and every stream in `streams` (what the caller names it by, its
/// key, the last entry id read), at most `count` entries of each; waits up
/// to `block` for the first.
pub(super) async fn read<T>(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    after: &str,
    streams: impl IntoIterator<Item = (T, String, String)>,
    count: usize,
    block: Duration,
) -> Result<Read<T>, StoreError> {
    let mut keys = vec![key.to_string()];
    let mut ids = vec![after.to_string()];
    let mut names = HashMap::new();
    for (name, stream, after) in streams {
        names.insert(stream.clone(), name);
        keys.push(stream);
        ids.push(after);
    }
    let options = redis::streams::StreamReadOptions::default()
        .count(count)
        .block(block.as_millis() as usize);
    let reply: Option<redis::streams::StreamReadReply> =
        conn.xread_options(&keys, &ids, &options).await?;
    let mut read = Read {
        doorbell: None,
        streams: Vec::new(),
    };
    for stream in reply.map(|r| r.keys).unwrap_or_default() {
        if stream.key == key {
            read.doorbell = stream.ids.last().map(|entry| entry.id.clone());
        } else if let Some(name) = names.remove(&stream.key) {
            read.streams.push((name, stream));
        }
    }
    Ok(read)
}
