//! Fair turns, against a real redis-server through the
//! store's own steps: claims take turns across API keys (a key's weight is
//! its claims in a row per round) and, within a key, across its users;
//! FIFO only within one user. The order of claims is asserted, not any
//! timing. Also: a worker killed before, between and after the two halves
//! of a claim loses nothing and runs nothing twice; a cancelled queued job
//! takes its turn with it; a claim costs the same two round trips with
//! 1000 tenants waiting as with one.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::redis_server::RedisServer;
use code_runner::job::{JobResult, JobSpec, Status};
use code_runner::store::{
    Admission, CancelOutcome, ClaimOutcome, LostResults, NewJob, Quotas, ReapOutcome, ReapPolicy,
    Retry, Store, SubmitOutcome, TURN,
};
use redis::AsyncCommands;

fn store(redis: &RedisServer) -> Store {
    Store::new(&redis.url(), "", Duration::from_secs(3600), 8).expect("valid settings")
}

fn spec() -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "language": "python",
        "files": [{"name": "main.py", "content": "print(1)\n"}],
    }))
    .expect("a valid spec")
}

fn admission(weight: u32) -> Admission {
    Admission {
        max_queue_depth: 100_000,
        key_limit: None,
        max_attempts: 1,
        output_limit_bytes: 0,
        storage_budget: 1 << 40,
        wall_budget_ms: 1000,
        weight,
        user_limit: None,
        user_rate_per_minute: None,
        quotas: Quotas::default(),
    }
}

/// Submits a job named `name` (its id) for `key`'s `user`.
async fn submit(store: &Store, key: &str, user: &str, weight: u32, name: &str) {
    let spec = spec();
    let outcome = store
        .jobs()
        .submit(NewJob {
            id: name,
            spec: &spec,
            api_key: key,
            user,
            language: "python",
            idempotency: None,
            admission: admission(weight),
        })
        .await
        .expect("redis answers");
    assert_eq!(outcome, SubmitOutcome::Accepted, "{name}");
}

/// Claims until nothing is queued; the ids in claim order.
async fn claim_all(store: &Store, worker: &str) -> Vec<String> {
    let mut conn = store.dedicated().await.unwrap();
    let mut order = Vec::new();
    while store.jobs().queue_depth().await.unwrap() > 0 {
        if let Some(id) = store.jobs().claim(&mut conn, worker).await.unwrap() {
            order.push(id);
        }
        assert!(order.len() <= 10_000, "claims never end");
    }
    order
}

#[tokio::test]
async fn keys_take_turns_and_each_users_jobs_go_oldest_first() {
    let redis = RedisServer::start();
    let store = store(&redis);
    // Key a floods first; key b comes later with two jobs.
    for n in 1..=6 {
        submit(&store, "a", "", 1, &format!("a{n}")).await;
    }
    submit(&store, "b", "", 1, "b1").await;
    submit(&store, "b", "", 1, "b2").await;
    assert_eq!(store.jobs().queue_depth().await.unwrap(), 8);
    assert_eq!(store.jobs().tenants_waiting().await.unwrap(), 2);
    assert_eq!(
        claim_all(&store, "w1").await,
        ["a1", "b1", "a2", "b2", "a3", "a4", "a5", "a6"]
    );
    assert_eq!(store.jobs().tenants_waiting().await.unwrap(), 0);
    assert!(store.jobs().queued_ids().await.unwrap().is_empty());
}

#[tokio::test]
async fn users_of_one_key_take_turns() {
    let redis = RedisServer::start();
    let store = store(&redis);
    for n in 1..=5 {
        submit(&store, "school", "teacher", 1, &format!("t{n}")).await;
    }
    submit(&store, "school", "student-1", 1, "s1").await;
    submit(&store, "school", "", 1, "anon1").await;
    submit(&store, "school", "student-1", 1, "s2").await;
    let waiting = store.jobs().waiting_tenants(100).await.unwrap();
    assert_eq!(
        waiting,
        [
            ("school".to_string(), "teacher".to_string(), 5),
            ("school".to_string(), "student-1".to_string(), 2),
            ("school".to_string(), String::new(), 1),
        ]
    );
    assert_eq!(
        claim_all(&store, "w1").await,
        ["t1", "s1", "anon1", "t2", "s2", "t3", "t4", "t5"]
    );
}

