//! rqlite's cluster endpoints on a node of a cluster: `/nodes` (every
//! voter, and with `nonvoters` every learner, each asked whether it is
//! reachable), `/join` and `/remove` (membership changes, carried out by
//! the leader whichever node takes them). On a daemon that is not a
//! cluster node `/nodes` describes that daemon alone, and `/join` and
//! `/remove` answer 503 and say so.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tablix_raft::{ClusterHandle, JoinRequest, NodeReport, ReadBarrier};

use crate::options::{Level, Options};
use crate::server::{App, Failure, Who, reply, require};

/// How long `/nodes` waits for each member's answer.
const ASK: Duration = Duration::from_secs(2);

fn handle(app: &App) -> Result<&ClusterHandle, Failure> {
    app.config.cluster.as_ref().ok_or_else(|| {
        Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "this daemon is not a node of a cluster (start it with --node-id and --raft)".into(),
        )
    })
}

/// rqlite's shape of one node: an id-keyed map by default, a list under
/// "nodes" with `ver=2`.
pub(crate) fn node_json(n: &NodeReport) -> Value {
    let mut v = json!({
        "id": n.id.to_string(),
        "api_addr": n.api_addr.clone().unwrap_or_default(),
        "addr": n.addr,
        "voter": n.voter,
        "reachable": n.reachable,
        "leader": n.leader,
        "time": n.time,
    });
    if let Some(e) = &n.error {
        v["error"] = json!(e);
    }
    v
}

pub(crate) async fn nodes(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let checked = who.and_then(|Who(caller, _)| require(caller.perms.status, &caller, "status"));
    if let Err(f) = checked {
        return f.into_response();
    }
    let Some(cluster) = app.config.cluster.clone() else {
        // A daemon that is no node of a cluster is its only node.
        let me = crate::maintenance::this_node(&app);
        let body = if params.get("ver").map(String::as_str) == Some("2") {
            json!({ "nodes": [me] })
        } else {
            let mut v = me;
            if let Some(o) = v.as_object_mut() {
                o.remove("id");
            }
            json!({ "1": v })
        };
        return Json(body).into_response();
    };
    let learners = params.contains_key("nonvoters");
    let reports = cluster.nodes(learners, ASK).await;
    let body = if params.get("ver").map(String::as_str) == Some("2") {
        json!({ "nodes": reports.iter().map(node_json).collect::<Vec<_>>() })
    } else {
        Value::Object(
            reports
                .iter()
                .map(|n| {
                    let mut v = node_json(n);
                    if let Some(o) = v.as_object_mut() {
                        o.remove("id");
                    }
                    (n.id.to_string(), v)
                })
                .collect(),
        )
    };
    Json(body).into_response()
}

/// rqlite's join request: ids are strings there; tablix's are numbers.
#[derive(Deserialize)]
struct Join {
    id: Value,
    addr: String,
    #[serde(default = "yes")]
    voter: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct Remove {
    id: Value,
}

fn node_id(v: &Value) -> Result<u64, Failure> {
    let parsed = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.filter(|id| *id > 0).ok_or_else(|| {
        Failure(
            StatusCode::BAD_REQUEST,
            format!("node id {v} is not a number above 0"),
        )
    })
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure(StatusCode::BAD_REQUEST, format!("malformed request: {e}")))
}

