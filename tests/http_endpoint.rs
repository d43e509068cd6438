//! The HTTP endpoint every engine serves by default, read by a real HTTP
//! client: `/metrics`, `/metrics/json`, `/health` (and its live and ready
//! halves), `/topology`; the bearer token a shared secret requires; the URL
//! in the descriptor; a taken port falling back to an ephemeral one.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::test_config;
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TransportKind, op};

/// GET `path` from `url` (`http://ip:port`), with `token` as a bearer:
/// the status and the body.
fn get(url: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let (status, _, body) = exchange(
        url,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n"),
    );
    (status, body)
}

/// Send `request` to `url` and read its answer (the head, then the body's
/// `Content-Length` bytes): the status, the head and the body.
fn exchange(url: &str, request: &str) -> (u16, String, String) {
    let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the head ended early");
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .parse()
        .unwrap();
    let mut body = vec![0; len];
    s.read_exact(&mut body).unwrap();
    (
        status,
        head.trim_end().to_owned(),
        String::from_utf8(body).unwrap(),
    )
}

/// The value of the sample line that starts with `series` and a space.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// `/metrics` is OpenMetrics text (its content type, `# EOF`), and shows
/// the HTTP server's own counters: what it answered by status class, the
/// connections it accepted, the requests it refused.
#[test]
fn metrics_are_openmetrics_and_count_the_endpoint_itself() {
    let e = Engine::new(test_config()).unwrap();
    let url = e.http_url().unwrap().to_owned();
    let (status, head, text) = exchange(&url, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(
        head.contains(
            "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{head}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE tent_http_responses counter\n"),
        "{text}"
    );
    // Before this scrape: nothing answered, one connection (this one).
    assert_eq!(sample(&text, "tent_http_connections_accepted_total"), 1);
    assert_eq!(sample(&text, "tent_http_responses_total{class=\"2xx\"}"), 0);
    // A 404, a malformed request, another method: answered and counted.
    assert_eq!(get(&url, "/nowhere", None).0, 404);
    assert_eq!(exchange(&url, "GET /metrics HTTX/1.1\r\n\r\n").0, 400);
    assert_eq!(exchange(&url, "POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    let (_, text) = get(&url, "/metrics", None);
    assert_eq!(sample(&text, "tent_http_connections_accepted_total"), 5);
    // The first scrape's 200; the 404, 400 and 405 (this scrape's own
    // response is counted once written).
    assert_eq!(sample(&text, "tent_http_responses_total{class=\"2xx\"}"), 1);
    assert_eq!(sample(&text, "tent_http_responses_total{class=\"4xx\"}"), 3);
    assert_eq!(
        sample(
            &text,
            "tent_http_requests_refused_total{reason=\"bad_request\"}"
        ),
        2
    );
    assert_eq!(sample(&text, "tent_http_connections_evicted_total"), 0);
    assert_eq!(sample(&text, "tent_http_connections_timed_out_total"), 0);
    // The same through /metrics/json, which reads past `# EOF`.
    let (_, body) = get(&url, "/metrics/json", None);
    let samples = json(&body);
    let accepted = samples
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "tent_http_connections_accepted_total")
        .expect("tent_http_connections_accepted_total in /metrics/json");
    assert_eq!(accepted["value"], 6.0);
    assert!(
        samples
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.get("unparsed").is_none()),
        "{body}"
    );
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn every_path_answers_a_real_client_and_the_descriptor_names_the_url() {
    let e = Engine::new(test_config()).unwrap();
    let url = e.http_url().expect("on by default").to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "on the control address: {url}"
    );

    let (status, text) = get(&url, "/metrics", None);
    assert_eq!(status, 200);
    assert!(text.contains("tent_transport_failover_total"), "{text}");
    assert!(text.contains("tent_qos_"), "{text}");

    let (status, body) = get(&url, "/metrics/json", None);
    assert_eq!(status, 200);
    let samples = json(&body);
    let names: Vec<&str> = samples
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().expect("every sample parsed"))
        .collect();
    assert!(
        names.contains(&"tent_task_failover_exhausted_total"),
        "{names:?}"
    );

    let (status, body) = get(&url, "/health", None);
    assert_eq!(status, 200, "{body}");
    let h = json(&body);
    assert_eq!(h["ready"], true);
    assert_eq!(h["engine"]["metrics_url"], url.as_str());
    assert_eq!(h["engine"]["segment"], e.segment_name().as_str());
    assert_eq!(h["engine"]["workers"]["alive"], 1);
    assert!(
        h["engine"]["transports"].as_array().unwrap().len() >= 2,
        "{h}"
    );

    assert_eq!(get(&url, "/health/live", None), (200, "live\n".into()));
    assert_eq!(get(&url, "/health/ready", None), (200, "ready\n".into()));

    let (status, body) = get(&url, "/topology", None);
    assert_eq!(status, 200);
    let t = json(&body);
    assert_eq!(t["workers"].as_array().unwrap().len(), 1, "{t}");
    assert!(!t["numa_nodes"].as_array().unwrap().is_empty(), "{t}");

    assert_eq!(get(&url, "/nope", None).0, 404);

    // A reload moves the configuration generation /health reports.
    assert_eq!(h["engine"]["config_generation"], 1);
    let mut c = (*e.live_config()).clone();
    c.transports.rdma.rail_error_threshold += 1;
    e.reload(c).unwrap();
    let h = json(&get(&url, "/health", None).1);
    assert_eq!(h["engine"]["config_generation"], 2);

    // A peer reads the URL from the descriptor.
    let d =
        tent::control::client::fetch_descriptor(&e.segment_name(), None, Duration::from_secs(5))
            .unwrap();
    assert_eq!(d.metrics_url.as_deref(), Some(url.as_str()));
}

