use axum::http::HeaderValue;

use super::place::queued_event;
use super::sse::event_type;
use super::ws::{ClientFrame, subprotocol_token};
use super::*;
use crate::follow::places::Place;
use crate::job::Encoding;
use crate::protocol::SignalKind;

#[test]
fn after_is_a_seq() {
    assert_eq!(parse_after(None, "after").unwrap(), 0);
    assert_eq!(parse_after(Some(""), "after").unwrap(), 0);
    assert_eq!(parse_after(Some(" 12 "), "after").unwrap(), 12);
    for bad in ["-1", "x", "1.5"] {
        assert!(matches!(
            parse_after(Some(bad), "after"),
            Err(ApiError::InvalidRequest { field: "after", .. })
        ));
    }
}

#[test]
fn the_token_subprotocol_is_found() {
    let mut headers = HeaderMap::new();
    assert_eq!(subprotocol_token(&headers), None);
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static("code-runner, token.j.1.abc"),
    );
    assert_eq!(subprotocol_token(&headers).as_deref(), Some("j.1.abc"));
}

#[test]
fn event_types() {
    assert_eq!(
        event_type(r#"{"type":"exit","status":"succeeded"}"#),
        "exit"
    );
    assert_eq!(event_type(r#"{"type":"a\nb"}"#), "message");
    assert_eq!(event_type("nope"), "message");
}

#[test]
fn client_frames() {
    let frame: ClientFrame = serde_json::from_str(r#"{"type":"stdin","data":"x"}"#).unwrap();
    assert!(matches!(
        frame,
        ClientFrame::Stdin {
            encoding: Encoding::Utf8,
            ..
        }
    ));
    let frame: ClientFrame =
        serde_json::from_str(r#"{"type":"signal","signal":"interrupt"}"#).unwrap();
    assert!(matches!(
        frame,
        ClientFrame::Signal {
            signal: SignalKind::Interrupt
        }
    ));
    assert!(serde_json::from_str::<ClientFrame>(r#"{"type":"nope"}"#).is_err());
}

#[test]
fn the_event_is_queued_with_position_and_eta() {
    let event: serde_json::Value = serde_json::from_str(&queued_event(Place {
        position: 2,
        eta_ms: None,
    }))
    .unwrap();
    assert_eq!(
        event,
        serde_json::json!({"type": "queued", "position": 2, "eta_ms": null})
    );
}