pub(crate) async fn join(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    body: Bytes,
) -> Response {
    let request = (|| -> Result<(ClusterHandle, JoinRequest), Failure> {
        let Who(caller, _) = who?;
        let j: Join = parse(&body)?;
        if j.voter {
            require(caller.perms.join, &caller, "join")?;
        } else {
            require(
                caller.perms.join || caller.perms.join_read_only,
                &caller,
                "join-read-only",
            )?;
        }
        let cluster = handle(&app)?.clone();
        Ok((
            cluster,
            JoinRequest {
                id: node_id(&j.id)?,
                addr: j.addr,
                voter: j.voter,
                fresh: false,
            },
        ))
    })();
    let (cluster, request) = match request {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    reply(
        cluster
            .join(request)
            .await
            .map(|()| StatusCode::OK.into_response())
            .map_err(|e| Failure(StatusCode::SERVICE_UNAVAILABLE, e)),
    )
}

pub(crate) async fn remove(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    body: Bytes,
) -> Response {
    let request = (|| -> Result<(ClusterHandle, u64), Failure> {
        let Who(caller, _) = who?;
        require(caller.perms.remove, &caller, "remove")?;
        let r: Remove = parse(&body)?;
        Ok((handle(&app)?.clone(), node_id(&r.id)?))
    })();
    let (cluster, id) = match request {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    reply(
        cluster
            .remove(id)
            .await
            .map(|()| StatusCode::OK.into_response())
            .map_err(|e| Failure(StatusCode::BAD_REQUEST, e)),
    )
}

/// What `/status` says of the cluster, in rqlite's words where rqlite has
/// them (`store.raft`, `store.leader`).
pub(crate) fn status_fields(app: &App) -> Option<(Value, Value, Value)> {
    let s = app.config.cluster.as_ref()?.status();
    let voter = s.members.iter().any(|m| m.id == s.id && m.voter);
    let raft = json!({
        "state": match s.state.as_str() {
            "leader" => "Leader",
            "follower" => "Follower",
            "candidate" => "Candidate",
            "learner" => "Learner",
            _ => "Shutdown",
        },
        "term": s.term,
        "applied_index": s.applied_index.unwrap_or(0),
        "last_log_index": s.last_log_index.unwrap_or(0),
        "snapshot_index": s.snapshot_index.unwrap_or(0),
        "voter": voter,
        "num_peers": s.members.len().saturating_sub(1),
    });
    let leader = json!({
        "node_id": s.leader.map(|l| l.to_string()).unwrap_or_default(),
        "addr": s.leader_addr.clone().unwrap_or_default(),
    });
    let cluster = serde_json::to_value(&s).unwrap_or(Value::Null);
    Some((raft, leader, cluster))
}

/// On a cluster node, waits until the node's state may serve a read of
/// `level`: `none` reads at once; `weak` (the default) once this node
/// applied what the leader has; `linearizable` once it applied what the
/// leader had committed when a quorum confirmed it leads; `strong` once it
/// applied an entry of the read's own through the log; `auto` is `none`
/// on a learner and `weak` elsewhere. A daemon that is not a cluster node
/// serves every level from its latest committed state.
pub(crate) async fn before_read(app: &App, o: &Options) -> Result<(), Failure> {
    let Some(cluster) = &app.config.cluster else {
        return Ok(());
    };
    let barrier = match o.level {
        Level::None => {
            return match o.freshness {
                Some(bound) => fresh_enough(cluster, bound, o.freshness_strict),
                None => Ok(()),
            };
        }
        Level::Auto if cluster.is_learner() => return Ok(()),
        Level::Weak | Level::Auto => ReadBarrier::Leader,
        Level::Linearizable => ReadBarrier::Quorum,
        Level::Strong => ReadBarrier::Log,
    };
    cluster
        .read_barrier(barrier)
        .await
        .map_err(|e| Failure(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

/// rqlite's `freshness` for `level=none`: a follower that heard from the
/// leader longer ago than `bound` refuses the read as stale; `strict`
/// refuses it too while entries this node holds are not applied yet. The
/// leader is always fresh.
fn fresh_enough(cluster: &ClusterHandle, bound: Duration, strict: bool) -> Result<(), Failure> {
    let Some(f) = cluster.freshness() else {
        return Ok(());
    };
    let stale = match f.since_leader {
        None => Some("this node has not heard from a leader".to_string()),
        Some(d) if d > bound => Some(format!(
            "this node last heard from the leader {} ms ago, more than freshness={} ms",
            d.as_millis(),
            bound.as_millis()
        )),
        Some(_) if strict && f.unapplied > 0 => Some(format!(
            "{} entries this node holds are not applied yet (freshness_strict)",
            f.unapplied
        )),
        Some(_) => None,
    };
    match stale {
        // rqlite answers a stale read 200 with the error in the body.
        Some(why) => Err(Failure(StatusCode::OK, format!("stale read: {why}"))),
        None => Ok(()),
    }
}

/// rqlite's `redirect`: on a node that does not lead, a write (or a read
/// at a level other than `none`) with `redirect` set is answered 301 to
/// the same path and query on the leader's API, instead of being
/// forwarded. A leader whose API is not known gets 503. Only a caller
/// the request's own checks would let through is told where the leader
/// is; any other gets the handler's refusal.
pub(crate) async fn redirect(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(cluster) = &app.config.cluster else {
        return next.run(request).await;
    };
    let pairs: Vec<(String, String)> = Query::try_from_uri(request.uri())
        .map(|Query(p)| p)
        .unwrap_or_default();
    let asked = pairs
        .iter()
        .any(|(k, v)| k == "redirect" && !matches!(v.as_str(), "false" | "0" | "no" | "off"));
    let local_read = request.uri().path() != "/db/execute"
        && pairs.iter().any(|(k, v)| k == "level" && v == "none");
    // An interactive transaction lives on the node that began it.
    let in_transaction = pairs.iter().any(|(k, _)| k == "tx");
    if !asked || local_read || in_transaction || cluster.is_leader() {
        return next.run(request).await;
    }
    // Only now is the caller attributed (the handler does it for every
    // other request): a password check is not paid twice.
    let (mut parts, body) = request.into_parts();
    let allowed = match Who::from_request_parts(&mut parts, &app).await {
        Ok(Who(caller, _)) if parts.uri.path() == "/db/execute" => caller.perms.execute,
        Ok(Who(caller, _)) => caller.perms.query || caller.perms.execute,
        Err(_) => false,
    };
    let request = axum::extract::Request::from_parts(parts, body);
    if !allowed {
        return next.run(request).await;
    }
    let query = request.uri().query().unwrap_or("");
    match cluster.leader_api(ASK).await {
        Some(api) => {
            let target = format!(
                "{}{}{}{}",
                api.trim_end_matches('/'),
                request.uri().path(),
                if query.is_empty() { "" } else { "?" },
                query
            );
            match axum::http::HeaderValue::from_str(&target) {
                Ok(location) => {
                    let mut r = StatusCode::MOVED_PERMANENTLY.into_response();
                    r.headers_mut()
                        .insert(axum::http::header::LOCATION, location);
                    r
                }
                Err(_) => Failure(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the leader's address {target:?} is not a valid Location"),
                )
                .into_response(),
            }
        }
        None => Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader not found: no leader is known, or its API address is not".into(),
        )
        .into_response(),
    }
}
