//! The client against a real etcd: each test starts its own member on free
//! loopback ports with a fresh data directory, and kills it at the end.
//! The `etcd` binary comes from Debian's `etcd-server` (tools/setup.sh);
//! without it these tests fail, saying so, rather than skip.

use std::time::{Duration, Instant};

use serde_json::json;

use super::test_server::{EtcdServer, free_ports};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The next event within `within`, skipping timeout ticks.
fn next_event(w: &mut Watch, within: Duration) -> WatchEvent {
    let deadline = Instant::now() + within;
    loop {
        if let Some(e) = w.next(Duration::from_millis(200)).expect("watch") {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no watch event within {within:?}"
        );
    }
}

#[test]
fn put_get_range_delete() {
    let etcd = EtcdServer::start();
    let c = etcd.client();
    assert_eq!(c.get(b"/t/a").unwrap(), None);
    let r1 = c.put(b"/t/a", b"v1", None).unwrap();
    let r2 = c.put(b"/t/b", b"\x00\xffbinary", None).unwrap();
    c.put(b"/u/x", b"outside", None).unwrap();
    assert!(r2 > r1 && r1 > 0);
    assert_eq!(c.get(b"/t/a").unwrap(), Some((b"v1".to_vec(), r1)));

    let range = c.range_prefix(b"/t/").unwrap();
    let keys: Vec<_> = range.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [&b"/t/a"[..], b"/t/b"]);
    assert_eq!(range.kvs[1].value, b"\x00\xffbinary");
    assert!(range.revision >= r2);

    assert!(c.delete(b"/t/a").unwrap());
    assert!(!c.delete(b"/t/a").unwrap());
    assert_eq!(c.get(b"/t/a").unwrap(), None);
    assert_eq!(c.range_prefix(b"/t/").unwrap().kvs.len(), 1);
    assert_eq!(c.range_prefix(b"/none/").unwrap().kvs, vec![]);
}

#[test]
fn lease_kept_alive_then_expiry_is_a_delete_on_the_watch() {
    let etcd = EtcdServer::start();
    let c = etcd.client();
    let (lease, ttl) = c.grant(Duration::from_secs(2)).unwrap();
    assert_eq!(ttl, 2);
    let start = c.range_prefix(b"/seg/").unwrap().revision + 1;
    let mut w = c.watch_prefix(b"/seg/", start).unwrap();
    let rev = c.put(b"/seg/a", b"desc", Some(lease)).unwrap();
    // Kept alive at once: the set-up above may take a while on a loaded
    // machine, and the TTL is etcd's shortest.
    assert_eq!(c.keep_alive(lease).unwrap(), 2);
    assert_eq!(
        next_event(&mut w, TIMEOUT),
        WatchEvent::Put {
            key: b"/seg/a".to_vec(),
            value: b"desc".to_vec(),
            mod_revision: rev,
            lease: Some(lease),
        }
    );
    // Kept alive past its TTL, the key stays.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(c.keep_alive(lease).unwrap(), 2);
    }
    assert!(c.get(b"/seg/a").unwrap().is_some());
    assert_eq!(w.next(Duration::ZERO).unwrap(), None);
    // Left alone, it expires: a Delete naming the lease, within TTL + the
    // lessor's 0.5 s check.
    let left = Instant::now();
    match next_event(&mut w, Duration::from_secs(5)) {
        WatchEvent::Delete {
            key, prev_lease, ..
        } => assert_eq!((key.as_slice(), prev_lease), (&b"/seg/a"[..], Some(lease))),
        e => panic!("expected the expiry's Delete, got {e:?}"),
    }
    assert!(
        left.elapsed() >= Duration::from_millis(1000),
        "expired early: {:?}",
        left.elapsed()
    );
    assert!(matches!(c.keep_alive(lease), Err(EtcdError::LeaseGone(l)) if l == lease));
    assert!(matches!(
        c.put(b"/seg/b", b"x", Some(lease)),
        Err(EtcdError::LeaseGone(_))
    ));

    // Revoking deletes at once; a second revoke finds no lease.
    let (lease2, _) = c.grant(Duration::from_secs(60)).unwrap();
    c.put(b"/seg/c", b"desc", Some(lease2)).unwrap();
    assert!(matches!(
        next_event(&mut w, TIMEOUT),
        WatchEvent::Put { .. }
    ));
    c.revoke(lease2).unwrap();
    assert!(
        matches!(next_event(&mut w, TIMEOUT), WatchEvent::Delete { prev_lease: Some(l), .. } if l == lease2)
    );
    assert!(matches!(c.revoke(lease2), Err(EtcdError::LeaseGone(_))));
    assert!(matches!(c.keep_alive(lease2), Err(EtcdError::LeaseGone(_))));
}

