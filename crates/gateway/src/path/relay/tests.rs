use super::*;
use crate::route::transport::{Conns, Response, Upstream};
use std::sync::Arc;

/// One POST of `{}` on `conns`, as the gateway sends them.
async fn call(conns: &Arc<Conns>) -> Result<Response, h1::Error> {
    let body = Bytes::from_static(b"{}");
    let request = h1::Request {
        method: "POST",
        path: "/v1/chat/completions",
        headers: &[],
        body: &body,
    };
    h1::send(conns, &request, Duration::from_secs(1)).await
}

/// A stream's events with every budget `secs` seconds from now, nothing renamed.
fn events_for(secs: u64) -> Events {
    let t = crate::config::Timeouts {
        first_token: Duration::from_secs(secs),
        total: Duration::from_secs(secs),
        ..crate::config::Timeouts::default()
    };
    let budgets = crate::path::upstream::Budgets::new(&t, None, Instant::now());
    Events::new(
        None,
        None,
        false,
        &budgets,
        Duration::from_secs(secs),
        Instant::now(),
    )
}

/// What a lone stream's first write gets: the events up to the first with tokens (a role
/// chunk sent apart, as vLLM sends it, comes along), not those read after it; the relay
/// passes those on next, without another read.
#[tokio::test]
async fn the_first_write_ends_with_the_first_token_and_the_rest_follows() {
    let events = [
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        wire.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    // One write: the whole answer reaches the gateway's first read.
    let (url, _replica) = testkit::serve_script(vec![wire], false).await;
    let conns = Arc::new(Upstream::conns(&url, None));
    let answer = call(&conns).await.unwrap();
    let mut ex = Ledger::new(
        Arc::new(crate::metrics::Metrics::new()),
        crate::access_log::AccessLog::discard(),
        "id".into(),
    );
    let Opened::Stream(opened) = open(answer.into_body(), events_for(5), &mut ex).await.unwrap() else {
        panic!("a stream")
    };
    assert_eq!(&opened.events.out[..], [events[0], events[1]].concat().as_bytes());
    let (_stop_tx, stop) = watch::channel(false);
    let mut relay = Relay::new(opened, stop, ex);
    relay.written();
    let mut rest = Vec::new();
    while !relay.is_done() {
        std::future::poll_fn(|cx| relay.poll_out(cx)).await;
        rest.extend_from_slice(relay.out());
        relay.written();
    }
    assert_eq!(rest, [events[2], events[3]].concat().as_bytes());
}

/// `events`, each a chunk of one 200 stream written at once, opened as the gateway opens
/// a stream.
async fn open_script(events: &[&str]) -> (Result<Opened, GatewayError>, Ledger) {
    let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        wire.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let (url, _replica) = testkit::serve_script(vec![wire], false).await;
    let conns = Arc::new(Upstream::conns(&url, None));
    let answer = call(&conns).await.unwrap();
    let mut ex = Ledger::new(
        Arc::new(crate::metrics::Metrics::new()),
        crate::access_log::AccessLog::discard(),
        "id".into(),
    );
    let opened = open(answer.into_body(), events_for(5), &mut ex).await;
    (opened, ex)
}

/// vLLM 0.32 refuses a request its full queue cannot take with a 200 stream of one error
/// event (`code` an integer) and `[DONE]`: the stream does not open, and the error says
/// which status it names; nothing of it is timed or ends the ledger.
#[tokio::test]
async fn an_error_event_before_the_first_token_is_not_a_stream() {
    let busy = "data: {\"error\": {\"message\": \"The server is overloaded\", \"type\": \"ServiceUnavailableError\", \"param\": null, \"code\": 503}}\n\n";
    let (opened, ex) = open_script(&[busy, "data: [DONE]\n\n"]).await;
    let Ok(Opened::Error(early)) = opened else {
        panic!("an error, not a stream")
    };
    assert_eq!(early.status, Some(axum::http::StatusCode::from_u16(503).unwrap()));
    assert_eq!(
        &early.body[..],
        busy.trim_start_matches("data: ").trim_end().as_bytes()
    );
    assert!(!ex.ended(), "[DONE] after it does not finish the ledger");
    // The same in one write, after a role chunk.
    let role = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    let bad = "data: {\"error\":{\"message\":\"max_tokens is too large\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\ndata: [DONE]\n\n";
    let (opened, ex) = open_script(&[&format!("{role}{bad}")]).await;
    let Ok(Opened::Error(early)) = opened else {
        panic!("an error, not a stream")
    };
    assert_eq!(early.status, Some(axum::http::StatusCode::from_u16(400).unwrap()));
    assert!(!ex.ended());
    // After a token, an error event is the stream's own: relayed as it is.
    let token = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    let (opened, _) = open_script(&[&format!("{token}{bad}")]).await;
    assert!(matches!(opened, Ok(Opened::Stream(_))));
}

/// Comments (or role chunks) without end ahead of the first token are held only up to one
/// event's bound.
#[tokio::test]
async fn what_comes_ahead_of_the_first_token_is_bounded() {
    let ping = ": ping\n\n";
    let many = ping.repeat(2 * MAX_EVENT / ping.len());
    let (opened, _) = open_script(&[&many, "data: [DONE]\n\n"]).await;
    match opened {
        Err(GatewayError::Upstream { message, .. }) => {
            assert!(message.contains("before its first token"), "{message}")
        }
        _ => panic!("refused"),
    }
    let (opened, _) = open_script(&[&ping.repeat(100), "data: [DONE]\n\n"]).await;
    assert!(matches!(opened, Ok(Opened::Stream(_))));
}

/// Waits until `alarm` says yes, polling it the way the relay does.
async fn until(alarms: &mut Alarms, alarm: fn(&mut Alarms, &mut Context<'_>) -> bool) {
    std::future::poll_fn(|cx| {
        if alarm(alarms, cx) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// A task that spent its budget (a backlog relayed in one go) before it first looked at the
/// alarms must still be woken by them: tokio answers such a poll Pending without registering
/// the waker, so that look cannot count as the one that arms them.
#[tokio::test(start_paused = true)]
async fn alarms_first_looked_at_without_budget_still_wake_the_task() {
    let (stop_tx, stop) = watch::channel(false);
    let mut alarms = Alarms::new(Instant::now() + Duration::from_millis(100), stop);
    let (backlog_tx, mut backlog) = tokio::sync::mpsc::unbounded_channel::<u32>();
    for i in 0..1000 {
        backlog_tx.send(i).unwrap();
    }
    std::future::poll_fn(|cx| {
        while backlog.poll_recv(cx).is_ready() {}
        assert!(!tokio::task::coop::has_budget_remaining());
        assert!(!alarms.timer_due(cx));
        assert!(!alarms.stopping(cx));
        Poll::Ready(())
    })
    .await;
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), until(&mut alarms, Alarms::timer_due))
        .await
        .expect("the timer wakes the task");
    assert_eq!(t.elapsed(), Duration::from_millis(100));

    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop_tx.send_replace(true);
        std::future::pending::<()>().await;
    });
    let t = Instant::now();
    // The timeout also wakes the task, at 5 s: the signal must have done so at 50 ms.
    tokio::time::timeout(Duration::from_secs(5), until(&mut alarms, Alarms::stopping))
        .await
        .expect("the drain's signal is seen");
    assert_eq!(
        t.elapsed(),
        Duration::from_millis(50),
        "woken by the signal itself"
    );
}

/// The relay's core is fed bytes and the time, with no socket and no clock of its own: these
/// drive it as either front door does.
mod fed {
    use super::*;
    use crate::error::Cut;
    use crate::path::relay::{Opening, Rang};

    const ROLE: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    const TOKEN: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    const DONE: &[u8] = b"data: [DONE]\n\n";

    fn ledger() -> Ledger {
        Ledger::new(
            Arc::new(crate::metrics::Metrics::new()),
            crate::access_log::AccessLog::discard(),
            "id".into(),
        )
    }

    /// First token 1 s, idle 2 s, total 5 s, from `t0`.
    fn events(t0: Instant) -> Events {
        let t = crate::config::Timeouts {
            first_token: Duration::from_secs(1),
            total: Duration::from_secs(5),
            ..crate::config::Timeouts::default()
        };
        let budgets = crate::path::upstream::Budgets::new(&t, None, t0);
        Events::new(None, None, true, &budgets, Duration::from_secs(2), t0)
    }

    fn last_error_code(out: &[u8]) -> String {
        let text = String::from_utf8_lossy(out);
        let data = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap()
            .to_owned();
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        v["error"]["code"].as_str().unwrap().to_owned()
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_is_held_until_the_first_token_then_the_events_pass_on() {
        let t0 = Instant::now();
        let (mut e, mut ex) = (events(t0), ledger());
        assert!(!e.feed(&mut ex, ROLE, t0));
        assert!(matches!(e.opening(&mut ex), Ok(Opening::Hold)));
        assert_eq!(e.due(), t0 + Duration::from_secs(1), "the first token's budget");
        // Split mid-event: nothing decides until it is whole.
        assert!(!e.feed(&mut ex, &TOKEN[..10], t0));
        assert!(e.feed(&mut ex, &TOKEN[10..], t0 + Duration::from_millis(300)));
        assert!(matches!(e.opening(&mut ex), Ok(Opening::Stream)));
        assert_eq!(&e.take_out()[..], [ROLE, TOKEN].concat().as_slice());
        assert_eq!(
            e.due(),
            t0 + Duration::from_millis(2300),
            "stream_idle from the last data"
        );
        e.feed(&mut ex, DONE, t0 + Duration::from_millis(400));
        assert!(e.streamed(&mut ex), "[DONE] moves the timer earlier");
        assert_eq!(e.due(), t0 + Duration::from_millis(1400), "the body's grace");
        e.ended(&mut ex);
        assert!(e.is_done());
        assert_eq!(&e.take_out()[..], DONE);
        assert!(ex.ended());
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_event_before_the_first_token_is_kept_back_after_it_passed_on() {
        let t0 = Instant::now();
        let busy = b"data: {\"error\":{\"message\":\"full\",\"code\":503}}\n\n";
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, &[ROLE, busy.as_slice()].concat(), t0);
        let Ok(Opening::Error(early)) = e.opening(&mut ex) else {
            panic!("an early error")
        };
        assert_eq!(early.status, Some(StatusCode::SERVICE_UNAVAILABLE));
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, TOKEN, t0);
        assert!(matches!(e.opening(&mut ex), Ok(Opening::Stream)));
        e.feed(&mut ex, busy, t0);
        e.streamed(&mut ex);
        assert!(
            e.take_out().ends_with(busy),
            "after the first token, the stream's own"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_timers_cut_at_the_first_token_idle_total_and_end_quietly_after_done() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        // No first token: late, before the head.
        let (mut e, mut ex) = (events(t0), ledger());
        assert!(matches!(
            e.rang(&mut ex, t0 + second / 2),
            Rang::NotYet(at) if at == t0 + second
        ));
        assert!(matches!(
            e.rang(&mut ex, t0 + second),
            Rang::Late(GatewayError::FirstTokenTimeout(_))
        ));
        // Idle after the first token.
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, TOKEN, t0);
        e.opening(&mut ex).unwrap();
        e.take_out();
        assert!(matches!(
            e.rang(&mut ex, t0 + 2 * second),
            Rang::Ended(Some(Cut::Idle))
        ));
        assert_eq!(last_error_code(&e.take_out()), "stream_idle_timeout");
        // Data keeps coming: the total budget ends it.
        let (mut e, mut ex) = (events(t0), ledger());
        for s in 0..5 {
            e.feed(&mut ex, TOKEN, t0 + s * second);
        }
        e.opening(&mut ex).unwrap();
        assert!(matches!(
            e.rang(&mut ex, t0 + 5 * second),
            Rang::Ended(Some(Cut::Deadline))
        ));
        assert_eq!(last_error_code(&e.take_out()), "deadline_exceeded");
        // [DONE] and no end of body: ends as if it had, after the grace.
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, &[TOKEN, DONE].concat(), t0);
        e.opening(&mut ex).unwrap();
        e.take_out();
        assert!(matches!(e.rang(&mut ex, t0 + DONE_GRACE), Rang::Ended(None)));
        assert!(e.is_done() && e.take_out().is_empty());
        assert_eq!(ex.noted(), Some("upstream_body_not_ended"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_over_max_event_ends_the_request_before_or_after_the_head() {
        let t0 = Instant::now();
        let endless = vec![b'x'; MAX_EVENT + 1];
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, b"data: ", t0);
        e.feed(&mut ex, &endless, t0);
        assert!(matches!(e.opening(&mut ex), Err(GatewayError::Upstream { .. })));
        let (mut e, mut ex) = (events(t0), ledger());
        e.feed(&mut ex, TOKEN, t0);
        e.opening(&mut ex).unwrap();
        e.feed(&mut ex, b"data: ", t0);
        e.feed(&mut ex, &endless, t0);
        e.streamed(&mut ex);
        assert!(e.is_done());
        assert_eq!(last_error_code(&e.take_out()), "upstream_stream_error");
    }
}
