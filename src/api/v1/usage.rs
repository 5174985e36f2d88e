//! `GET /v1/usage?from=YYYY-MM-DD&to=YYYY-MM-DD&user=&key=`: the usage
//! ledger of the caller's key (an admin key may name any key with `key=`),
//! per UTC day and per user, and the range's total.
//!
//! `to` defaults to today (UTC), `from` to `to`. Days on which the key's
//! jobs neither were submitted nor ended are left out of `days`. `user=`
//! narrows every figure to that user (`user=` with an empty value is the
//! key's anonymous user). The range must lie within the retention
//! (`CODE_RUNNER_USAGE_RETENTION_DAYS`): `from` no earlier than today
//! minus the retention, and `to` no later than `from` plus it.

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::{Query, State};
use serde::Serialize;

use crate::api::ApiState;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::store::{Day, DayUsage, Figures, now_ms};

/// One day's figures, or the range's total.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct UsageFigures {
    #[serde(flatten)]
    pub figures: Figures,
    /// Per user (`""`: the key's anonymous user).
    pub users: BTreeMap<String, Figures>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct UsageDay {
    pub date: String,
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// The answer of `GET /v1/usage`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct UsageView {
    pub key: String,
    pub from: String,
    pub to: String,
    /// The `user=` asked for, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub days: Vec<UsageDay>,
    pub total: UsageFigures,
}

/// The query, checked: a day for each bound, naming the parameter when
/// it is wrong.
struct UsageQuery {
    key: Option<String>,
    user: Option<String>,
    from: Day,
    to: Day,
}

fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest {
        field,
        message: message.into(),
    }
}

fn parse_query(
    query: HashMap<String, String>,
    today: Day,
    earliest: Day,
) -> Result<UsageQuery, ApiError> {
    let mut names: Vec<&String> = query.keys().collect();
    names.sort();
    if let Some(unknown) = names
        .into_iter()
        .find(|n| !["from", "to", "user", "key"].contains(&n.as_str()))
    {
        return Err(invalid(
            "query",
            format!("unknown parameter {unknown:?}; the parameters are from, to, user and key"),
        ));
    }
    let day = |field: &'static str| -> Result<Option<Day>, ApiError> {
        query
            .get(field)
            .map(|text| {
                Day::parse(text).ok_or_else(|| {
                    invalid(
                        field,
                        format!("{text:?} is not a date like 2026-12-01 (YYYY-MM-DD, UTC)"),
                    )
                })
            })
            .transpose()
    };
    let to = day("to")?.unwrap_or(today);
    let from = day("from")?.unwrap_or(to);
    if from > to {
        return Err(invalid("from", format!("{from} is after to ({to})")));
    }
    let retention = today.days() - earliest.days();
    if from < earliest {
        return Err(invalid(
            "from",
            format!(
                "{from} is older than the usage kept: {retention} days (CODE_RUNNER_USAGE_RETENTION_DAYS), from {earliest}"
            ),
        ));
    }
    if to.days() - from.days() > retention {
        return Err(invalid(
            "to",
            format!(
                "the range from {from} to {to} is longer than the usage kept: {retention} days (CODE_RUNNER_USAGE_RETENTION_DAYS)"
            ),
        ));
    }
    let user = query.get("user").cloned();
    if let Some(user) = user.as_deref().filter(|u| !u.is_empty()) {
        crate::job::check_user(user).map_err(|message| invalid("user", message))?;
    }
    let key = query.get("key").cloned();
    if let Some(key) = &key
        && !(1..=64).contains(&key.len())
    {
        return Err(invalid("key", "is not an api key name"));
    }
    Ok(UsageQuery {
        key,
        user,
        from,
        to,
    })
}

/// The ledger's days as the API shows them, narrowed to `user` when given
/// (days where that user has nothing are left out), with their total.
fn view(key: String, from: Day, to: Day, user: Option<String>, ledger: Vec<DayUsage>) -> UsageView {
    let mut total = UsageFigures {
        figures: Figures::default(),
        users: BTreeMap::new(),
    };
    let mut days = Vec::with_capacity(ledger.len());
    for day in ledger {
        let (figures, users) = match &user {
            None => (day.total, day.users),
            Some(user) => match day.users.get(user) {
                Some(figures) if !figures.is_zero() => {
                    (*figures, BTreeMap::from([(user.clone(), *figures)]))
                }
                _ => continue,
            },
        };
        total.figures.add(&figures);
        for (name, figures) in &users {
            total.users.entry(name.clone()).or_default().add(figures);
        }
        days.push(UsageDay {
            date: day.day.to_string(),
            usage: UsageFigures { figures, users },
        });
    }
    UsageView {
        key,
        from: from.to_string(),
        to: to.to_string(),
        user,
        days,
        total,
    }
}

