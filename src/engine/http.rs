//! The engine's HTTP endpoint (`metrics/http_enable`, on by default): what
//! each path serves, from the [`Observer`], on the server's own thread.
//!
//! | path | status | body |
//! |---|---|---|
//! | `/metrics` | 200 | OpenMetrics text exposition (`Engine::metrics_text`) |
//! | `/metrics/json` | 200 | the same samples as JSON: `[{"name", "labels", "value"}]` |
//! | `/health` | 200 ready, 503 not | the engine, its workers, transports, peers and their rails |
//! | `/health/live` | 200 | `live` while the engine exists (open even with a secret) |
//! | `/health/ready` | 200 or 503 | `ready`, or why not |
//! | `/topology` | 200 | NUMA nodes and CPUs, where workers run, the RDMA NICs in use |
//!
//! It listens on the control plane's address (never the wildcard), at
//! `metrics/http_port`; a port taken falls back to an ephemeral one with a
//! warning. With `rpc_shared_secret` set, every path but `/health/live`
//! needs the bearer token derived from the secret
//! ([`super::Engine::http_bearer_token`]): `/health` and `/topology` name
//! peers, GIDs and addresses.

use std::net::{IpAddr, SocketAddr, SocketAddrV6, TcpListener};
use std::sync::Arc;

use serde_json::{Value, json};

use super::observe::Observer;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::http::{Bearer, HttpCounters, HttpServer, Response, Routes};

/// The OpenMetrics text format's content type (what `prometheus-client`
/// writes: `_total` counters, `# EOF`).
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The paths, answered from the observer.
#[derive(Debug)]
struct EngineRoutes {
    observer: Arc<Observer>,
}

impl Routes for EngineRoutes {
    fn get(&self, path: &str, _query: Option<&str>) -> Response {
        let o = &self.observer;
        match path {
            "/metrics" => Response {
                status: 200,
                content_type: OPENMETRICS_TEXT,
                body: o.metrics_text().into_bytes(),
            },
            "/metrics/json" => Response::json(200, samples_json(&o.metrics_text()).to_string()),
            "/health" => {
                let ready = o.readiness().ready;
                Response::json(if ready { 200 } else { 503 }, o.health_json().to_string())
            }
            "/health/live" => {
                if o.live() {
                    Response::text(200, "live\n")
                } else {
                    Response::text(503, "not live: every worker has exited\n")
                }
            }
            "/health/ready" => {
                let r = o.readiness();
                if r.ready {
                    Response::text(200, "ready\n")
                } else {
                    Response::text(503, format!("not ready: {}\n", r.reasons.join("; ")))
                }
            }
            "/topology" => Response::json(200, o.topology_json().to_string()),
            "/" => Response::text(
                200,
                "tent: /metrics /metrics/json /health /health/live /health/ready /topology\n",
            ),
            _ => Response::text(404, format!("no such path: {path}\n")),
        }
    }
}

/// Where the endpoint listens: the control plane's address (its scope kept
/// for a link-local IPv6 one), never the wildcard: for a wildcard control
/// address, the first address the TCP rails would advertise.
pub(super) fn address(config: &Config, control: IpAddr, scope: u32) -> SocketAddr {
    let port = config.metrics.http_port;
    let ip = if control.is_unspecified() {
        crate::transport::tcp::advertised_addrs(control)
            .first()
            .map_or(IpAddr::from([127, 0, 0, 1]), |(_, ip)| *ip)
    } else {
        control
    };
    match ip {
        IpAddr::V6(v6) => {
            SocketAddrV6::new(v6, port, 0, if ip == control { scope } else { 0 }).into()
        }
        IpAddr::V4(_) => SocketAddr::new(ip, port),
    }
}

/// Bind the endpoint's listener (before the workers start: a failure
/// leaves nothing running), when the configuration asks for one.
pub(super) fn bind(config: &Config, addr: SocketAddr) -> Result<Option<TcpListener>> {
    if !config.metrics.http_enable {
        return Ok(None);
    }
    let (listener, fell_back) = HttpServer::bind(addr).map_err(|e| {
        Error::invalid(format!("metrics/http_port: cannot listen on {addr}")).with_source(e)
    })?;
    if fell_back {
        let now = listener.local_addr().map_or(0, |a| a.port());
        crate::lograte::warn_limited!(
            ("http port taken", addr.port()),
            port = addr.port(),
            ephemeral = now,
            "HTTP endpoint: metrics/http_port is taken; listening on an ephemeral port instead"
        );
    }
    Ok(Some(listener))
}

