use super::*;

#[test]
fn refusals_are_logged_once_per_window_with_their_count() {
    let log = RefusalLog::new(Duration::from_secs(10));
    let start = Instant::now();
    assert_eq!(log.count("key_limit", start), Some(1));
    for i in 1..=5 {
        assert_eq!(log.count("key_limit", start + Duration::from_secs(i)), None);
    }
    // Another reason has a window of its own.
    assert_eq!(log.count("queue_full", start), Some(1));
    // The window's end logs the 5 held back and this one.
    assert_eq!(
        log.count("key_limit", start + Duration::from_secs(10)),
        Some(6)
    );
    assert_eq!(
        log.count("key_limit", start + Duration::from_secs(11)),
        None
    );
}

fn json_of(error: ApiError) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let body = serde_json::to_value(error.body()).unwrap();
    let response = error.into_response();
    (response.status(), response.headers().clone(), body)
}

#[test]
fn every_error_maps_to_its_status_and_code() {
    let cases: Vec<(ApiError, u16, &str)> = vec![
        (
            ApiError::MalformedBody {
                message: "x".into(),
            },
            400,
            "invalid_json",
        ),
        (
            ApiError::InvalidJob(InvalidJob::new("language", "unknown")),
            400,
            "invalid_job",
        ),
        (
            ApiError::InvalidRequest {
                field: "wait",
                message: "x".into(),
            },
            400,
            "invalid_request",
        ),
        (ApiError::Unauthorized("missing"), 401, "unauthorized"),
        (ApiError::Forbidden("other job"), 403, "forbidden"),
        (ApiError::NotFound("job not found"), 404, "not_found"),
        (ApiError::MethodNotAllowed, 405, "method_not_allowed"),
        (
            ApiError::AlreadyFinished {
                status: Status::Succeeded,
            },
            409,
            "already_finished",
        ),
        (ApiError::IdempotencyConflict, 409, "idempotency_conflict"),
        (ApiError::IdempotencyExpired, 409, "idempotency_expired"),
        (ApiError::TooLarge { limit: 10 }, 413, "too_large"),
        (
            ApiError::QueueFull { depth: 3, limit: 3 },
            429,
            "queue_full",
        ),
        (
            ApiError::KeyLimit {
                active: 2,
                limit: 2,
                from_entry: false,
            },
            429,
            "key_limit",
        ),
        (
            ApiError::UserActiveLimit {
                active: 2,
                limit: 2,
            },
            429,
            "user_active_limit",
        ),
        (
            ApiError::UserRateLimit {
                limit: 5,
                wait_secs: 3,
            },
            429,
            "user_rate_limit",
        ),
        (
            ApiError::KeyStorage {
                held: 1,
                needed: 2,
                budget: 2,
            },
            429,
            "key_storage",
        ),
        (
            ApiError::QuotaExceeded {
                quota: Quota::UserJobs,
                user: "ann".into(),
                limit: 3,
                used: 3,
                resets_ms: 86_400_000,
                retry_after_secs: 60,
            },
            429,
            "quota_exceeded",
        ),
        (
            ApiError::TooManyStreams {
                scope: "this job",
                open: 1,
                limit: 1,
                setting: "X",
            },
            429,
            "too_many_streams",
        ),
        (
            ApiError::RateLimited {
                rate: 1,
                burst: 1,
                wait_secs: 1,
            },
            429,
            "rate_limited",
        ),
        (
            ApiError::Unavailable(StoreError::Corrupt {
                id: "j".into(),
                message: "m".into(),
            }),
            503,
            "unavailable",
        ),
    ];
    for (error, status, code) in cases {
        let (got_status, _, body) = json_of(error);
        assert_eq!(got_status.as_u16(), status, "{code}");
        assert_eq!(body["error"]["code"], code);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.ends_with('.'), "{message:?} ends with a period");
        assert_eq!(
            message.chars().next().map(char::is_uppercase),
            Some(false),
            "{message:?} starts with a capital"
        );
    }
}

#[test]
fn invalid_job_names_the_field() {
    let (_, _, body) = json_of(ApiError::InvalidJob(InvalidJob::new(
        "files[0].name",
        "\"../x\" contains \"..\"",
    )));
    assert_eq!(
        body,
        serde_json::json!({"error": {
            "code": "invalid_job",
            "field": "files[0].name",
            "message": "\"../x\" contains \"..\"",
        }})
    );
}

#[test]
fn retry_after_and_www_authenticate_are_set() {
    let (_, headers, _) = json_of(ApiError::QueueFull { depth: 3, limit: 3 });
    assert_eq!(headers[header::RETRY_AFTER], "2");
    let (_, headers, _) = json_of(ApiError::KeyLimit {
        active: 2,
        limit: 2,
        from_entry: false,
    });
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (_, headers, _) = json_of(ApiError::Unauthorized("missing"));
    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    assert!(!headers.contains_key(header::RETRY_AFTER));
}