#[tokio::test]
async fn a_keys_weight_is_its_claims_in_a_row() {
    let redis = RedisServer::start();
    let store = store(&redis);
    for n in 1..=6 {
        submit(&store, "big", "", 3, &format!("big{n}")).await;
    }
    for n in 1..=3 {
        submit(&store, "small", "", 1, &format!("small{n}")).await;
    }
    assert_eq!(
        claim_all(&store, "w1").await,
        [
            "big1", "big2", "big3", "small1", "big4", "big5", "big6", "small2", "small3"
        ]
    );
}

#[tokio::test]
async fn a_late_comer_waits_at_most_one_turn_of_each_other_key() {
    let redis = RedisServer::start();
    let store = store(&redis);
    for n in 1..=120 {
        submit(&store, "a", "teacher", 1, &format!("a{n}")).await;
    }
    let mut conn = store.dedicated().await.unwrap();
    // Two claims of the flood, then key b and a second user of key a come.
    for expected in ["a1", "a2"] {
        let claimed = store.jobs().claim(&mut conn, "w1").await.unwrap();
        assert_eq!(claimed.as_deref(), Some(expected));
    }
    submit(&store, "b", "", 1, "b1").await;
    submit(&store, "a", "student", 1, "student1").await;
    // Key a's next claim was already its turn; then b, then a's users in
    // turn: the late comers wait one claim each, not 118.
    let next: Vec<String> = claim_all(&store, "w1").await.into_iter().take(5).collect();
    assert_eq!(next, ["a3", "b1", "student1", "a4", "a5"]);
}

/// What a reaper does with a dead worker's list.
async fn reap_all(store: &Store, worker: &str) -> Vec<ReapOutcome> {
    let mut outcomes = Vec::new();
    for id in store.jobs().held_by(worker).await.unwrap() {
        let results = LostResults::new(worker, "python", "3", 3);
        let policy = ReapPolicy {
            max_requeues: 3,
            retry: Retry::Never,
            late_window: Duration::from_secs(60),
            own: false,
        };
        outcomes.push(
            store
                .jobs()
                .reap(worker, &id, policy, &results)
                .await
                .unwrap(),
        );
    }
    outcomes
}