#[test]
fn with_a_secret_every_path_but_liveness_needs_the_bearer_token() {
    let mut c = test_config();
    c.rpc_shared_secret = "0123456789abcdef0123456789abcdef".into();
    let e = Engine::new(c).unwrap();
    let url = e.http_url().unwrap().to_owned();
    let token = e.http_bearer_token().expect("a secret gives a token");
    assert!(
        !token.contains("0123456789abcdef"),
        "the token is not the secret"
    );
    for path in [
        "/metrics",
        "/metrics/json",
        "/health",
        "/health/ready",
        "/topology",
    ] {
        assert_eq!(get(&url, path, None).0, 401, "{path} without a token");
        assert_eq!(
            get(&url, path, Some("wrong")).0,
            401,
            "{path} with a wrong one"
        );
        assert_eq!(
            get(&url, path, Some(&token)).0,
            200,
            "{path} with the token"
        );
    }
    assert_eq!(
        get(&url, "/health/live", None).0,
        200,
        "liveness stays open"
    );
    // Without a secret there is no token.
    assert!(
        Engine::new(test_config())
            .unwrap()
            .http_bearer_token()
            .is_none()
    );
}

#[test]
fn a_taken_port_falls_back_to_an_ephemeral_one_and_the_endpoint_can_be_off() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut c = test_config();
    c.metrics.http_port = port;
    let e = Engine::new(c).unwrap();
    let url = e.http_url().unwrap().to_owned();
    assert!(!url.ends_with(&format!(":{port}")), "{url}");
    assert_eq!(get(&url, "/health/live", None).0, 200);
    drop(taken);

    let mut c = test_config();
    c.metrics.http_enable = false;
    let off = Engine::new(c).unwrap();
    assert_eq!(off.http_url(), None);
    let d =
        tent::control::client::fetch_descriptor(&off.segment_name(), None, Duration::from_secs(5))
            .unwrap();
    assert_eq!(d.metrics_url, None);
}

