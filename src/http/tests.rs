//! The decision without sockets, then a real server and real clients:
//! routes, methods, bounds, bearer, deadlines and the cap.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::request::{Verdict, answer, head_end};
use super::*;

/// [`FixedRoutes`], and `/big` (8 MiB), `/panic`.
struct TestRoutes;

const BIG: usize = 8 << 20;

impl Routes for TestRoutes {
    fn get(&self, path: &str, query: Option<&str>) -> Response {
        match path {
            "/big" => Response {
                status: 200,
                content_type: "application/octet-stream",
                body: vec![7; BIG],
            },
            "/panic" => panic!("a route that panics (expected by the test)"),
            _ => FixedRoutes.get(path, query),
        }
    }
}

fn status_of(head: &[u8], bearer: Option<&Bearer>) -> u16 {
    answer(head, &TestRoutes, bearer).response.status
}

#[test]
fn head_end_finds_the_blank_line_in_any_line_ending() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n", 0), Some(18));
    assert_eq!(head_end(b"GET / HTTP/1.1\n\n", 0), Some(16));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\n\r\nrest", 0), Some(23));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
    // A terminator straddling what was looked at already.
    let h = b"GET / HTTP/1.1\r\n\r\n";
    for from in 0..h.len() {
        assert_eq!(head_end(h, from), Some(18), "from {from}");
    }
}

#[test]
fn answers_get_head_and_refuses_the_rest() {
    let ok = answer(
        b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
        &TestRoutes,
        None,
    );
    assert_eq!(ok.response.status, 200);
    assert_eq!(ok.verdict, Verdict::Routed);
    assert!(String::from_utf8_lossy(&ok.response.body).contains("# query x=1"));
    let head = String::from_utf8(ok.head()).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains(&format!("Content-Length: {}\r\n", ok.response.body.len())));
    assert!(head.contains("Connection: keep-alive\r\n") && head.ends_with("\r\n\r\n"));

    let h = answer(b"HEAD /metrics HTTP/1.0\r\n\r\n", &TestRoutes, None);
    assert_eq!(h.response.status, 200);
    assert!(h.body().is_empty() && !h.response.body.is_empty());

    assert_eq!(status_of(b"GET /nope HTTP/1.1\r\n\r\n", None), 404);
    let post = answer(b"POST /metrics HTTP/1.1\r\n\r\n", &TestRoutes, None);
    assert_eq!(
        (post.response.status, post.verdict),
        (405, Verdict::BadRequest)
    );
    assert!(
        String::from_utf8(post.head())
            .unwrap()
            .contains("Allow: GET, HEAD\r\n")
    );
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET * HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n",
        b"GET / HTTP/1.1\r\n",
        b"",
    ] {
        assert_eq!(
            status_of(bad, None),
            400,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        status_of(b"GET / HTTP/1.1\r\nContent-Length: 000\r\n\r\n", None),
        404
    );
    for body in [
        &b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\nbody",
    ] {
        assert_eq!(
            status_of(body, None),
            413,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET));
    assert_eq!(status_of(long.as_bytes(), None), 414);
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    assert_eq!(
        status_of(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes(), None),
        431
    );
    let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    assert_eq!(status_of(huge.as_bytes(), None), 431);
    assert_eq!(status_of(b"GET /panic HTTP/1.1\r\n\r\n", None), 500);
}

#[test]
fn bearer_is_required_but_for_liveness_and_never_printed() {
    let b = Bearer::from_secret(b"s3cret");
    assert_eq!(b.token().len(), 64);
    assert_ne!(b.token(), Bearer::from_secret(b"other").token());
    assert!(!format!("{b:?}").contains(b.token()));
    let get = |path: &str, auth: &str| {
        let req = format!("GET {path} HTTP/1.1\r\n{auth}\r\n");
        answer(req.as_bytes(), &TestRoutes, Some(&b))
    };
    let none = get("/metrics", "");
    assert_eq!(
        (none.response.status, none.verdict),
        (401, Verdict::Unauthorized)
    );
    assert!(
        String::from_utf8(none.head())
            .unwrap()
            .contains("WWW-Authenticate: Bearer\r\n")
    );
    let wrong = format!(
        "Authorization: Bearer {}\r\n",
        Bearer::from_secret(b"other").token()
    );
    assert_eq!(get("/metrics", &wrong).response.status, 401);
    assert_eq!(
        get("/metrics", "Authorization: Basic eDp5\r\n")
            .response
            .status,
        401
    );
    let right = format!("Authorization: Bearer {}\r\n", b.token());
    assert_eq!(get("/metrics", &right).response.status, 200);
    let cased = format!("authorization: bEaReR   {} \r\n", b.token());
    assert_eq!(get("/metrics", &cased).response.status, 200);
    assert_eq!(get("/health/live", "").response.status, 200);
    let head = answer(b"HEAD /metrics HTTP/1.1\r\n\r\n", &TestRoutes, Some(&b));
    assert_eq!(head.response.status, 401);
    assert!(
        head.head_only && head.body().is_empty(),
        "a refused HEAD is a head alone"
    );
    assert_eq!(get("/health/live?x", "").response.status, 200);
    assert_eq!(
        get("/nope", "").response.status,
        401,
        "no route probing without the token"
    );
    assert_eq!(
        answer(b"GET /metrics HTTP/1.1\r\n\r\n", &TestRoutes, None)
            .response
            .status,
        200
    );
}

