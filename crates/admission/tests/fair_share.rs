//! Fair share between teams in one contended gate, on a paused clock: closed-loop clients of each
//! team ask for a slot, hold it for a fixed service time, and ask again.

use spillway_admission::{Admission, Claim, Fairness, Limits, Priority, Rejection};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const HOLD: Duration = Duration::from_millis(100);
const COST: u64 = 300;

fn gate(c: u32, q: u32, fairness: Fairness) -> Arc<Admission> {
    let a = Admission::new(Limits {
        concurrency: c,
        queue: q,
        queue_wait: Duration::from_secs(30),
    });
    a.set_fairness(fairness);
    a
}

#[derive(Default, Debug)]
struct Tally {
    served: u64,
    refused: u64,
    waits: Vec<Duration>,
}

impl Tally {
    fn p95(&self) -> Duration {
        let mut w = self.waits.clone();
        w.sort();
        w.get(w.len() * 95 / 100).copied().unwrap_or_default()
    }
}

type Tallies = Arc<Mutex<HashMap<&'static str, Tally>>>;

/// `clients` closed-loop clients of `team` (with `weight`) from `from` until `until`.
fn clients(
    gate: &Arc<Admission>,
    tallies: &Tallies,
    team: &'static str,
    weight: f64,
    clients: usize,
    from: Instant,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let claim = Claim {
        team: Arc::from(team),
        weight,
        cost: COST,
        objective: None,
    };
    (0..clients)
        .map(|_| {
            let (gate, tallies, claim) = (gate.clone(), tallies.clone(), claim.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(from).await;
                while Instant::now() < until {
                    let asked = Instant::now();
                    // Far enough that no request is refused for the run's end.
                    let deadline = until + Duration::from_secs(60);
                    match gate.acquire(Priority::Standard, deadline, &claim).await {
                        Ok(mut permit) => {
                            let waited = asked.elapsed();
                            tokio::time::sleep(HOLD).await;
                            permit.settle(COST);
                            drop(permit);
                            let mut t = tallies.lock().unwrap();
                            let t = t.entry(team).or_default();
                            t.served += 1;
                            t.waits.push(waited);
                        }
                        Err(e) => {
                            tallies.lock().unwrap().entry(team).or_default().refused += 1;
                            tokio::time::sleep(e.retry_after().min(Duration::from_millis(50))).await;
                        }
                    }
                }
            })
        })
        .collect()
}

async fn run(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.unwrap();
    }
}

/// The flood: C = 4, a deep queue, team a with 24 clients and team b with 4.
async fn flood(fairness: Fairness) -> HashMap<&'static str, Tally> {
    let g = gate(4, 64, fairness);
    let tallies = Tallies::default();
    let start = Instant::now();
    let end = start + Duration::from_secs(60);
    let mut tasks = clients(&g, &tallies, "a", 1.0, 24, start, end);
    tasks.extend(clients(&g, &tallies, "b", 1.0, 4, start, end));
    run(tasks).await;
    std::mem::take(&mut *tallies.lock().unwrap())
}

fn share(t: &HashMap<&str, Tally>, team: &str) -> f64 {
    let all: u64 = t.values().map(|t| t.served).sum();
    t[team].served as f64 / all as f64
}

#[tokio::test(start_paused = true)]
async fn a_flooding_team_takes_everyones_turn_under_fifo() {
    let t = flood(Fairness::Fifo).await;
    let b = share(&t, "b");
    assert!(b < 0.2, "b's share under fifo {b:.2}");
    // Both wait the same: the queue does not know who is who.
    let (pa, pb) = (t["a"].p95(), t["b"].p95());
    assert!(pb * 2 > pa, "a {pa:?} b {pb:?}");
}

#[tokio::test(start_paused = true)]
async fn under_teams_the_light_team_gets_its_share_and_a_short_wait() {
    let t = flood(Fairness::Teams).await;
    let b = share(&t, "b");
    assert!(b >= 0.35, "b's share {b:.2}: {t:?}");
    let (pa, pb) = (t["a"].p95(), t["b"].p95());
    assert!(pb * 2 < pa, "b's wait p95 {pb:?} is not under half of a's {pa:?}");
    // Work-conserving: every slot stayed busy (C / hold = 40 requests a second for 60 s).
    let all: u64 = t.values().map(|t| t.served).sum();
    assert!(all >= 2350, "{all} served");
    assert_eq!(t["a"].refused + t["b"].refused, 0);
}

