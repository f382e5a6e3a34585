//! Unit tests of `pool.rs`: routing, faults and ejection.

use super::*;

fn pool(urls: &[&str]) -> Pool<String> {
    let urls: Vec<String> = urls.iter().map(|s| s.to_string()).collect();
    let p = Pool::new(
        &urls,
        None,
        UpstreamLimits::default(),
        Arc::new(Metrics::new()),
    )
    .unwrap();
    for u in &p.upstreams {
        u.set_probed("m".into());
        p.admit(u);
    }
    p
}

#[test]
fn rendezvous_moves_only_the_keys_of_a_replica_that_leaves() {
    let p = pool(&["http://a:1", "http://b:1", "http://c:1"]);
    let keys: Vec<[u8; 8]> = (0u64..3000).map(|i| i.to_le_bytes()).collect();
    let first = |p: &Pool<String>, k: &[u8]| p.order(k)[0].url.clone();
    let before: Vec<String> = keys.iter().map(|k| first(&p, k)).collect();
    // Spread over all three, roughly evenly.
    for url in ["http://a:1", "http://b:1", "http://c:1"] {
        let n = before.iter().filter(|u| *u == url).count();
        assert!((800..1200).contains(&n), "{url}: {n}");
    }
    // Eject b: only b's keys move; a's and c's stay.
    p.set_ejected(&p.upstreams[1], true);
    for (k, was) in keys.iter().zip(&before) {
        let now = first(&p, k);
        if was != "http://b:1" {
            assert_eq!(&now, was);
        } else {
            assert_ne!(now, "http://b:1");
        }
    }
    // Admit it again: every key is back where it was.
    p.admit(&p.upstreams[1]);
    let again: Vec<String> = keys.iter().map(|k| first(&p, k)).collect();
    assert_eq!(again, before);
}

#[test]
fn ejection_needs_distinct_failures_and_readmission_passed_checks() {
    let limits = UpstreamLimits {
        eject_after: 2,
        ..UpstreamLimits::default()
    };
    let p: Pool<String> = Pool::new(
        &["http://a:1".to_string()],
        None,
        limits,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let u = &p.upstreams[0];
    u.set_probed("m".into());
    p.admit(u);
    // One request failing again and again is one failure.
    for _ in 0..5 {
        p.failed(u, Some(b"request one"));
    }
    assert!(!u.is_ejected());
    // A second request's failure makes two.
    p.failed(u, Some(b"request two"));
    assert!(u.is_ejected());
    p.passed(u);
    assert!(u.is_ejected(), "readmit_after is 2");
    p.passed(u);
    assert!(!u.is_ejected());
    assert!(p.order(b"k").len() == 1);
    // Failed health checks are distinct failures each.
    p.failed(u, None);
    assert!(!u.is_ejected());
    p.failed(u, None);
    assert!(u.is_ejected());
}

#[test]
fn only_the_replicas_faults_are_retried_and_counted() {
    let status = |s, m: &str| UpstreamError::Status {
        url: "u".into(),
        status: s,
        message: m.into(),
    };
    assert_eq!(status(502, "").fault(), Fault::Replica);
    assert_eq!(status(503, "").fault(), Fault::Replica);
    assert_eq!(status(504, "").fault(), Fault::Replica);
    assert_eq!(status(500, ENGINE_DEAD_MESSAGE).fault(), Fault::Replica);
    assert_eq!(status(429, "").fault(), Fault::Busy);
    // A 500 raised while processing one request, and any 4xx, are the
    // request's.
    assert_eq!(
        status(500, "m is not a multimodal model").fault(),
        Fault::Request
    );
    assert_eq!(status(400, "").fault(), Fault::Request);
    assert!(!status(500, "Internal Server Error").retryable());
    assert!(status(429, "").retryable());
    assert!(UpstreamError::Timeout {
        url: "u".into(),
        seconds: 1.0
    }
    .retryable());
    assert!(!UpstreamError::Invalid {
        url: "u".into(),
        message: String::new()
    }
    .retryable());
    assert!(matches!(
        EngineError::from(status(400, "")),
        EngineError::UpstreamRefused(_)
    ));
    assert!(matches!(
        EngineError::from(status(500, "")),
        EngineError::Upstream(_)
    ));
    assert!(matches!(
        EngineError::from(status(503, "")),
        EngineError::UpstreamUnavailable(_)
    ));
}

#[test]
fn a_timeout_is_the_replica_s_only_if_it_answered_nothing_meanwhile() {
    let p = pool(&["http://a:1"]);
    let u = &p.upstreams[0];
    let timeout = UpstreamError::Timeout {
        url: u.url.clone(),
        seconds: 1.0,
    };
    let started = p.now_ms();
    // Nothing answered since the call began: a replica that hangs.
    assert_eq!(p.fault_of(u, &timeout, started), Fault::Replica);
    // Its health check answered meanwhile: the request's own size.
    std::thread::sleep(Duration::from_millis(2));
    u.answered_at.store(p.now_ms(), Ordering::Relaxed);
    assert_eq!(p.fault_of(u, &timeout, started), Fault::Request);
    // Other faults are as `fault` says.
    let refused = UpstreamError::Connect {
        url: u.url.clone(),
        message: String::new(),
    };
    assert_eq!(p.fault_of(u, &refused, started), Fault::Replica);
}