/// The URL of a listener at `addr`: `http://ip:port`, `http://[v6]:port`,
/// a scope written `%25` as URLs spell `%`.
pub(super) fn url_of(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V6(a) if a.scope_id() != 0 => {
            format!("http://[{}%25{}]:{}", a.ip(), a.scope_id(), a.port())
        }
        a => format!("http://{a}"),
    }
}

/// Serve the paths on `listener` (see the module doc), counting into
/// `counters` (which the observer shows as `tent_http_*`).
pub(super) fn start(
    config: &Config,
    listener: TcpListener,
    observer: &Arc<Observer>,
    counters: Arc<HttpCounters>,
) -> Result<HttpServer> {
    let bearer = config.secret().map(Bearer::from_secret);
    let server = HttpServer::start(
        listener,
        Arc::new(EngineRoutes {
            observer: observer.clone(),
        }),
        bearer,
        counters,
    )?;
    let url = url_of(server.local_addr());
    tracing::info!(metrics = %format!("{url}/metrics"), health = %format!("{url}/health"),
        authenticated = config.secret().is_some(), "HTTP endpoint listening");
    Ok(server)
}

/// The samples of an OpenMetrics (or Prometheus) text exposition as JSON:
/// one object per sample line, its labels as an object (`# HELP`, `# TYPE`,
/// `# UNIT` and `# EOF` skipped). The text is
/// this engine's own rendering, so a line that does not parse is a defect
/// here; it is kept whole under `"unparsed"` rather than dropped.
fn samples_json(text: &str) -> Value {
    let samples: Vec<Value> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match parse_sample(l) {
            Some((name, labels, value)) => {
                let labels: serde_json::Map<String, Value> = labels
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                json!({ "name": name, "labels": labels, "value": value })
            }
            None => json!({ "unparsed": l }),
        })
        .collect();
    Value::Array(samples)
}

/// A sample's labels, in the order written.
type Labels = Vec<(String, String)>;

/// `name{k="v",...} value` (or `name value`): the name, the labels with
/// their escapes (`\\`, `\"`, `\n`) undone, and the value as a number
/// (`+Inf`, `-Inf` and `NaN` as strings, which JSON has no number for).
fn parse_sample(line: &str) -> Option<(String, Labels, Value)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices();
        let mut key = String::new();
        loop {
            // A key up to `=`, then a quoted value.
            let (_, c) = chars.next()?;
            match c {
                '}' => break,
                ',' => continue,
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                c => key.push(c),
            }
        }
        let used = chars.next().map_or(after.len(), |(i, _)| i);
        rest = &after[used..];
    }
    let value = rest.trim();
    let value = match value.parse::<f64>() {
        Ok(v) if v.is_finite() => json!(v),
        _ if ["+Inf", "-Inf", "NaN"].contains(&value) => json!(value),
        _ => return None,
    };
    Some((name.to_owned(), labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_read_back_with_their_labels_and_escapes() {
        let text = "# HELP a x\n# TYPE a counter\n# UNIT a bytes\na_total 3\nb{seg=\"10.0.0.1:7\",dev=\"q\\\"x\\\\y\\nz\"} 2.5\nc{le=\"+Inf\"} +Inf\n# EOF\n";
        let v = samples_json(text);
        assert_eq!(
            v,
            json!([
                { "name": "a_total", "labels": {}, "value": 3.0 },
                { "name": "b", "labels": { "seg": "10.0.0.1:7", "dev": "q\"x\\y\nz" }, "value": 2.5 },
                { "name": "c", "labels": { "le": "+Inf" }, "value": "+Inf" },
            ])
        );
        assert_eq!(samples_json("junk{\n"), json!([{ "unparsed": "junk{" }]));
    }
}