#[test]
fn watch_from_a_range_revision_has_no_gap_and_no_duplicate() {
    let etcd = EtcdServer::start();
    let c = etcd.client();
    for i in 0..3 {
        c.put(format!("/p/{i}").as_bytes(), b"before", None)
            .unwrap();
    }
    let range = c.range_prefix(b"/p/").unwrap();
    assert_eq!(range.kvs.len(), 3);
    // Changes between the range and the watch: the watch must report them.
    let between = c.put(b"/p/3", b"between", None).unwrap();
    let mut w = c.watch_prefix(b"/p/", range.revision + 1).unwrap();
    c.put(b"/other", b"not watched", None).unwrap();
    let after = c.put(b"/p/4", b"after", None).unwrap();
    c.delete(b"/p/0").unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_event(&mut w, TIMEOUT));
    }
    assert_eq!(seen[0].key(), b"/p/3");
    assert_eq!(seen[0].mod_revision(), between);
    assert_eq!(seen[1].key(), b"/p/4");
    assert_eq!(seen[1].mod_revision(), after);
    assert!(matches!(&seen[2], WatchEvent::Delete { key, prev_lease: None, .. } if key == b"/p/0"));
    // Nothing more: `next` waits its whole timeout, not one 100 ms read
    // tick (before, it gave up after the first tick).
    let t = Instant::now();
    assert_eq!(w.next(Duration::from_millis(600)).unwrap(), None);
    assert!(t.elapsed() >= Duration::from_millis(600), "{:?}", t.elapsed());
}

#[test]
fn watch_from_a_compacted_revision_is_canceled_typed() {
    let etcd = EtcdServer::start();
    let c = etcd.client();
    let mut last = 0;
    for i in 0..4 {
        last = c.put(b"/k", format!("{i}").as_bytes(), None).unwrap();
    }
    c.post(
        "/v3/kv/compaction",
        json!({ "revision": last.to_string(), "physical": true }),
    )
    .unwrap();
    let err = c
        .watch_prefix(b"/k", 1)
        .and_then(|mut w| w.next(TIMEOUT))
        .unwrap_err();
    match &err {
        EtcdError::WatchCanceled {
            compact_revision, ..
        } => assert_eq!(*compact_revision, last),
        e => panic!("expected WatchCanceled, got {e:?}"),
    }
    assert_eq!(err.into_error().kind(), crate::ErrorKind::Canceled);
}

#[test]
fn a_stopped_etcd_ends_the_watch_and_fails_calls_unreachable() {
    let mut etcd = EtcdServer::start();
    let c = etcd.client();
    let mut w = c.watch_prefix(b"/x/", 1).unwrap();
    etcd.kill();
    let deadline = Instant::now() + TIMEOUT;
    let err = loop {
        match w.next(Duration::from_millis(200)) {
            Ok(None) if Instant::now() < deadline => continue,
            r => break r.unwrap_err(),
        }
    };
    assert!(matches!(err, EtcdError::WatchClosed(_)), "{err:?}");
    let err = c.put(b"/x/a", b"v", None).unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::Unreachable, "{err:?}");
}

