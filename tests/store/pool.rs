//! The store's pool of Redis connections against a real redis-server (and
//! a proxy that can cut it off): a connection used again soon is not
//! checked with a round trip first, one idle for a while is, and one whose
//! command failed for good is replaced, never handed out again. The check
//! is a pipelined UNWATCH and PING; nothing else sends UNWATCH.

use std::time::Duration;

use crate::common::proxy::RedisProxy;
use crate::common::redis_server::RedisServer;
use code_runner::store::Store;

/// One store command (a job that does not exist: `None`).
async fn one_command(store: &Store) -> Result<(), String> {
    match store.jobs().status_and_position("no-such-job").await {
        Ok(None) => Ok(()),
        Ok(Some(found)) => panic!("a job that was never submitted: {found:?}"),
        Err(error) => Err(error.to_string()),
    }
}

#[tokio::test]
async fn connections_are_checked_when_idle_and_replaced_when_broken() {
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port);
    let store = Store::new(&proxy.url(), "pool-test:", Duration::from_secs(60), 4).unwrap();
    one_command(&store).await.unwrap();
    assert_eq!(redis.cli(&["CONFIG", "RESETSTAT"]), "OK");

    // Back to back: the connection goes out again unchecked.
    for _ in 0..20 {
        one_command(&store).await.unwrap();
    }
    assert_eq!(redis.calls("hmget"), 20);
    assert_eq!(redis.calls("unwatch"), 0);
    assert_eq!(redis.calls("ping"), 0);

    // Idle for more than a second: checked once before it is used.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    one_command(&store).await.unwrap();
    assert_eq!(redis.calls("unwatch"), 1);
    assert_eq!(redis.calls("ping"), 1);

    // Cut off right after a use: the next command fails on the dead
    // connection, which then leaves the pool; once Redis is reachable
    // again the command after it gets a new connection and succeeds,
    // within the second in which an unchecked connection would be handed
    // out again.
    one_command(&store).await.unwrap();
    proxy.cut();
    // The proxy closes its connections within 20 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = one_command(&store).await;
    assert!(
        failed.is_err(),
        "a command through a cut connection: {failed:?}"
    );
    proxy.restore();
    one_command(&store).await.unwrap();
    assert_eq!(redis.calls("hmget"), 23);
}