#[tokio::test]
async fn a_worker_killed_at_any_step_of_a_claim_loses_nothing_and_runs_nothing_twice() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let mut conn = redis.conn().await;
    for (key, user, name) in [
        ("a", "u1", "a-u1-1"),
        ("a", "u2", "a-u2-1"),
        ("b", "", "b-1"),
        ("a", "u1", "a-u1-2"),
    ] {
        submit(&store, key, user, 1, name).await;
    }
    let queue = store.keys().queue();

    // Killed before the claim: nothing moved.
    assert!(
        store
            .jobs()
            .held_by("dead-before")
            .await
            .unwrap()
            .is_empty()
    );

    // Killed between the halves: its BLMOVE moved a turn, no job.
    let moved: Option<String> = conn
        .lmove(
            &queue,
            store.keys().processing("dead-between"),
            redis::Direction::Right,
            redis::Direction::Left,
        )
        .await
        .unwrap();
    assert_eq!(moved.as_deref(), Some(TURN));
    assert_eq!(store.jobs().queue_depth().await.unwrap(), 3);
    assert_eq!(
        reap_all(&store, "dead-between").await,
        [ReapOutcome::TurnReturned]
    );
    assert_eq!(store.jobs().queue_depth().await.unwrap(), 4);

    // Killed after the script (inside it nothing stops halfway: it is one
    // atomic step): the job is in its list, and goes back to the front.
    let _: Option<String> = conn
        .lmove(
            &queue,
            store.keys().processing("dead-after"),
            redis::Direction::Right,
            redis::Direction::Left,
        )
        .await
        .unwrap();
    assert_eq!(
        store.jobs().take_turn("dead-after").await.unwrap(),
        ClaimOutcome::Claimed("a-u1-1".into())
    );
    assert_eq!(
        store.jobs().claimed_by("dead-after").await.unwrap(),
        ["a-u1-1"]
    );
    assert_eq!(
        reap_all(&store, "dead-after").await,
        [ReapOutcome::Requeued { requeues: 1 }]
    );

    // A live worker claims everything: each job once; the requeued one is
    // its user's next job again.
    let order = claim_all(&store, "alive").await;
    let position = |id: &str| order.iter().position(|o| o == id).unwrap();
    assert!(position("a-u1-1") < position("a-u1-2"), "{order:?}");
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    for id in &order {
        *counted.entry(id.clone()).or_default() += 1;
    }
    assert_eq!(
        counted,
        BTreeMap::from([
            ("a-u1-1".to_string(), 1),
            ("a-u1-2".to_string(), 1),
            ("a-u2-1".to_string(), 1),
            ("b-1".to_string(), 1),
        ])
    );
    let turns: u64 = conn.llen(&queue).await.unwrap();
    assert_eq!(turns, 0);
    assert!(store.jobs().queued_ids().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_cancelled_queued_job_takes_its_turn_and_a_turn_on_its_way_is_spare() {
    let redis = RedisServer::start();
    let store = store(&redis);
    let mut conn = redis.conn().await;
    submit(&store, "a", "u1", 1, "first").await;
    submit(&store, "a", "u1", 1, "second").await;
    let cancelled = JobResult::without_stages(Status::Cancelled, "python", "3");
    assert_eq!(
        store.jobs().cancel("second", &cancelled).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(store.jobs().queue_depth().await.unwrap(), 1);
    assert_eq!(store.jobs().queued_ids().await.unwrap(), ["first"]);

    // A worker moved the last turn; the job is cancelled before its
    // script runs: the cancel finds no turn to take, the claim no job.
    let _: Option<String> = conn
        .lmove(
            store.keys().queue(),
            store.keys().processing("w1"),
            redis::Direction::Right,
            redis::Direction::Left,
        )
        .await
        .unwrap();
    assert_eq!(
        store.jobs().cancel("first", &cancelled).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        store.jobs().take_turn("w1").await.unwrap(),
        ClaimOutcome::Spare
    );
    assert!(store.jobs().held_by("w1").await.unwrap().is_empty());
    assert_eq!(store.jobs().queue_depth().await.unwrap(), 0);
    assert_eq!(store.jobs().tenants_waiting().await.unwrap(), 0);
    let user_active: BTreeMap<String, String> =
        conn.hgetall(store.keys().user_active("a")).await.unwrap();
    assert!(user_active.is_empty(), "{user_active:?}");
}

/// What one claim cost: (the id, round trips, commands run inside the
/// script). Round trips are the commands a client sends (BLMOVE, EVALSHA);
/// Redis counts the script's own commands in the same statistics.
async fn claim_cost(redis: &RedisServer, store: &Store) -> (String, u64, u64) {
    let sent = |redis: &RedisServer| {
        ["blmove", "evalsha", "eval", "script|load"]
            .iter()
            .map(|c| redis.calls(c))
            .sum::<u64>()
    };
    let all = |redis: &RedisServer| {
        redis
            .cli(&["INFO", "commandstats"])
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>()
    };
    let mut conn = store.dedicated().await.unwrap();
    // The script is loaded once per process: a first call loads it.
    let _ = store.jobs().take_turn("nobody").await.unwrap();
    let (sent_before, all_before) = (sent(redis), all(redis));
    let id = store.jobs().claim(&mut conn, "w1").await.unwrap().unwrap();
    let trips = sent(redis) - sent_before;
    (id, trips, all(redis) - all_before - trips)
}

#[tokio::test]
async fn a_claim_costs_two_round_trips_with_one_tenant_or_a_thousand() {
    let one = RedisServer::start();
    let store_one = store(&one);
    submit(&store_one, "a", "", 1, "only").await;
    let (id, trips_one, inside_one) = claim_cost(&one, &store_one).await;
    assert_eq!(id, "only");

    let many = RedisServer::start();
    let store_many = store(&many);
    for n in 0..1000 {
        submit(
            &store_many,
            &format!("key{}", n % 100),
            &format!("u{n}"),
            1,
            &format!("j{n}"),
        )
        .await;
    }
    assert_eq!(store_many.jobs().tenants_waiting().await.unwrap(), 100);
    assert_eq!(
        store_many.jobs().waiting_tenants(2000).await.unwrap().len(),
        1000
    );
    let (id, trips_many, inside_many) = claim_cost(&many, &store_many).await;
    assert_eq!(id, "j0");
    assert_eq!(
        (trips_one, trips_many),
        (2, 2),
        "BLMOVE and the claim script"
    );
    assert_eq!(many.calls("blmove"), 1);
    // The script's own work is bounded too: no command walks the tenants.
    assert!(
        inside_one <= 16 && inside_many <= 16,
        "{inside_one} {inside_many}"
    );
    println!(
        "a claim: {trips_one} round trips and {inside_one} commands inside the script with 1 tenant; {trips_many} and {inside_many} with 1000 waiting (100 keys of 10 users)"
    );
}

/// The places of `ids` (queued ones only), as id → place.
async fn places(store: &Store, ids: &[String]) -> BTreeMap<String, u64> {
    let read = store.jobs().places(ids).await.unwrap();
    assert_eq!(read.places.len(), ids.len());
    ids.iter()
        .zip(read.places)
        .filter_map(|(id, place)| Some((id.clone(), place?)))
        .collect()
}

/// Asserts that the places of the queued jobs are 0, 1, … n-1 (each a
/// different number of claims before it) and returns them.
async fn exact_places(store: &Store, ids: &[String]) -> BTreeMap<String, u64> {
    let places = places(store, ids).await;
    let depth = store.jobs().queue_depth().await.unwrap();
    let mut numbers: Vec<u64> = places.values().copied().collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..depth).collect::<Vec<_>>(), "{places:?}");
    places
}

