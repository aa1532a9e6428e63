use super::*;
use crate::route::transport::{Conns, Response, Upstream};
use std::sync::Arc;

/// One POST of `{}` on `conns`, as the gateway sends them.
async fn call(conns: &Arc<Conns>) -> Result<Response, h1::Error> {
    let body = Bytes::from_static(b"{}");
    let request = h1::Request {
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
    Events::new(None, false, &budgets, Duration::from_secs(secs), Instant::now())
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