#[test]
fn a_quota_refusal_says_which_quota_what_is_used_and_when_it_resets() {
    let refusal = |quota, user: &str, used| ApiError::QuotaExceeded {
        quota,
        user: user.into(),
        limit: 60,
        used,
        resets_ms: 1_796_169_600_000,
        retry_after_secs: 50_700,
    };
    let (_, headers, body) = json_of(refusal(Quota::UserCpuSeconds, "ann", 61_234));
    assert_eq!(headers[header::RETRY_AFTER], "50700");
    assert_eq!(
        body["error"]["message"],
        "user \"ann\"'s quota of 60 cpu seconds per day (user_cpu_seconds_per_day) is used up: 61.234 s used today (UTC); it resets at 2026-12-02T00:00:00Z"
    );
    assert_eq!(
        refusal(Quota::KeyCpuSeconds, "ann", 60_000).to_string(),
        "this api key's quota of 60 cpu seconds per day (cpu_seconds_per_day) is used up: 60.000 s used today (UTC); it resets at 2026-12-02T00:00:00Z"
    );
    assert_eq!(
        refusal(Quota::UserJobs, "", 60).to_string(),
        "the key's anonymous user's quota of 60 jobs per day (user_jobs_per_day) is used up: 60 jobs submitted today (UTC); it resets at 2026-12-02T00:00:00Z"
    );
}

#[test]
fn already_finished_carries_the_status() {
    let (_, _, body) = json_of(ApiError::AlreadyFinished {
        status: Status::TimedOut,
    });
    assert_eq!(body["error"]["status"], "timed_out");
    assert_eq!(
        body["error"]["message"],
        "job already finished with status timed_out"
    );
}

#[test]
fn refusals_have_a_reason_and_only_refusals_do() {
    assert_eq!(
        ApiError::QueueFull { depth: 1, limit: 1 }.rejection_reason(),
        Some("queue_full")
    );
    assert_eq!(ApiError::NotFound("x").rejection_reason(), None);
    let unavailable = ApiError::Unavailable(StoreError::Corrupt {
        id: "j".into(),
        message: "m".into(),
    });
    assert_eq!(unavailable.rejection_reason(), Some("store_unavailable"));
    assert_eq!(unavailable.body().error.reason, Some("store_unavailable"));
    // A 400 is counted (as `invalid`) but is no 429/503: no `reason` in its body.
    let invalid = ApiError::InvalidJob(InvalidJob::new("language", "unknown"));
    assert_eq!(invalid.rejection_reason(), Some("invalid"));
    assert_eq!(invalid.body().error.reason, None);
}

#[test]
fn every_refusal_reason_is_a_preregistered_series() {
    let refusals = [
        ApiError::QueueFull { depth: 1, limit: 1 },
        ApiError::KeyLimit {
            active: 1,
            limit: 1,
            from_entry: true,
        },
        ApiError::UserActiveLimit {
            active: 1,
            limit: 1,
        },
        ApiError::UserRateLimit {
            limit: 1,
            wait_secs: 1,
        },
        ApiError::KeyStorage {
            held: 1,
            needed: 1,
            budget: 1,
        },
        ApiError::RateLimited {
            rate: 1,
            burst: 1,
            wait_secs: 1,
        },
        ApiError::QuotaExceeded {
            quota: Quota::UserJobs,
            user: String::new(),
            limit: 1,
            used: 1,
            resets_ms: 0,
            retry_after_secs: 1,
        },
        ApiError::ShuttingDown,
        ApiError::Unavailable(StoreError::Corrupt {
            id: "j".into(),
            message: "m".into(),
        }),
    ];
    for refusal in refusals {
        let reason = refusal.rejection_reason().unwrap();
        assert!(
            crate::api::REJECTION_REASONS.contains(&reason),
            "{reason} is not in REJECTION_REASONS"
        );
    }
}

#[test]
fn a_limit_refusal_names_setting_value_and_count() {
    let body = serde_json::to_value(
        ApiError::KeyStorage {
            held: 700,
            needed: 400,
            budget: 1000,
        }
        .body(),
    )
    .unwrap();
    assert_eq!(body["error"]["reason"], "key_storage");
    assert_eq!(body["error"]["retry_after_secs"], 30);
    assert_eq!(
        body["error"]["limit"]["setting"],
        "CODE_RUNNER_KEY_MAX_STORED_MB"
    );
    assert_eq!(body["error"]["limit"]["value"], 1000);
    assert_eq!(body["error"]["limit"]["counted"], 1100);
    let cpu = ApiError::QuotaExceeded {
        quota: Quota::UserCpuSeconds,
        user: "ann".into(),
        limit: 60,
        used: 61_234,
        resets_ms: 0,
        retry_after_secs: 5,
    };
    // CPU quotas are set in seconds and counted in ms: both in ms here.
    assert_eq!(
        cpu.limit(),
        Some(LimitDetail {
            setting: "user_cpu_seconds_per_day",
            unit: "cpu milliseconds used today (UTC)",
            value: 60_000,
            counted: 61_234,
        })
    );
    assert_eq!(ApiError::ShuttingDown.limit(), None);
}