#[test]
fn connect_names_every_endpoint_when_none_answers() {
    // Ports nothing listens on (bound then released).
    let [a, b] = free_ports::<2>();
    let endpoints = vec![
        format!("127.0.0.1:{a}"),
        format!("http://127.0.0.1:{b}/"),
    ];
    let err = EtcdClient::connect(&endpoints, Duration::from_millis(500)).unwrap_err();
    let text = err.to_string();
    for e in &endpoints {
        assert!(text.contains(e.as_str()), "{text} does not name {e}");
    }
    assert_eq!(
        err.into_error().kind(),
        crate::ErrorKind::Unreachable
    );

    let err = EtcdClient::connect(&["grpc://127.0.0.1:1".into()], TIMEOUT).unwrap_err();
    assert!(matches!(err, EtcdError::Invalid(_)), "{err:?}");
    let err = EtcdClient::connect(&["127.0.0.1:1/v3?x".into()], TIMEOUT).unwrap_err();
    assert!(matches!(err, EtcdError::Invalid(_)), "{err:?}");
    assert!(matches!(
        EtcdClient::connect(&[], TIMEOUT),
        Err(EtcdError::Invalid(_))
    ));
}

#[test]
fn prefix_end_is_the_first_key_past_the_prefix() {
    assert_eq!(prefix_end(b"/t/"), b"/t0");
    assert_eq!(prefix_end(b"a\xff\xff"), b"b");
    assert_eq!(prefix_end(b"\xff"), b"\0");
    assert_eq!(prefix_end(b""), b"\0");
}

#[test]
fn user_and_password_auth_with_token_renewal() {
    // Tokens live 1 s, so that the test sees one expire.
    let etcd = EtcdServer::start_with(&["--auth-token-ttl", "1"]);
    let admin = etcd.client();
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    for (path, body) in [
        ("/v3/auth/role/add", json!({ "name": "root" })),
        ("/v3/auth/user/add", json!({ "name": "root", "password": "rootpw" })),
        ("/v3/auth/user/grant", json!({ "user": "root", "role": "root" })),
        ("/v3/auth/role/add", json!({ "name": "tent" })),
        (
            "/v3/auth/role/grant",
            json!({ "name": "tent", "perm": {
                "permType": "READWRITE", "key": b64(b"/tent/"), "range_end": b64(b"/tent0") } }),
        ),
        ("/v3/auth/user/add", json!({ "name": "tent", "password": "tentpw" })),
        ("/v3/auth/user/grant", json!({ "user": "tent", "role": "tent" })),
    ] {
        admin.post(path, body).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let endpoints = [etcd.endpoint().to_owned()];
    let creds = |password: &str| {
        Some(Credentials {
            user: "tent".into(),
            password: crate::Secret::new(password),
        })
    };
    // Credentials for a cluster without auth: a configuration error.
    let err = EtcdClient::connect_with(&endpoints, TIMEOUT, creds("tentpw")).unwrap_err();
    assert!(matches!(err, EtcdError::AuthFailed(_)), "{err:?}");
    admin.post("/v3/auth/enable", json!({})).unwrap();

    // No token: refused.
    assert!(admin.put(b"/tent/a", b"v", None).is_err());
    // A wrong password: AuthFailed, AccessDenied.
    let err = EtcdClient::connect_with(&endpoints, TIMEOUT, creds("wrong")).unwrap_err();
    assert!(matches!(err, EtcdError::AuthFailed(_)), "{err:?}");
    assert_eq!(err.kind(), crate::ErrorKind::AccessDenied);

    let c = EtcdClient::connect_with(&endpoints, TIMEOUT, creds("tentpw")).unwrap();
    assert!(!format!("{c:?}").contains("tentpw"), "{c:?}");
    let rev = c.put(b"/tent/a", b"v", None).unwrap();
    assert_eq!(c.get(b"/tent/a").unwrap(), Some((b"v".to_vec(), rev)));
    // Outside the role's prefix: permission denied.
    let err = c.put(b"/other", b"v", None).unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::AccessDenied, "{err:?}");
    let mut w = c.watch_prefix(b"/tent/", rev + 1).unwrap();

    // Once the token expired, a call renews it and goes through.
    std::thread::sleep(Duration::from_millis(2500));
    let rev2 = c.put(b"/tent/b", b"w", None).unwrap();
    assert_eq!(next_event(&mut w, TIMEOUT).mod_revision(), rev2);
}
