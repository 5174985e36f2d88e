//! The proxy relays what it allows: CONNECT tunnels, plain HTTP, one pinned
//! resolution per connection.

use super::*;

#[tokio::test]
async fn connect_relays_both_ways_with_exact_counts() {
    let upstream = Upstream::start(Behaviour::Exchange(4, b"pong!")).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let mut client = proxy.tunnel("Allowed.Test", port).await;
    client.write_all(b"ping").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "pong!");
    drop(client);

    let event = proxy.next_event().await;
    assert_eq!(
        event,
        EgressEvent {
            host: "allowed.test".into(),
            port,
            address: Some(ip(LOCALHOST)),
            allowed: true,
            reason: None,
            bytes_up: 4,
            bytes_down: 5,
        }
    );
    assert_eq!(upstream.received(), vec![b"ping".to_vec()]);

    // Bytes sent right behind the CONNECT head are relayed too.
    let mut client = proxy.connect().await;
    let mut request = connect_request("allowed.test", port);
    request.extend_from_slice(b"pi");
    client.write_all(&request).await.unwrap();
    assert_eq!(read_head(&mut client).await, ESTABLISHED);
    client.write_all(b"ng").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "pong!");
    drop(client);
    let event = proxy.next_event().await;
    assert_eq!((event.bytes_up, event.bytes_down), (4, 5));

    let (totals, rest) = proxy.stop().await;
    assert!(rest.is_empty());
    assert_eq!(
        totals,
        EgressTotals {
            bytes_up: 8,
            bytes_down: 10,
            connections: 2,
            refused: 0
        }
    );
}

#[tokio::test]
async fn plain_http_is_forwarded_in_origin_form() {
    const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
    let upstream = Upstream::start(Behaviour::Http(RESPONSE)).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let request = format!(
        "GET http://allowed.test:{port}/x?y=1 HTTP/1.1\r\n\
         Host: elsewhere.test\r\n\
         Proxy-Connection: keep-alive\r\n\
         Proxy-Authorization: Basic eDp5\r\n\
         User-Agent: test\r\n\r\n"
    );
    let answer = proxy.exchange(request.as_bytes()).await;
    assert_eq!(answer.as_bytes(), RESPONSE);

    let sent = format!(
        "GET /x?y=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nUser-Agent: test\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(upstream.received(), vec![sent.clone().into_bytes()]);
    let event = proxy.next_event().await;
    assert!(event.allowed, "{event:?}");
    assert_eq!(event.reason, None);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    assert_eq!(event.bytes_up, sent.len() as u64);
    assert_eq!(event.bytes_down, RESPONSE.len() as u64);
    proxy.stop().await;
}

#[tokio::test]
async fn the_resolver_is_consulted_once_per_connection_and_pinned() {
    let upstream = Upstream::start(Behaviour::Exchange(1, b"!")).await;
    let port = upstream.port();
    let script = Scripted::new([vec![ip(LOCALHOST)], vec![ip("10.0.0.1")]]);
    let mut proxy = Proxy::start(policy(
        &[format!("rebind.test:{port}")],
        Resolver::Scripted(script.clone()),
    ));

    // The first answer is loopback (let through here); the connection goes
    // there, and the second answer is not consulted for it.
    let mut client = proxy.tunnel("rebind.test", port).await;
    assert_eq!(script.calls(), 1);
    client.write_all(b"?").await.unwrap();
    assert_eq!(read_to_end(&mut client).await, "!");
    drop(client);
    let event = proxy.next_event().await;
    assert!(event.allowed);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    assert_eq!(script.calls(), 1);

    // The next connection resolves again, and gets the private answer.
    let answer = proxy.exchange(&connect_request("rebind.test", port)).await;
    assert!(
        answer.contains("resolves to 10.0.0.1 (private); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    assert_eq!(script.calls(), 2);
    assert_eq!(script.lookups(), vec!["rebind.test", "rebind.test"]);
    assert_eq!(upstream.accepted(), 1);
    proxy.stop().await;
}