#[tokio::test(start_paused = true)]
async fn weights_three_to_one_give_three_to_one_of_the_service() {
    let g = gate(4, 64, Fairness::Teams);
    let tallies = Tallies::default();
    let start = Instant::now();
    let end = start + Duration::from_secs(60);
    // Both backlogged: more clients each than the four slots.
    let mut tasks = clients(&g, &tallies, "heavy", 3.0, 12, start, end);
    tasks.extend(clients(&g, &tallies, "light", 1.0, 12, start, end));
    run(tasks).await;
    let t = tallies.lock().unwrap();
    let ratio = t["heavy"].served as f64 / t["light"].served as f64;
    assert!((2.6..=3.4).contains(&ratio), "ratio {ratio:.2}: {t:?}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_team_leaves_nothing_unused() {
    let g = gate(4, 64, Fairness::Teams);
    let tallies = Tallies::default();
    let start = Instant::now();
    let end = start + Duration::from_secs(20);
    run(clients(&g, &tallies, "a", 1.0, 8, start, end)).await;
    let t = tallies.lock().unwrap();
    // Team b never came: a alone had every slot, 40 a second.
    assert!(t["a"].served >= 790, "{t:?}");
}

#[tokio::test(start_paused = true)]
async fn a_team_back_from_idle_does_not_starve_the_heavy_one() {
    let g = gate(4, 64, Fairness::Teams);
    let tallies = Tallies::default();
    let start = Instant::now();
    // a runs alone for 30 s and attains a lot of service; then b floods as hard.
    let b_from = start + Duration::from_secs(30);
    let end = b_from + Duration::from_secs(10);
    let mut tasks = clients(&g, &tallies, "a", 1.0, 12, start, end);
    let b_tallies = Tallies::default();
    tasks.extend(clients(&g, &b_tallies, "b", 1.0, 12, b_from, end));
    // What a gets while b floods: counted from b's arrival on.
    let served_before = {
        let g2 = tallies.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(b_from).await;
            g2.lock().unwrap().get("a").map_or(0, |t| t.served)
        })
    };
    run(tasks).await;
    let before = served_before.await.unwrap();
    let a_during = tallies.lock().unwrap()["a"].served - before;
    let b_during = b_tallies.lock().unwrap()["b"].served;
    let a_share = a_during as f64 / (a_during + b_during) as f64;
    assert!(
        a_share >= 0.4,
        "a got {a_during} and b {b_during} after b came: a starved"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_makes_room_by_pushing_out_the_team_holding_most_of_it() {
    let g = gate(1, 4, Fairness::Teams);
    let order = Arc::new(Mutex::new(Vec::new()));
    let far = Instant::now() + Duration::from_secs(60);
    let ask = |team: &'static str| {
        let (g, order) = (g.clone(), order.clone());
        let claim = Claim {
            team: Arc::from(team),
            weight: 1.0,
            cost: COST,
            objective: None,
        };
        tokio::spawn(async move {
            let permit = g.acquire(Priority::Standard, far, &claim).await?;
            order.lock().unwrap().push(team);
            tokio::time::sleep(HOLD).await;
            drop(permit);
            Ok::<(), Rejection>(())
        })
    };
    let busy = ask("a");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(ask("a"));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(g.queued(), 4);
    // b holds none of the queue: a's newest waiter makes room for it.
    let b = ask("b");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(g.queued(), 4);
    let newest = waiting.pop().unwrap().await.unwrap();
    assert!(matches!(newest, Err(Rejection::QueueFull { .. })), "{newest:?}");
    busy.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    for w in waiting {
        w.await.unwrap().unwrap();
    }
    // b, lifted to a's service as it started waiting, goes right after the a waiter that came
    // first (a tie, broken by arrival), before a's later ones.
    assert_eq!(*order.lock().unwrap(), ["a", "a", "b", "a", "a"]);

    // Under fifo a full queue refuses the newcomer instead.
    let f = gate(1, 1, Fairness::Fifo);
    let claim = |team: &str| Claim {
        team: Arc::from(team),
        weight: 1.0,
        cost: COST,
        objective: None,
    };
    let _busy = f.acquire(Priority::Standard, far, &claim("a")).await.unwrap();
    let _w = {
        let (f, c) = (f.clone(), claim("a"));
        tokio::spawn(async move { f.acquire(Priority::Standard, far, &c).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(matches!(
        f.acquire(Priority::Standard, far, &claim("b")).await,
        Err(Rejection::QueueFull { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_long_request_settles_against_its_decayed_charge() {
    let g = gate(4, 4, Fairness::Teams);
    let claim = |team: &str, cost: u64| Claim {
        team: Arc::from(team),
        weight: 1.0,
        cost,
        objective: None,
    };
    let far = Instant::now() + Duration::from_secs(3600);
    // a attains 1,000 in short requests, then holds one charged 1,000 for a half-life.
    for _ in 0..10 {
        let mut p = g
            .acquire(Priority::Standard, far, &claim("a", 100))
            .await
            .unwrap();
        p.settle(100);
    }
    let mut long = g
        .acquire(Priority::Standard, far, &claim("a", 1000))
        .await
        .unwrap();
    tokio::time::sleep(spillway_admission::fair::HALF_LIFE).await;
    long.settle(1000);
    drop(long);
    // Everything decayed one half-life: (1,000 + 1,000) / 2, then the request's 1,000 counted
    // now in place of its 500 left: 1,500. Taking back the whole 1,000 charged left 1,000.
    let a = g.shares().into_iter().find(|s| &*s.team == "a").unwrap();
    assert!((a.service - 1500.0).abs() < 1.0, "{a:?}");
    assert!((a.received - 1500.0).abs() < 1.0, "{a:?}");
}

#[tokio::test(start_paused = true)]
async fn nobody_is_pushed_out_for_a_newcomer_refused_anyway() {
    let g = gate(1, 2, Fairness::Teams);
    let claim = |team: &str| Claim {
        team: Arc::from(team),
        weight: 1.0,
        cost: COST,
        objective: None,
    };
    let far = Instant::now() + Duration::from_secs(3600);
    let busy = g.acquire(Priority::Standard, far, &claim("a")).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (g, c) = (g.clone(), claim("a"));
            tokio::spawn(async move { g.acquire(Priority::Standard, far, &c).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(g.queued(), 2);
    // b's deadline has passed: it is refused, and a's waiters keep their places.
    let refused = g.acquire(Priority::Standard, Instant::now(), &claim("b")).await;
    assert!(
        matches!(refused, Err(Rejection::QueueTimeout { .. })),
        "{refused:?}"
    );
    assert_eq!(g.queued(), 2);
    drop(busy);
    for w in waiting {
        w.await.unwrap().expect("a's waiters are served");
    }
}

#[tokio::test(start_paused = true)]
async fn the_queue_serves_the_earliest_deadline_first() {
    for fairness in [Fairness::Fifo, Fairness::Teams] {
        let g = gate(1, 8, fairness);
        let order = Arc::new(Mutex::new(Vec::new()));
        let far = Instant::now() + Duration::from_secs(3600);
        let ask = |name: &'static str, objective: Option<Duration>| {
            let (g, order) = (g.clone(), order.clone());
            let claim = Claim {
                team: Arc::from("a"),
                weight: 1.0,
                cost: COST,
                objective,
            };
            tokio::spawn(async move {
                let permit = g.acquire(Priority::Standard, far, &claim).await.unwrap();
                order.lock().unwrap().push(name);
                tokio::time::sleep(HOLD).await;
                drop(permit);
            })
        };
        let busy = ask("busy", None);
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Waiting in this order: no objective (due when Wq, 30 s, runs out), 2 s, 100 ms, 2 s.
        let mut tasks = vec![busy];
        for (name, objective) in [
            ("none", None),
            ("loose", Some(Duration::from_secs(2))),
            ("tight", Some(Duration::from_millis(100))),
            ("loose again", Some(Duration::from_secs(2))),
        ] {
            tasks.push(ask(name, objective));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "tight", "loose", "loose again", "none"],
            "{fairness:?}"
        );
    }
}
