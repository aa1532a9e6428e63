use super::*;
use crate::AdaptiveLimits;
use std::time::Duration;

fn gate(c: u32, q: u32, wq_ms: u64) -> Arc<Admission> {
    Admission::new(Limits {
        concurrency: c,
        queue: q,
        queue_wait: Duration::from_millis(wq_ms),
    })
}

fn anon() -> Claim {
    Claim::anonymous()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

#[tokio::test(start_paused = true)]
async fn admits_c_queues_q_rejects_the_rest_at_once() {
    let a = gate(2, 1, 1000);
    let p1 = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let _p2 = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { a2.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    assert_eq!((a.in_flight(), a.queued()), (2, 1));
    let t = Instant::now();
    let err = a.acquire(Priority::Standard, far(), &anon()).await.unwrap_err();
    assert!(matches!(err, Rejection::QueueFull { .. }));
    assert_eq!(t.elapsed(), Duration::ZERO, "rejected without waiting");
    tokio::time::advance(Duration::from_millis(300)).await;
    drop(p1);
    let p3 = waiter.await.unwrap().unwrap();
    assert_eq!(p3.queue_wait, Duration::from_millis(300));
    assert_eq!(
        (a.in_flight(), a.queued()),
        (2, 0),
        "the slot passed on, not freed"
    );
}

#[tokio::test(start_paused = true)]
async fn nobody_waits_longer_than_wq_or_their_deadline() {
    let a = gate(1, 4, 500);
    let _p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let t = Instant::now();
    let err = a.acquire(Priority::Standard, far(), &anon()).await.unwrap_err();
    match err {
        Rejection::QueueTimeout { waited, retry_after } => {
            assert_eq!(waited, Duration::from_millis(500));
            assert!(
                (1..=2).contains(&retry_after.as_secs()),
                "Wq (no history) spread: {retry_after:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.elapsed(), Duration::from_millis(500));
    let t = Instant::now();
    let err = a
        .acquire(Priority::Standard, t + Duration::from_millis(120), &anon())
        .await
        .unwrap_err();
    assert!(matches!(err, Rejection::QueueTimeout { .. }));
    assert_eq!(
        t.elapsed(),
        Duration::from_millis(120),
        "the request's own deadline is shorter"
    );
    assert_eq!(a.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn critical_goes_first_then_fifo_and_sheddable_never_waits() {
    let a = gate(1, 8, 10_000);
    let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    assert!(matches!(
        a.acquire(Priority::Sheddable, far(), &anon()).await,
        Err(Rejection::Shed { .. })
    ));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, prio) in [
        ("s1", Priority::Standard),
        ("s2", Priority::Standard),
        ("c1", Priority::Critical),
    ] {
        let (a, order) = (a.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = a.acquire(prio, far(), &anon()).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        }));
        tokio::task::yield_now().await;
    }
    drop(p);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec!["c1", "s1", "s2"]);
    assert_eq!(a.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_the_queue_frees_its_place() {
    let a = gate(1, 1, 10_000);
    let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { a2.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    assert_eq!(a.queued(), 1);
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(a.queued(), 0, "the place is free at once");
    let a3 = a.clone();
    let next = tokio::spawn(async move { a3.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    drop(p);
    let granted = next.await.unwrap().unwrap();
    assert_eq!(a.in_flight(), 1);
    drop(granted);
    assert_eq!(a.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn predicted_wait_beyond_the_budget_is_rejected_at_arrival() {
    // One slot that drains 10 requests per second.
    let a = gate(1, 100, 1000);
    for _ in 0..20 {
        let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(p);
    }
    let _busy = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..9 {
        let a = a.clone();
        waiting.push(tokio::spawn(async move {
            a.acquire(Priority::Standard, far(), &anon()).await
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(a.queued(), 9);
    // Tenth in line: 1 s at 10/s is within Wq = 1 s; the eleventh would need 1.1 s.
    let a10 = a.clone();
    let tenth = tokio::spawn(async move { a10.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    assert_eq!(a.queued(), 10);
    let t = Instant::now();
    match a.acquire(Priority::Standard, far(), &anon()).await {
        Err(Rejection::PredictedWait {
            predicted,
            retry_after,
        }) => {
            assert!(predicted > Duration::from_millis(1000), "{predicted:?}");
            assert!(
                (2..=3).contains(&retry_after.as_secs()),
                "11 ahead at 10/s, rounded up and spread: {retry_after:?}"
            );
        }
        other => panic!("expected a predicted-wait rejection, got {other:?}"),
    }
    assert_eq!(t.elapsed(), Duration::ZERO);
    // A deadline shorter than the predicted wait is rejected at arrival too.
    match a
        .acquire(
            Priority::Critical,
            Instant::now() + Duration::from_millis(50),
            &anon(),
        )
        .await
    {
        Err(Rejection::PredictedWait { .. }) => {}
        other => panic!("expected a predicted-wait rejection, got {other:?}"),
    }
    tenth.abort();
    for w in waiting {
        w.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_follows_the_drain_rate() {
    let a = gate(2, 0, 1000);
    let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let _q = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    match a.acquire(Priority::Standard, far(), &anon()).await {
        Err(Rejection::QueueFull { retry_after }) => assert!(
            (1..=2).contains(&retry_after.as_secs()),
            "no history: Wq, spread: {retry_after:?}"
        ),
        other => panic!("{other:?}"),
    }
    drop(p);
    // Two per second through the window.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_millis(500)).await;
        let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
        drop(p);
    }
    let _p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    match a.acquire(Priority::Standard, far(), &anon()).await {
        Err(Rejection::QueueFull { retry_after }) => assert!(
            (1..=2).contains(&retry_after.as_secs()),
            "one ahead at 2/s, one refusal before: {retry_after:?}"
        ),
        other => panic!("{other:?}"),
    }
}

/// A passing refusal is told the queue's drain time; one in an overload that goes on is told
/// more, the harder and the longer it goes on, and never more than a minute.
#[test]
fn the_advised_wait_grows_with_the_excess_refused() {
    let wq = Duration::from_secs(2);
    assert_eq!(retry_after_secs(3, 0.0, None, wq), 2.0, "no drain rate: Wq");
    assert_eq!(retry_after_secs(3, 0.0, Some(10.0), wq), 0.4);
    assert_eq!(retry_after_secs(3, 16.0, Some(10.0), wq), 2.0);
    assert_eq!(retry_after_secs(3, 1e6, Some(10.0), wq), 60.0);
    assert_eq!(spread(0.4), (1, 2), "at least two whole seconds to draw from");
    assert_eq!(spread(2.0), (2, 3));
    assert_eq!(spread(6.2), (7, 10), "up to half as long again");
    assert_eq!(spread(60.0), (60, 60));
}

/// Under a sustained overload (arrivals twice what drains, for 10 s) the advice grows from a
/// second or two to about 6 s, and is spread over several whole seconds so that the clients
/// refused in one second do not all return in one; once the refusals stop it fades back.
#[tokio::test(start_paused = true)]
async fn retry_after_spreads_a_sustained_overload() {
    // Two slots each held 200 ms: 10 slots a second drain, and 10 more a second are refused.
    let a = gate(2, 0, 1000);
    let mut held = VecDeque::new();
    for _ in 0..2 {
        held.push_back(a.acquire(Priority::Standard, far(), &anon()).await.unwrap());
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let mut advised: Vec<(f64, u64)> = Vec::new();
    let start = Instant::now();
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(held.pop_front());
        held.push_back(a.acquire(Priority::Standard, far(), &anon()).await.unwrap());
        match a.acquire(Priority::Standard, far(), &anon()).await {
            Err(Rejection::QueueFull { retry_after }) => {
                advised.push((start.elapsed().as_secs_f64(), retry_after.as_secs()))
            }
            other => panic!("{other:?}"),
        }
    }
    let second = |from: f64| -> Vec<u64> {
        advised
            .iter()
            .filter(|(t, _)| (from..from + 1.0).contains(t))
            .map(|(_, s)| *s)
            .collect()
    };
    let (first, last) = (second(0.0), second(9.0));
    assert!(first.iter().all(|s| (1..=3).contains(s)), "{first:?}");
    // After 10 s the ~63 refused lately take 6.3 s to drain: drawn from 7 to 10 s.
    assert!(last.iter().all(|s| (6..=10).contains(s)), "{last:?}");
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
    assert!(mean(&last) > 2.0 * mean(&first), "{first:?} then {last:?}");
    let distinct: std::collections::BTreeSet<u64> = advised[50..].iter().map(|(_, s)| *s).collect();
    assert!(distinct.len() >= 3, "spread over whole seconds: {distinct:?}");
    // A quiet minute later the overload is forgotten: the queue's drain time again.
    held.clear();
    tokio::time::advance(Duration::from_secs(60)).await;
    for _ in 0..2 {
        held.push_back(a.acquire(Priority::Standard, far(), &anon()).await.unwrap());
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    for _ in 0..10 {
        drop(held.pop_front());
        held.push_back(a.acquire(Priority::Standard, far(), &anon()).await.unwrap());
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    match a.acquire(Priority::Standard, far(), &anon()).await {
        Err(Rejection::QueueFull { retry_after }) => {
            assert!((1..=2).contains(&retry_after.as_secs()), "{retry_after:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn raising_c_admits_waiters_and_lowering_it_lets_in_flight_finish() {
    let a = gate(1, 4, 10_000);
    let p1 = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let a2 = a.clone();
    let waiter = tokio::spawn(async move { a2.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    assert_eq!(a.queued(), 1);
    a.set_limits(Limits {
        concurrency: 2,
        queue: 4,
        queue_wait: Duration::from_secs(10),
    });
    let p2 = waiter.await.unwrap().unwrap();
    assert_eq!(
        (a.in_flight(), a.queued()),
        (2, 0),
        "the new slot went to the waiter"
    );
    a.set_limits(Limits {
        concurrency: 1,
        queue: 4,
        queue_wait: Duration::from_secs(10),
    });
    assert_eq!(a.in_flight(), 2, "requests in flight keep their slots");
    drop(p1);
    let a3 = a.clone();
    let next = tokio::spawn(async move { a3.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    assert_eq!(a.queued(), 1, "still one in flight = the new C: the next waits");
    drop(p2);
    assert!(next.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn adaptive_c_falls_over_the_objective_and_rises_under_it_when_reached() {
    let a = gate(16, 0, 1000);
    a.set_adaptive(Some(AdaptiveLimits {
        min: 2,
        max: 32,
        slo: Duration::from_millis(100),
    }));
    // One controller interval: `batches` waves of up to `width` concurrent requests, each taking
    // `ttft_ms` to its first token; then the controller steps.
    let round = |ttft_ms: u64, width: usize, batches: usize| {
        let a = a.clone();
        async move {
            for _ in 0..batches {
                let mut permits = Vec::new();
                for _ in 0..width {
                    match a.acquire(Priority::Standard, far(), &anon()).await {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                tokio::time::advance(Duration::from_millis(ttft_ms)).await;
                let now = Instant::now();
                permits.iter().for_each(|p| p.first_token(now));
            }
            a.adapt()
        }
    };
    // Slow first tokens: × 0.8 per interval, down to min.
    assert_eq!(round(300, 16, 1).await, 12);
    assert_eq!(round(300, 12, 1).await, 9);
    for _ in 0..10 {
        round(300, 32, 3).await;
    }
    assert_eq!(a.limits().concurrency, 2, "never below min");
    // Fast first tokens with C reached: + ceil(sqrt(C)), up to max.
    assert_eq!(round(10, 2, 3).await, 4);
    assert_eq!(round(10, 4, 2).await, 6);
    // Fast, but C never reached: no reason to raise it.
    assert_eq!(round(10, 1, 6).await, 6);
    for _ in 0..20 {
        let c = a.limits().concurrency as usize;
        round(10, c, 1).await;
    }
    assert_eq!(a.limits().concurrency, 32, "never above max");
    // A breach at 32 → 25; climbing back, + ceil(sqrt(C)) while that stays below 32, then + 1.
    assert_eq!(round(300, 32, 1).await, 25);
    let mut climb = Vec::new();
    for _ in 0..4 {
        let c = a.limits().concurrency as usize;
        climb.push(round(10, c, 1).await);
    }
    assert_eq!(climb, [30, 31, 32, 32], "careful near the C that breached");
}

#[tokio::test(start_paused = true)]
async fn a_burst_after_an_idle_spell_is_not_refused_on_stale_history() {
    // C + Q clients in a closed loop after an idle minute: each finds a slot or a queue place, and
    // the predicted wait (2 ahead at most, 200 ms holds over 2 slots: 200 ms) is far below Wq.
    let a = gate(2, 2, 1000);
    for _ in 0..10 {
        let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
        tokio::time::advance(Duration::from_millis(200)).await;
        drop(p);
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut refused = 0;
                for _ in 0..10 {
                    match a.acquire(Priority::Standard, far(), &anon()).await {
                        Ok(p) => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            drop(p);
                        }
                        Err(_) => refused += 1,
                    }
                }
                refused
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.await.unwrap(), 0, "no request of the burst is refused");
    }
}

#[tokio::test(start_paused = true)]
async fn the_drain_rate_ignores_idle_time_between_holds() {
    // Holds of 100 ms on one slot, spread over 8 s of mostly idle time: the slot still frees 10
    // per second when busy, so 5 ahead need 0.5 s, within Wq.
    let a = gate(1, 10, 1000);
    for _ in 0..8 {
        let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(p);
        tokio::time::advance(Duration::from_millis(900)).await;
    }
    let _busy = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let a = a.clone();
        waiting.push(tokio::spawn(async move {
            a.acquire(Priority::Standard, far(), &anon()).await
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(a.queued(), 5, "nobody refused");
    for w in waiting {
        w.abort();
    }
}

/// The age of what waits, read while it waits: the oldest of either lane, and none once the
/// queue is empty.
#[tokio::test(start_paused = true)]
async fn the_oldest_waiter_is_timed_while_it_waits() {
    let a = gate(1, 4, 10_000);
    assert_eq!(a.oldest_wait(), None);
    let p = a.acquire(Priority::Standard, far(), &anon()).await.unwrap();
    let a1 = a.clone();
    let standard = tokio::spawn(async move { a1.acquire(Priority::Standard, far(), &anon()).await });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(700)).await;
    let a2 = a.clone();
    let critical = tokio::spawn(async move { a2.acquire(Priority::Critical, far(), &anon()).await });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(300)).await;
    // The critical one goes first, but the standard one has waited longest.
    assert_eq!(a.oldest_wait(), Some(Duration::from_millis(1000)));
    drop(p);
    let p = critical.await.unwrap().unwrap();
    assert_eq!(a.oldest_wait(), Some(Duration::from_millis(1000)));
    drop(p);
    let _p = standard.await.unwrap().unwrap();
    assert_eq!(a.oldest_wait(), None);
}
