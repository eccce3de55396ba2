//! A node's raft service: the HTTP side of `transport.rs`. Every POST
//! carries a postcard body and is answered with a postcard
//! `Result<answer, error>`: openraft's RPCs, proposals forwarded by other
//! nodes, and membership requests. `GET /raft/status` answers JSON for
//! people and tools.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use openraft::raft::AppendEntriesResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cluster::{JoinRequest, RemoveRequest, Shared};
use crate::cluster_id::{self, IdentityError};
use crate::proposer::{Committed, ProposeError};
use crate::transport::path;
use crate::types::NodeId;

/// Largest request body: a batch of entries of up to a few MiB each.
const MAX_BODY: usize = 256 << 20;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(path::APPEND, post(append))
        .route(path::VOTE, post(vote))
        .route(path::SNAPSHOT, post(snapshot))
        .route(path::PROPOSE, post(propose))
        .route(path::READ_INDEX, post(read_index))
        .route(path::JOIN, post(join))
        .route(path::REMOVE, post(remove))
        .route(path::TRANSFER, post(transfer))
        .route(path::HOLD, post(hold))
        .route(path::WELCOME, post(welcome))
        .route(path::STATUS, get(status))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            same_cluster,
        ))
        .with_state(shared)
}

/// Lets through only requests of this node's cluster. Another node always
/// names its cluster; tools (`tablix cluster`) may name none, for the
/// status, membership and leadership requests they send. A node that has
/// no id yet takes one only from a leader adding it (`welcome`), or, when
/// its log holds entries (a data directory from before ids), from any
/// node: a member whose data directory was wiped takes nothing, so its
/// empty log never counts for entries it once held, and it votes in
/// nothing until it is added again.
async fn same_cluster(State(s): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let theirs = request
        .headers()
        .get(cluster_id::HEADER)
        .map(|v| v.to_str().unwrap_or("").to_string());
    let from_tool = matches!(
        request.uri().path(),
        path::STATUS | path::JOIN | path::REMOVE | path::TRANSFER
    );
    // A node names its apply version, with its cluster or before it has
    // one (joining); a tool names neither.
    let apply = request
        .headers()
        .get(cluster_id::APPLY_HEADER)
        .map(|v| v.to_str().unwrap_or(""));
    if (theirs.is_some() || apply.is_some())
        && let Some(why) = cluster_id::apply_refusal(apply, tablix_store::APPLY_VERSION)
    {
        s.warn_rarely(format!(
            "refused a request for {}: {why}",
            request.uri().path()
        ));
        return (StatusCode::CONFLICT, why).into_response();
    }
    match theirs {
        None if from_tool => next.run(request).await,
        None => (
            StatusCode::FORBIDDEN,
            "a node-to-node request must name its cluster (an older tablix, or not a tablix node)",
        )
            .into_response(),
        Some(theirs)
            if s.identity.get().is_none()
                && request.uri().path() != path::WELCOME
                && s.raft.metrics().borrow().last_log_index.is_none() =>
        {
            s.warn_rarely(format!(
                "refused a request for {} from cluster {theirs}: this node belongs to no cluster yet (restart it with --join if it was a member whose data was lost)",
                request.uri().path()
            ));
            (
                StatusCode::CONFLICT,
                "this node belongs to no cluster yet: a node comes in with --join or `tablix cluster add`; a member whose data directory was lost must be added again the same way",
            )
                .into_response()
        }
        Some(theirs) => match s.identity.adopt(&theirs) {
            Ok(()) => next.run(request).await,
            Err(e @ (IdentityError::Other { .. } | IdentityError::Malformed(_))) => {
                s.warn_rarely(format!(
                    "refused a request for {}: {e}",
                    request.uri().path()
                ));
                (StatusCode::CONFLICT, e.to_string()).into_response()
            }
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
    }
}

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, String> {
    postcard::from_bytes(body)
        .map_err(|e| format!("the request is not what this service reads: {e}"))
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, message).into_response()
}

fn encode<T: Serialize>(answer: &T) -> Response {
    match postcard::to_stdvec(answer) {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the answer: {e}"),
        )
            .into_response(),
    }
}

async fn append(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => {
            let answer = s.raft.append_entries(request).await;
            if let Ok(
                AppendEntriesResponse::Success
                | AppendEntriesResponse::PartialSuccess(_)
                | AppendEntriesResponse::Conflict,
            ) = &answer
            {
                s.heard_from_leader();
            }
            encode(&answer)
        }
        Err(m) => bad_request(m),
    }
}

async fn vote(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => encode(&s.raft.vote(request).await),
        Err(m) => bad_request(m),
    }
}

async fn snapshot(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => encode(&s.raft.install_snapshot(request).await),
        Err(m) => bad_request(m),
    }
}

async fn propose(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode(&body) {
        // A leader handing over takes nothing new: the sender tries again
        // at the next leader.
        Ok(_) if s.is_transferring() => encode(&Err::<Committed, _>(ProposeError::NotLeader {
            leader: None,
        })),
        Ok(command) => encode(&s.proposer.propose_at(command).await),
        Err(m) => bad_request(m),
    }
}

/// A leader adding this node: the cluster's id was taken (or checked)
/// on the way in.
async fn welcome() -> Response {
    encode(&Ok::<(), String>(()))
}

async fn transfer(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode::<NodeId>(&body) {
        Ok(target) => encode(&s.transfer_leader(target).await),
        Err(m) => bad_request(m),
    }
}

async fn hold(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode::<u64>(&body) {
        Ok(millis) => {
            s.hold_elections(std::time::Duration::from_millis(millis.min(60_000)));
            encode(&Ok::<(), String>(()))
        }
        Err(m) => bad_request(m),
    }
}

async fn read_index(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(barrier) => encode(&s.read_index_here(barrier).await),
        Err(m) => bad_request(m),
    }
}

async fn join(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode::<JoinRequest>(&body) {
        Ok(request) => encode(&s.join(request).await),
        Err(m) => bad_request(m),
    }
}

async fn remove(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match decode::<RemoveRequest>(&body) {
        Ok(request) => encode(&s.remove(request).await),
        Err(m) => bad_request(m),
    }
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(s.status()).into_response()
}
