//! The proxy's limits: byte caps, connection caps, idle and stopped
//! tunnels, the wait for a turn; and the events it reports.

use super::*;

#[tokio::test]
async fn the_byte_cap_ends_a_download_flood_and_refuses_new_connections() {
    const CAP: u64 = 100_000;
    let upstream = Upstream::start(Behaviour::Flood).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_bytes = CAP;
    let mut proxy = Proxy::start(p);

    let mut client = proxy.tunnel("allowed.test", port).await;
    let got = read_to_end(&mut client).await;
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.reason.as_deref(), Some(reason::BYTE_CAP), "{event:?}");
    assert!(event.bytes_down <= CAP, "{event:?}");
    assert_eq!(event.bytes_down, got.len() as u64);
    assert_eq!(event.bytes_up, 0);

    let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
    assert!(
        answer.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::BYTE_CAP);
    let (totals, _) = proxy.stop().await;
    assert!(totals.bytes_down <= CAP);
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn the_byte_cap_ends_an_upload_flood() {
    const CAP: u64 = 50_000;
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_bytes = CAP;
    let mut proxy = Proxy::start(p);

    let mut client = proxy.tunnel("allowed.test", port).await;
    let chunk = vec![b'u'; 8192];
    let flood = tokio::time::timeout(WAIT, async {
        while client.write_all(&chunk).await.is_ok() {}
    });
    flood.await.expect("the proxy closes the flood");
    let event = proxy.next_event().await;
    assert_eq!(event.reason.as_deref(), Some(reason::BYTE_CAP), "{event:?}");
    assert!(event.bytes_up <= CAP, "{event:?}");
    drop(client);
    proxy.stop().await;
    // The upstream got what was counted, no more.
    tokio::time::timeout(WAIT, async {
        while upstream.received().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(upstream.received()[0].len() as u64, event.bytes_up);
}

#[tokio::test]
async fn the_connection_cap_answers_429() {
    let upstream = Upstream::start(Behaviour::Exchange(1, b"!")).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_connections = 2;
    let mut proxy = Proxy::start(p);

    // A refused connection counts.
    assert!(
        proxy
            .exchange(&connect_request("other.test", port))
            .await
            .starts_with("HTTP/1.1 403 ")
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);
    let mut client = proxy.tunnel("allowed.test", port).await;
    client.write_all(b"?").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "!");
    drop(client);
    assert!(proxy.next_event().await.allowed);

    for _ in 0..2 {
        let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
        assert!(
            answer.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{answer}"
        );
        refused(&proxy.next_event().await, reason::CONNECTION_CAP);
    }
    assert_eq!(upstream.accepted(), 1);
    let (totals, _) = proxy.stop().await;
    assert_eq!((totals.connections, totals.refused), (4, 3));
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.idle_timeout = Duration::from_millis(300);
    let mut proxy = Proxy::start(p);

    let mut client = proxy.tunnel("allowed.test", port).await;
    client.write_all(b"abc").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "");
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.reason.as_deref(), Some(reason::IDLE_TIMEOUT));
    assert_eq!((event.bytes_up, event.bytes_down), (3, 0));
    proxy.stop().await;
}

#[tokio::test]
async fn stop_ends_open_connections() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let mut tunnel = proxy.tunnel("allowed.test", port).await;
    // And one still sending its head.
    let mut slow = proxy.connect().await;
    slow.write_all(b"CONNECT allowed.test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let (totals, events) = proxy.stop().await;
    assert_eq!(totals.connections, 2);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() == Some(reason::STOPPED)),
        "{events:?}"
    );
    assert_eq!(read_to_end(&mut tunnel).await, "");
    assert_eq!(read_to_end(&mut slow).await, "");
}

#[tokio::test]
async fn connections_past_max_concurrent_wait_their_turn() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.max_concurrent = 1;
    let mut proxy = Proxy::start(p);

    let first = proxy.tunnel("allowed.test", port).await;

    let mut second = proxy.connect().await;
    second
        .write_all(&connect_request("allowed.test", port))
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(200), second.read(&mut byte)).await;
    assert!(
        early.is_err(),
        "the second connection was served while the first was open"
    );

    drop(first);
    assert!(proxy.next_event().await.allowed);
    assert_eq!(read_head(&mut second).await, ESTABLISHED);
    drop(second);
    assert!(proxy.next_event().await.allowed);
    assert_eq!(proxy.totals().connections, 2);
    proxy.stop().await;
}

#[test]
fn events_serialize_with_their_field_names() {
    let event = EgressEvent {
        host: "pypi.org".into(),
        port: 443,
        address: Some(ip("151.101.0.223")),
        allowed: true,
        reason: None,
        bytes_up: 1,
        bytes_down: 2,
    };
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        serde_json::json!({
            "host": "pypi.org",
            "port": 443,
            "address": "151.101.0.223",
            "allowed": true,
            "reason": null,
            "bytes_up": 1,
            "bytes_down": 2,
        })
    );
}