#[test]
fn with_no_transport_the_engine_is_live_but_not_ready() {
    let mut c = test_config();
    c.transports.local.enable = false;
    c.transports.shm.enable = false;
    c.transports.tcp.enable = false;
    c.transports.rdma.enable = false;
    let e = Engine::new(c).unwrap();
    let url = e.http_url().unwrap().to_owned();
    assert_eq!(get(&url, "/health/live", None).0, 200);
    let (status, body) = get(&url, "/health/ready", None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no transport is installed"), "{body}");
    let (status, body) = get(&url, "/health", None);
    assert_eq!(status, 503);
    assert_eq!(json(&body)["ready"], false);
}

/// A local transport that panics in the worker on its first slice.
fn panics() -> common::stub::Synchronous {
    common::stub::Synchronous::new(TransportKind::Local, |_| panic!("injected worker panic"))
}

/// A worker that died (its thread panicked) makes the engine not ready,
/// and with its only worker dead, not live (before: `/health` said ready
/// with `"alive": 1`).
#[test]
fn a_dead_worker_makes_the_engine_neither_ready_nor_live() {
    let e = Engine::builder()
        .config(test_config())
        .transport(Arc::new(panics()))
        .build()
        .unwrap();
    let url = e.http_url().unwrap().to_owned();
    assert_eq!(get(&url, "/health/ready", None).0, 200);
    let m = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(op::Write::new(
            LocalAddr::new(m.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
            8,
        ))
        .unwrap();
    let _ = ring.submit();
    let t0 = Instant::now();
    while get(&url, "/health/ready", None).0 == 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still ready with its worker dead"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, body) = get(&url, "/health", None);
    assert_eq!(status, 503, "{body}");
    let h = json(&body);
    assert_eq!(h["engine"]["workers"]["alive"], 0, "{h}");
    assert!(h["reasons"][0].as_str().unwrap().contains("exited"), "{h}");
    assert_eq!(get(&url, "/health/live", None).0, 503);
    // The batch API says so too, at once, rather than queue into a ring
    // nobody drains.
    let b = e.allocate_batch(4).unwrap();
    let sqe = op::Write::new(
        LocalAddr::new(m.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
        8,
    )
    .build();
    let err = e.submit(b, &[sqe]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    // Its task will never complete: the engine is left, not dropped.
    std::mem::forget((e, m, ring));
}

/// With the control plane on the wildcard, the endpoint listens on (and
/// advertises) an address of this host, never 0.0.0.0.
#[test]
fn a_wildcard_control_address_does_not_put_the_endpoint_on_the_wildcard() {
    let mut c = test_config();
    c.rpc_server_hostname = "0.0.0.0".into();
    c.transports.tcp.enable = false;
    let e = Engine::new(c).unwrap();
    let url = e.http_url().unwrap().to_owned();
    assert!(!url.starts_with("http://0.0.0.0"), "{url}");
    assert_eq!(get(&url, "/health/live", None).0, 200);
}

/// A link-local IPv6 control address (with its scope) builds with the
/// endpoint on, which listens there too (before: the scope was dropped
/// and the bind failed, `EINVAL`).
#[test]
fn a_scoped_ipv6_control_address_builds_with_the_endpoint() {
    let text = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
    let Some(host) = text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 6 && f[0].starts_with("fe80") && f[5] != "lo").then(|| {
            let ip: Vec<&str> = (0..8).map(|i| &f[0][4 * i..4 * i + 4]).collect();
            let ip: std::net::Ipv6Addr = ip.join(":").parse().unwrap();
            format!("{ip}%{}", f[5])
        })
    }) else {
        eprintln!("no link-local IPv6 address on this host: nothing to check");
        return;
    };
    let mut c = test_config();
    c.rpc_server_hostname = host.clone();
    c.transports.tcp.enable = false;
    let e = Engine::new(c).unwrap_or_else(|e| panic!("{host}: {e:?}"));
    let url = e.http_url().unwrap();
    assert!(
        url.starts_with("http://[fe80::") && url.contains("%25"),
        "{url}"
    );
}

/// A thousand connections that never finish their request, a client that
/// never reads its answers and a scrape loop, all at once, while a ring
/// moves data: every transfer completes, none waits on the endpoint, and
/// a liveness probe and the scrapes still get their answers.
#[test]
fn slow_clients_a_client_that_never_reads_and_a_scrape_loop_do_not_disturb_transfers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let e = Engine::new(test_config()).unwrap();
    let url = e.http_url().expect("endpoint on by default").to_owned();
    let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut hostile = Vec::new();
    // A thousand slow clients: each sends half a request, then a byte now
    // and then, and reconnects when the server closes it.
    hostile.push(std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut conns: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                conns.retain_mut(|c| c.write_all(b"X").is_ok());
                while conns.len() < 1000 {
                    let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                    else {
                        break;
                    };
                    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
                    conns.push(c);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }));
    // A client that asks for /metrics again and again and never reads.
    hostile.push(std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
                    held.push(c);
                    if held.len() > 32 {
                        held.remove(0);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }));
    // A scrape loop, 100 a second, each on its own connection.
    let scraper = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut answered = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
                    let mut raw = Vec::new();
                    if s.read_to_end(&mut raw).is_ok() && raw.starts_with(b"HTTP/1.1 200") {
                        answered += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            answered
        }
    });
    std::thread::sleep(Duration::from_millis(300));

    let (src, dst) = (
        e.allocate_memory(1 << 20).unwrap(),
        e.allocate_memory(1 << 20).unwrap(),
    );
    let mut ring = e.ring_with_depth(64).unwrap();
    let start = Instant::now();
    let (mut done, mut worst) = (0u64, Duration::ZERO);
    let mut last = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        {
            let mut sq = ring.submission();
            for i in 0..32u64 {
                sq.push(
                    op::Write::new(
                        LocalAddr::new(src.id(), i * 4096),
                        RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * 4096),
                        4096,
                    )
                    // LOW: queued, through dispatch and completion (a HIGH
                    // one would be done at intake).
                    .priority(tent::Priority::Low)
                    .user_data(i),
                )
                .unwrap();
            }
        }
        ring.submit().unwrap();
        let mut got = 0;
        while got < 32 {
            for c in ring.completion() {
                assert!(c.result().is_ok(), "{c:?}");
                got += 1;
                worst = worst.max(last.elapsed());
                last = Instant::now();
            }
            assert!(last.elapsed() < Duration::from_secs(20), "no completion");
            std::thread::yield_now();
        }
        done += 32;
    }
    // A probe gets through while the hostile clients are still there.
    let (status, _) = get(&url, "/health/live", None);
    stop.store(true, Ordering::Relaxed);
    for h in hostile {
        h.join().unwrap();
    }
    let scrapes = scraper.join().unwrap();
    assert_eq!(status, 200);
    assert!(done > 0);
    // Far past any scheduling delay of a loaded machine, and past the
    // server's 2 s deadline several times over: a worker that waited on
    // the endpoint (a lock, a slow client) shows as a stall this long.
    assert!(
        worst < Duration::from_secs(10),
        "a completion came {worst:?} after the one before: the worker waited on the endpoint"
    );
    assert!(scrapes > 0, "no scrape was answered");
}

