//! What the proxy refuses, and how it answers: names and ports not allowed,
//! forbidden addresses, malformed requests, upstreams that fail.

use super::*;

#[tokio::test]
async fn hosts_and_ports_not_in_the_allowlist_are_refused() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("allowed.test:{port}")], resolver()));

    let answer = proxy.exchange(&connect_request("other.test", port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\negress: other.test is not in the job's allowlist\n"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::NOT_ALLOWED);
    assert_eq!(
        (event.host.as_str(), event.port, event.address),
        ("other.test", port, None)
    );

    let answer = proxy.exchange(&connect_request("allowed.test", 443)).await;
    assert!(
        answer.contains("egress: port 443 of allowed.test is not in the job's allowlist"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);

    // An IP literal is never an allowed host, loopback switch or not.
    let answer = proxy.exchange(&connect_request(LOCALHOST, port)).await;
    assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);
    let get = format!("GET http://[::1]:{port}/ HTTP/1.1\r\n\r\n");
    assert!(
        proxy
            .exchange(get.as_bytes())
            .await
            .starts_with("HTTP/1.1 403 ")
    );
    refused(&proxy.next_event().await, reason::NOT_ALLOWED);

    assert_eq!(upstream.accepted(), 0);
    let (totals, _) = proxy.stop().await;
    assert_eq!((totals.connections, totals.refused), (4, 4));
}

#[tokio::test]
async fn private_and_link_local_addresses_are_refused_without_connecting() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let allow = ["priv.test".to_string(), "link.test".to_string()];
    let mut proxy = Proxy::start(policy(&allow, resolver()));

    let answer = proxy.exchange(&connect_request("priv.test", 443)).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.ends_with("egress: priv.test resolves to 10.1.2.3 (private); refused\n"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!(event.address, Some(ip("10.1.2.3")));

    let get = b"GET http://link.test/latest/meta-data/ HTTP/1.1\r\nHost: link.test\r\n\r\n";
    let answer = proxy.exchange(get).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.contains("resolves to 169.254.169.254 (link-local); refused"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!((event.host.as_str(), event.port), ("link.test", 80));

    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn loopback_is_refused_without_the_test_switch() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut p = policy(&[format!("allowed.test:{port}")], resolver());
    p.allow_loopback_for_tests = false;
    let mut proxy = Proxy::start(p);

    let answer = proxy.exchange(&connect_request("allowed.test", port)).await;
    assert!(
        answer.contains("egress: allowed.test resolves to 127.0.0.1 (loopback); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn own_addresses_are_refused() {
    // A public address standing for the machine's own; never connected to.
    let mut p = policy(
        &["mine.test".to_string()],
        Resolver::fixed([("mine.test", vec![ip("8.8.4.4")])]),
    );
    p.own = vec![ip("8.8.4.4")];
    let mut proxy = Proxy::start(p);
    let answer = proxy.exchange(&connect_request("mine.test", 443)).await;
    assert!(
        answer.contains("resolves to 8.8.4.4 (own address); refused"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::FORBIDDEN_ADDRESS);
    proxy.stop().await;
}

#[tokio::test]
async fn any_forbidden_address_in_the_answer_refuses() {
    let upstream = Upstream::start(Behaviour::Sink).await;
    let port = upstream.port();
    let mut proxy = Proxy::start(policy(&[format!("mixed.test:{port}")], resolver()));
    let answer = proxy.exchange(&connect_request("mixed.test", port)).await;
    assert!(
        answer.contains("resolves to 10.0.0.1 (private); refused"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::FORBIDDEN_ADDRESS);
    assert_eq!(event.address, Some(ip("10.0.0.1")));
    assert_eq!(upstream.accepted(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn bad_requests() {
    let mut p = policy(&["allowed.test".to_string()], resolver());
    p.idle_timeout = Duration::from_millis(300);
    let mut proxy = Proxy::start(p);

    let answer = proxy
        .exchange(b"GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await;
    assert!(
        answer.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{answer}"
    );
    assert!(answer.contains("this is a proxy"), "{answer}");
    refused(&proxy.next_event().await, reason::BAD_REQUEST);

    for request in [
        &b"hello\r\n\r\n"[..],
        b"GET https://allowed.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nBad\nHeader: x\r\n\r\n",
    ] {
        let answer = proxy.exchange(request).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        let event = proxy.next_event().await;
        refused(&event, reason::BAD_REQUEST);
        assert_eq!((event.host.as_str(), event.port), ("", 0));
    }

    // A head that never ends.
    let mut big = b"GET http://allowed.test/ HTTP/1.1\r\n".to_vec();
    while big.len() <= MAX_HEAD {
        big.extend_from_slice(b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let mut client = proxy.connect().await;
    let _ = client.write_all(&big).await;
    let answer = read_to_end(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    refused(&proxy.next_event().await, reason::HEAD_TOO_LARGE);

    // A head that never comes.
    let mut client = proxy.connect().await;
    client
        .write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    let answer = read_to_end(&mut client).await;
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::HEAD_TIMEOUT);
    proxy.stop().await;
}

#[tokio::test]
async fn dns_and_connect_failures_are_502() {
    // A loopback port nobody listens on.
    let closed = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let allow = [format!("allowed.test:{closed_port}"), "gone.test".into()];
    let mut proxy = Proxy::start(policy(
        &allow,
        Resolver::Static(HashMap::from([(
            "allowed.test".to_string(),
            vec![ip(LOCALHOST)],
        )])),
    ));

    let answer = proxy.exchange(&connect_request("gone.test", 443)).await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("egress: gone.test could not be resolved"),
        "{answer}"
    );
    refused(&proxy.next_event().await, reason::DNS_FAILED);

    let answer = proxy
        .exchange(&connect_request("allowed.test", closed_port))
        .await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("egress: could not connect to allowed.test (127.0.0.1:"),
        "{answer}"
    );
    let event = proxy.next_event().await;
    refused(&event, reason::CONNECT_FAILED);
    assert_eq!(event.address, Some(ip(LOCALHOST)));
    proxy.stop().await;
}