/// `GET /v1/usage`.
pub(crate) async fn show(
    State(state): State<ApiState>,
    caller: Caller,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageView>, ApiError> {
    let Query(query) = query.map_err(|e| invalid("query", e.body_text().to_lowercase()))?;
    let usage = state.inner.store.usage();
    let today = Day::from_ms(now_ms());
    let query = parse_query(query, today, usage.earliest(today))?;
    let key = match query.key {
        Some(key) if key != caller.name => {
            caller.require_admin()?;
            key
        }
        _ => caller.name.clone(),
    };
    let ledger = usage.days(&key, query.from, query.to).await?;
    Ok(Json(view(key, query.from, query.to, query.user, ledger)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn day(text: &str) -> Day {
        Day::parse(text).unwrap()
    }

    fn refused(pairs: &[(&str, &str)]) -> (&'static str, String) {
        let today = day("2026-12-10");
        match parse_query(query(pairs), today, today.plus(-90)) {
            Err(ApiError::InvalidRequest { field, message }) => (field, message),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("{pairs:?} was accepted"),
        }
    }

    #[test]
    fn the_range_defaults_to_today_and_stays_within_the_retention() {
        let today = day("2026-12-10");
        let parsed = parse_query(query(&[]), today, today.plus(-90)).unwrap();
        assert_eq!((parsed.from, parsed.to), (today, today));
        let parsed = parse_query(query(&[("to", "2026-12-03")]), today, today.plus(-90)).unwrap();
        assert_eq!(
            (parsed.from, parsed.to),
            (day("2026-12-03"), day("2026-12-03"))
        );
        let widest = [("from", "2026-09-11"), ("to", "2026-12-10")];
        assert!(parse_query(query(&widest), today, today.plus(-90)).is_ok());
        assert_eq!(
            refused(&[("from", "2026-09-10")]),
            (
                "from",
                "2026-09-10 is older than the usage kept: 90 days (CODE_RUNNER_USAGE_RETENTION_DAYS), from 2026-09-11".into()
            )
        );
        assert_eq!(
            refused(&[("from", "2026-12-01"), ("to", "2027-03-02")]),
            (
                "to",
                "the range from 2026-12-01 to 2027-03-02 is longer than the usage kept: 90 days (CODE_RUNNER_USAGE_RETENTION_DAYS)".into()
            )
        );
        assert_eq!(
            refused(&[("from", "2026-12-05"), ("to", "2026-12-04")]),
            ("from", "2026-12-05 is after to (2026-12-04)".into())
        );
        assert_eq!(
            refused(&[("to", "2026-02-30")]),
            (
                "to",
                "\"2026-02-30\" is not a date like 2026-12-01 (YYYY-MM-DD, UTC)".into()
            )
        );
        assert_eq!(refused(&[("since", "x")]).0, "query");
        assert_eq!(refused(&[("user", "a\nb")]).0, "user");
    }

    #[test]
    fn a_user_narrows_every_figure_and_the_total_sums_the_days() {
        let figures = |jobs, cpu_ms| Figures {
            jobs,
            cpu_ms,
            ..Figures::default()
        };
        let ledger = vec![
            DayUsage {
                day: day("2026-12-01"),
                total: figures(3, 30),
                users: BTreeMap::from([
                    ("ann".to_string(), figures(2, 20)),
                    (String::new(), figures(1, 10)),
                ]),
            },
            DayUsage {
                day: day("2026-12-02"),
                total: figures(1, 5),
                users: BTreeMap::from([(String::new(), figures(1, 5))]),
            },
        ];
        let all = view(
            "k".into(),
            day("2026-12-01"),
            day("2026-12-02"),
            None,
            ledger.clone(),
        );
        assert_eq!(all.total.figures, figures(4, 35));
        assert_eq!(all.total.users[""], figures(2, 15));
        assert_eq!(all.days.len(), 2);
        let ann = view(
            "k".into(),
            day("2026-12-01"),
            day("2026-12-02"),
            Some("ann".into()),
            ledger,
        );
        assert_eq!(ann.days.len(), 1);
        assert_eq!(ann.days[0].usage.figures, figures(2, 20));
        assert_eq!(ann.total.figures, figures(2, 20));
        let json = serde_json::to_value(&ann).unwrap();
        assert_eq!(
            json["days"][0],
            serde_json::json!({"date": "2026-12-01", "jobs": 2, "cpu_ms": 20, "wall_ms": 0,
                "output_bytes": 0, "submitted": 0,
                "users": {"ann": {"jobs": 2, "cpu_ms": 20, "wall_ms": 0, "output_bytes": 0, "submitted": 0}}})
        );
        assert_eq!(json["user"], "ann");
    }
}