#[tokio::test]
async fn a_queued_jobs_place_is_the_claims_before_it_and_falls_by_one_per_claim() {
    let redis = RedisServer::start();
    let store = store(&redis);
    // Three keys of weights 1, 2 and 3, several users each, submitted
    // interleaved; a fourth key and more users join halfway.
    let mut ids = Vec::new();
    for n in 0..12 {
        for (key, weight, users) in [("a", 1, 1), ("b", 2, 3), ("c", 3, 2)] {
            if key == "a" && n > 6 {
                continue;
            }
            let id = format!("{key}-{n}");
            submit(&store, key, &format!("u{}", n % users), weight, &id).await;
            ids.push(id);
        }
    }
    let mut conn = store.dedicated().await.unwrap();
    let mut claimed = 0;
    let mut before = exact_places(&store, &ids).await;
    while !before.is_empty() {
        let next = before
            .iter()
            .find(|(_, place)| **place == 0)
            .unwrap()
            .0
            .clone();
        let id = store.jobs().claim(&mut conn, "w1").await.unwrap().unwrap();
        assert_eq!(id, next, "the job at place 0 is claimed next");
        claimed += 1;
        let after = exact_places(&store, &ids).await;
        for (id, place) in &after {
            assert_eq!(before[id], place + 1, "{id} moved up by one");
        }
        before = after;
        if claimed == 10 {
            // Mid-round (the front key has used part of its turns): new
            // users and a new key; the places are exact again.
            for (key, user, weight) in [("b", "late", 2), ("d", "", 1), ("c", "u0", 3)] {
                let id = format!("{key}-{user}-late");
                submit(&store, key, user, weight, &id).await;
                ids.push(id);
            }
            before = exact_places(&store, &ids).await;
        }
    }
    assert_eq!(claimed, ids.len());
    // Claimed (and unknown) jobs have no place.
    let read = store
        .jobs()
        .places(&[ids[0].clone(), "no-such-job".to_string()])
        .await
        .unwrap();
    assert_eq!(read.places, [None, None]);
    assert_eq!(read.claims, ids.len() as u64, "every claim is counted");
}
