//! The queue the bench watches beside its requests.

use bench::watch::QueueWatch;
use std::time::Duration;

fn exposition(waiting: f64, running: f64) -> String {
    format!(
        "vllm:num_requests_waiting{{engine=\"0\",model_name=\"sim\"}} {waiting}\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"sim\"}} {running}\n"
    )
}

/// Two replicas, three waiting in one and five in the other: the waiting column is the
/// service's eight, not the first replica's three. Fails before (one URL was watched: the
/// demo's two replicas read as one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_watched_is_summed() {
    let a = testkit::serve_text(exposition(3.0, 4.0)).await;
    let b = testkit::serve_text(exposition(5.0, 4.0)).await;
    let epoch = tokio::time::Instant::now();
    let urls = [format!("{a}/metrics"), format!("{b}/metrics")];
    let watch = QueueWatch::start(&urls, Duration::from_millis(20), epoch, None)
        .await
        .unwrap();
    assert!(
        testkit::eventually(Duration::from_secs(5), || !watch
            .between(Duration::ZERO, Duration::from_secs(60))
            .is_empty())
        .await
    );
    let s = watch.between(Duration::ZERO, Duration::from_secs(60))[0];
    assert_eq!((s.waiting, s.running), (8.0, Some(8.0)));
    // A URL with nothing to watch fails the run at once, naming it.
    let none = testkit::serve_text("up 1\n".into()).await;
    let err = QueueWatch::start(
        &[urls[0].clone(), format!("{none}/metrics")],
        Duration::from_millis(20),
        epoch,
        None,
    )
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains(&none), "{err}");
}