/// With `metrics/max_labelled_peers` 1 and three peers, the peer that
/// carried the most bytes keeps its own rail series and the other two are
/// summed into `segment="_other"`: no byte is lost from the totals.
#[test]
fn peers_past_the_label_cap_are_summed_into_other() {
    let targets: Vec<Engine> = (0..3).map(|_| common::engine()).collect();
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.metrics.max_labelled_peers = 1;
    let init = Engine::new(c).unwrap();
    let local = init.allocate_memory(1 << 20).unwrap();
    let mut ring = init.ring().unwrap();
    let mut carried = 0u64;
    for (k, t) in targets.iter().enumerate() {
        let remote = t.allocate_memory(1 << 20).unwrap();
        let seg = init.open_segment(&t.segment_name()).unwrap();
        // The first target carries the most.
        let len = if k == 0 { 1 << 20 } else { 4096 };
        ring.submission()
            .push(op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, remote.addr()),
                len,
            ))
            .unwrap();
        assert_eq!(common::reap(&mut ring, 1)[0].result(), Ok(len));
        carried += len;
    }
    let text = init.metrics_text();
    let rails: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tent_rail_bytes_total{"))
        .collect();
    let first = format!("segment=\"{}\"", targets[0].segment_name());
    assert!(rails.iter().any(|l| l.contains(&first)), "{rails:#?}");
    assert!(
        rails.iter().any(|l| l.contains("segment=\"_other\"")),
        "{rails:#?}"
    );
    for t in &targets[1..] {
        let own = format!("segment=\"{}\"", t.segment_name());
        assert!(!rails.iter().any(|l| l.contains(&own)), "{rails:#?}");
    }
    let total: u64 = rails
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, carried, "{rails:#?}");
}

/// `/health` names each peer's incarnation (from its descriptor, new tag
/// `0x000c`), the one the peer's own `/health` gives for itself, how it is
/// reached in a word (before: `kind` was the whole descriptor's debug
/// text, regions and GIDs included), its state (serving, suspect, gone)
/// and its control address.
#[test]
fn health_names_each_peers_incarnation_and_kind() {
    let target = common::engine();
    let mut c = test_config();
    c.transports.shm.enable = false;
    let init = Engine::new(c).unwrap();
    init.open_segment(&target.segment_name()).unwrap();
    let (_, own) = get(target.http_url().unwrap(), "/health", None);
    let own = json(&own)["engine"]["incarnation"].clone();
    assert!(own.as_str().is_some_and(|i| i.len() == 16), "{own}");
    let (_, body) = get(init.http_url().unwrap(), "/health", None);
    let health = json(&body);
    let peer = &health["peers"][0];
    assert_eq!(peer["segment"], target.segment_name().as_str(), "{health}");
    assert_eq!(peer["incarnation"], own, "{health}");
    assert_eq!(peer["kind"], "remote", "{health}");
    assert_eq!(peer["state"], "serving", "{health}");
    assert_eq!(peer["control"], target.segment_name().as_str(), "{health}");
}
