use super::*;

#[test]
fn an_error_body_names_the_field() {
    let body: ErrorBody = serde_json::from_str(
        r#"{"error":{"code":"invalid_job","message":"unknown language","field":"language"}}"#,
    )
    .unwrap();
    assert_eq!(
        body.error.describe(StatusCode::BAD_REQUEST),
        "language: unknown language"
    );
    let empty = ErrorDetail::default();
    assert_eq!(
        empty.describe(StatusCode::PAYLOAD_TOO_LARGE),
        "413 Payload Too Large"
    );
}

#[test]
fn exit_codes_follow_the_kind_of_failure() {
    assert_eq!(ClientError::Unauthorized.exit_code(), exit::USAGE);
    assert_eq!(ClientError::Invalid(String::new()).exit_code(), exit::USAGE);
    let unreachable = ClientError::Unreachable {
        url: "http://127.0.0.1:1".into(),
        cause: "Connection refused (os error 111)".into(),
    };
    assert_eq!(unreachable.exit_code(), exit::UNAVAILABLE);
    assert_eq!(
        unreachable.to_string(),
        "cannot reach http://127.0.0.1:1: Connection refused (os error 111)"
    );
    assert_eq!(
        ClientError::Busy {
            message: String::new(),
            waited_secs: 30
        }
        .exit_code(),
        exit::UNAVAILABLE
    );
}