fn server(bearer: Option<Bearer>) -> HttpServer {
    let (listener, fell_back) = HttpServer::bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    assert!(!fell_back);
    HttpServer::start(listener, Arc::new(TestRoutes), bearer, Arc::default()).unwrap()
}

/// Send `req`, read to the end: (status, head, body).
fn exchange(addr: SocketAddr, req: &[u8]) -> std::io::Result<(u16, String, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    // A bound on a broken test, not a timing assumption.
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(req)?;
    read_response(&mut s, req.starts_with(b"HEAD"))
}

/// One response from `s`: its head, then as many body bytes as its
/// `Content-Length` says (none for `head_only`), or to the end when it has
/// none. The connection may stay open (keep-alive).
fn read_response(s: &mut TcpStream, head_only: bool) -> std::io::Result<(u16, String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::Error::other("no response head"));
        }
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).unwrap();
    let status = head[9..12].parse().unwrap();
    let mut body = Vec::new();
    match header(&head, "content-length").map(|l| l.parse::<usize>().unwrap()) {
        _ if head_only => {}
        Some(len) => {
            body.resize(len, 0);
            s.read_exact(&mut body)?;
        }
        None => {
            s.read_to_end(&mut body)?;
        }
    }
    Ok((status, head, body))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        l.split_once(": ")
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// Wait for `cond` on the server's stats, until `within`.
fn wait_stats(s: &HttpServer, within: Duration, cond: impl Fn(&HttpStats) -> bool) -> HttpStats {
    let until = Instant::now() + within;
    loop {
        let st = s.stats();
        if cond(&st) {
            return st;
        }
        assert!(Instant::now() < until, "stats never got there: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_real_client_gets_routes_and_refusals() {
    let s = server(None);
    let a = s.local_addr();
    let (st, head, body) = exchange(a, b"GET /metrics?q HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(st, 200, "{head}");
    assert_eq!(
        header(&head, "content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(header(&head, "connection"), Some("keep-alive"));
    assert_eq!(
        header(&head, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(String::from_utf8(body).unwrap().starts_with("tent_up 1\n"));

    let (st, head, body) = exchange(a, b"HEAD /metrics HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(st, 200);
    assert!(body.is_empty());
    assert_ne!(header(&head, "content-length"), Some("0"));

    assert_eq!(
        exchange(a, b"DELETE /metrics HTTP/1.1\r\n\r\n").unwrap().0,
        405
    );
    assert_eq!(
        exchange(a, b"GET /metrics HTTX/1.1\r\n\r\n").unwrap().0,
        400
    );
    let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(2 * MAX_TARGET));
    assert_eq!(exchange(a, long.as_bytes()).unwrap().0, 414);
    // A head that never ends within 8 KiB: 431, and the connection closes
    // (read_to_end returned) though the client sent more.
    let huge = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD + 1024));
    assert_eq!(exchange(a, huge.as_bytes()).unwrap().0, 431);
    assert_eq!(exchange(a, b"GET /panic HTTP/1.1\r\n\r\n").unwrap().0, 500);
    let st = wait_stats(&s, Duration::from_secs(5), |st| st.served == 7);
    assert_eq!(
        (
            st.accepted,
            st.bad_request,
            st.too_large,
            st.evicted,
            st.timed_out
        ),
        (7, 2, 2, 0, 0)
    );
    // By status class: two 200s; 405, 400, 414, 431; the panic's 500.
    assert_eq!(st.by_class, [0, 2, 0, 4, 1]);
}

#[test]
fn bearer_over_tcp() {
    let b = Bearer::from_secret(b"shared");
    let token = b.token().to_owned();
    let s = server(Some(b));
    let a = s.local_addr();
    let (st, head, _) = exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(st, 401);
    assert_eq!(header(&head, "www-authenticate"), Some("Bearer"));
    let wrong = format!(
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer {}\r\n\r\n",
        "0".repeat(64)
    );
    assert_eq!(exchange(a, wrong.as_bytes()).unwrap().0, 401);
    let right = format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n");
    assert_eq!(exchange(a, right.as_bytes()).unwrap().0, 200);
    assert_eq!(
        exchange(a, b"GET /health/live HTTP/1.1\r\n\r\n").unwrap().0,
        200
    );
    assert_eq!(
        wait_stats(&s, Duration::from_secs(5), |st| st.served == 4).unauthorized,
        2
    );
    assert!(!format!("{s:?}").contains(&token));
}

#[test]
fn stalled_clients_over_the_cap_do_not_keep_a_client_out() {
    let s = server(None);
    let a = s.local_addr();
    // 200 slowloris clients: one byte each, then nothing. Past the cap each
    // newcomer takes the oldest one's slot.
    let stalled: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut c = TcpStream::connect(a).unwrap();
            let _ = c.write_all(b"G");
            c
        })
        .collect();
    let st = wait_stats(&s, Duration::from_secs(5), |st| st.accepted >= 200);
    assert!(st.evicted >= 200 - MAX_CONNECTIONS as u64, "{st:?}");
    // A normal client is served at once, long before their deadline.
    let t0 = Instant::now();
    let (status, _, _) = exchange(a, b"GET /health/live HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(status, 200);
    assert!(
        t0.elapsed() < EXCHANGE_TIMEOUT,
        "served after {:?}",
        t0.elapsed()
    );
    drop(stalled);
}

/// A client that keeps more than the cap open, each having sent a byte, and
/// opens a new one whenever the server closes one, cannot fail a liveness
/// probe (with the newcomer refused over the cap, it answered 0 of 30).
#[test]
fn a_client_reconnecting_its_stalled_connections_cannot_lock_a_probe_out() {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = server(None);
    let a = s.local_addr();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let open = |_| {
                let mut c = TcpStream::connect(a).unwrap();
                let _ = c.write_all(b"G");
                c.set_nonblocking(true).unwrap();
                c
            };
            let mut hog: Vec<TcpStream> = (0..MAX_CONNECTIONS + 32).map(open).collect();
            while !stop.load(Ordering::Relaxed) {
                for c in &mut hog {
                    let mut b = [0u8; 64];
                    let closed = match c.read(&mut b) {
                        Ok(n) => n == 0,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    if closed {
                        *c = open(0);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let (mut ok, mut tries) = (0, 0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            tries += 1;
            if matches!(
                exchange(a, b"GET /health/live HTTP/1.1\r\n\r\n"),
                Ok((200, _, _))
            ) {
                ok += 1;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        assert!(ok * 2 >= tries, "liveness answered {ok} of {tries} probes");
    });
}

#[test]
fn a_client_that_never_reads_is_closed_at_the_deadline() {
    let s = server(None);
    let a = s.local_addr();
    // A small receive window, so 8 MiB cannot all sit in socket buffers.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&a.into()).unwrap();
    let mut c: TcpStream = sock.into();
    let t0 = Instant::now();
    c.write_all(b"GET /big HTTP/1.1\r\n\r\n").unwrap();
    let st = wait_stats(&s, EXCHANGE_TIMEOUT + Duration::from_secs(3), |st| {
        st.timed_out == 1
    });
    let closed_after = t0.elapsed();
    assert!(
        closed_after >= EXCHANGE_TIMEOUT - Duration::from_millis(100),
        "{closed_after:?}"
    );
    assert_eq!(st.served, 0);
    // What arrived stops short of the body: the connection was cut.
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < BIG, "{got}");
    // The server goes on serving.
    assert_eq!(
        exchange(a, b"GET /health/live HTTP/1.1\r\n\r\n").unwrap().0,
        200
    );
}

#[test]
fn drop_stops_the_thread_at_once_and_closes_connections() {
    let s = server(None);
    let a = s.local_addr();
    let mut idle = TcpStream::connect(a).unwrap();
    idle.write_all(b"GET /hea").unwrap();
    wait_stats(&s, Duration::from_secs(5), |st| st.accepted == 1);
    let t0 = Instant::now();
    drop(s);
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(500), "drop took {took:?}");
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        matches!(idle.read(&mut b), Ok(0) | Err(_)),
        "the connection outlived the server"
    );
    assert!(
        TcpStream::connect(a).is_err(),
        "the listener outlived the server"
    );
}

#[test]
fn bind_falls_back_to_an_ephemeral_port_when_taken() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let (l, fell_back) = HttpServer::bind((Ipv4Addr::LOCALHOST, port).into()).unwrap();
    assert!(fell_back);
    assert_ne!(l.local_addr().unwrap().port(), port);
    drop(taken);
    let (l, fell_back) = HttpServer::bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    assert!(!fell_back);
    assert_ne!(l.local_addr().unwrap().port(), 0);
}

/// The `http_request` fuzz target's seeds: a mode byte (bit 0: a bearer of
/// [`FixedRoutes::SECRET`]) and a real request, each answered as named
/// here (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds` writes
/// them).
#[test]
fn fuzz_seeds_are_real_requests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/http_request");
    let token = Bearer::from_secret(FixedRoutes::SECRET).token().to_owned();
    let seeds: Vec<(&str, u8, String, u16)> = vec![
        (
            "get_metrics",
            0,
            "GET /metrics HTTP/1.1\r\nHost: localhost:9100\r\nAccept: */*\r\n\r\n".into(),
            200,
        ),
        (
            "head_live_http10",
            0,
            "HEAD /health/live HTTP/1.0\r\n\r\n".into(),
            200,
        ),
        (
            "get_query",
            0,
            "GET /metrics?format=text&x HTTP/1.1\r\nHost: h\r\n\r\n".into(),
            200,
        ),
        (
            "get_unknown",
            0,
            "GET /topology HTTP/1.1\r\n\r\n".into(),
            404,
        ),
        (
            "post_body",
            0,
            "POST /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\n".into(),
            405,
        ),
        (
            "get_body",
            0,
            "GET /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\n".into(),
            413,
        ),
        (
            "bearer_ok",
            1,
            format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n"),
            200,
        ),
        (
            "bearer_missing",
            1,
            "GET /metrics HTTP/1.1\r\n\r\n".into(),
            401,
        ),
        (
            "bearer_live_open",
            1,
            "GET /health/live HTTP/1.1\r\n\r\n".into(),
            200,
        ),
    ];
    if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, mode, req, _) in &seeds {
            std::fs::write(dir.join(name), [&[*mode][..], req.as_bytes()].concat()).unwrap();
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = seeds.iter().map(|s| s.0.to_owned()).collect();
    want.sort();
    assert_eq!(names, want, "fuzz/seeds/http_request holds other seeds");
    for (name, mode, req, status) in &seeds {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(
            bytes,
            [&[*mode][..], req.as_bytes()].concat(),
            "{name} is stale"
        );
        let bearer = (mode & 1 != 0).then(|| Bearer::from_secret(FixedRoutes::SECRET));
        assert_eq!(
            answer(&bytes[1..], &FixedRoutes, bearer.as_ref())
                .response
                .status,
            *status,
            "{name}"
        );
    }
}

/// HTTP/1.1 keeps the connection for the next request (a scrape loop pays
/// no connect and close per scrape); `Connection: close`, HTTP/1.0, a
/// refusal and bytes past a request's head close it after the answer.
#[test]
fn a_kept_alive_connection_carries_the_next_request() {
    let s = server(None);
    let a = s.local_addr();
    let mut c = TcpStream::connect(a).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..3 {
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let (st, head, body) = read_response(&mut c, false).unwrap();
        assert_eq!((st, header(&head, "connection")), (200, Some("keep-alive")));
        assert!(String::from_utf8(body).unwrap().starts_with("tent_up 1\n"));
    }
    assert_eq!(s.stats().accepted, 1, "one connection for three scrapes");
    // The client asks to close: the answer says so and the server closes.
    c.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (st, head, _) = read_response(&mut c, false).unwrap();
    assert_eq!((st, header(&head, "connection")), (200, Some("close")));
    assert_eq!(c.read(&mut [0; 1]).unwrap(), 0, "closed after it");
    for closing in [
        &b"GET /metrics HTTP/1.0\r\n\r\n"[..],
        b"GET /nope/../x HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
        // Pipelined: the first is answered, then the connection closes.
        b"GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n",
    ] {
        let mut c = TcpStream::connect(a).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(closing).unwrap();
        let (_, head, _) = read_response(&mut c, false).unwrap();
        assert_eq!(header(&head, "connection"), Some("close"), "{head}");
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "one answer only");
    }
}

/// A kept-alive connection idle past the deadline is closed, and not
/// counted as a client that failed its exchange.
#[test]
fn an_idle_kept_alive_connection_closes_uncounted() {
    let s = server(None);
    let mut c = TcpStream::connect(s.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut c, false).unwrap().0, 200);
    // Closed at its deadline (2 s after the answer).
    assert_eq!(c.read(&mut [0; 1]).unwrap(), 0);
    assert_eq!(s.stats().timed_out, 0, "{:?}", s.stats());
}
