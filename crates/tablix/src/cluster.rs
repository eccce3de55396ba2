//! `tablix cluster`: a cluster's members, looked at and changed through
//! any node's raft service.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tablix_raft::cluster_id::ClusterIdentity;
use tablix_raft::{ClusterStatus, JoinRequest, Transport, TransportError};

use crate::cli::{ClusterAction, ClusterArgs};

pub fn run(args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(act(args))
}

async fn act(args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let tls = args.tls.load()?;
    let plain = tls.is_none();
    act_with(args, Transport::with(tls.as_ref(), ClusterIdentity::none()))
        .await
        .map_err(|e| match e.downcast_ref::<TransportError>() {
            Some(TransportError::NoAnswer { .. }) if plain => anyhow::anyhow!(
                "{e:#} (if the cluster's nodes use mutual TLS, pass --raft-cert, --raft-key and --raft-ca)"
            ),
            _ => e,
        })
}

async fn act_with(args: ClusterArgs, transport: Transport) -> anyhow::Result<ExitCode> {
    let wait = Duration::from_secs(120);
    let voter = matches!(args.action, ClusterAction::Add { .. });
    let changed = match args.action {
        ClusterAction::Status { json } => {
            let status: ClusterStatus = transport
                .status(&args.raft, Duration::from_secs(10))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", show(&status));
            }
            return Ok(ExitCode::SUCCESS);
        }
        ClusterAction::Add { id, addr } | ClusterAction::AddLearner { id, addr } => {
            let request = JoinRequest {
                id,
                addr,
                voter,
                fresh: false,
            };
            transport.join(&args.raft, &request, wait).await?
        }
        ClusterAction::Remove { id } => transport.remove(&args.raft, id, wait).await?,
        ClusterAction::TransferLeader { id } => {
            transport.transfer_leader(&args.raft, id, wait).await?
        }
    };
    match changed {
        Ok(()) => {
            let mut status = transport
                .status(&args.raft, Duration::from_secs(10))
                .await?;
            // A node that removed itself no longer knows the cluster: the
            // status shown is a remaining member's, once it has a leader.
            if !status.members.iter().any(|m| m.id == status.id) {
                status = remaining_member_status(&transport, &status).await?;
            }
            print!("{}", show(&status));
            Ok(ExitCode::SUCCESS)
        }
        // A refusal is reported as every other failure of the command is,
        // by `main`, so that scripts see one shape of error.
        Err(e) => Err(anyhow::anyhow!("the cluster refused: {e}")),
    }
}

/// The status of one of `left`'s members that knows a leader among
/// them, asked in turn for up to 10 s.
async fn remaining_member_status(
    transport: &Transport,
    left: &ClusterStatus,
) -> anyhow::Result<ClusterStatus> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut last = None;
        for m in &left.members {
            match transport.status(&m.addr, Duration::from_secs(2)).await {
                // Until an election, the members still know the node
                // that left as their leader.
                Ok(s)
                    if s.leader
                        .is_some_and(|l| s.members.iter().any(|m| m.id == l)) =>
                {
                    return Ok(s);
                }
                Ok(s) => last = Some(anyhow::anyhow!("node {} knows no new leader yet", s.id)),
                Err(e) => last = Some(e.into()),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let why = last.unwrap_or_else(|| anyhow::anyhow!("no member is left"));
            return Err(why.context(format!(
                "node {} left the cluster, but no remaining member answered with a leader",
                left.id
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The status as a table, one member a line.
fn show(s: &ClusterStatus) -> String {
    let mut out = format!(
        "node {} at {} is {} in term {}; leader: {}\nlog to {}, applied to {}, snapshot at {}\n",
        s.id,
        s.addr,
        s.state,
        s.term,
        match (&s.leader, &s.leader_addr) {
            (Some(l), Some(a)) => format!("node {l} at {a}"),
            (Some(l), None) => format!("node {l}"),
            _ => "none known".into(),
        },
        index(s.last_log_index),
        index(s.applied_index),
        index(s.snapshot_index),
    );
    if let Some(id) = &s.cluster_id {
        out.push_str(&format!("cluster {id}"));
        if let Some(v) = s.apply_version {
            out.push_str(&format!(", apply version {v}"));
        }
        out.push('\n');
    }
    if let Some(why) = &s.stopped {
        out.push_str(&format!(
            "STOPPED: {why}; this node applies nothing until it is restarted\n"
        ));
    }
    out.push_str(&format!("{:>6}  {:<8} {}\n", "id", "role", "raft address"));
    for m in &s.members {
        let role = if Some(m.id) == s.leader {
            "leader"
        } else if m.voter {
            "voter"
        } else {
            "learner"
        };
        out.push_str(&format!("{:>6}  {:<8} {}\n", m.id, role, m.addr));
    }
    out
}

fn index(i: Option<u64>) -> String {
    i.map_or_else(|| "-".to_string(), |i| i.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tablix_raft::Member;

    #[test]
    fn the_status_table_names_the_leader_voters_and_learners() {
        let s = ClusterStatus {
            id: 2,
            addr: "127.0.0.1:4102".into(),
            state: "follower".into(),
            term: 3,
            leader: Some(1),
            leader_addr: Some("127.0.0.1:4101".into()),
            last_log_index: Some(9),
            applied_index: Some(8),
            snapshot_index: None,
            cluster_id: Some("0123456789abcdef0123456789abcdef".into()),
            apply_version: Some(7),
            stopped: None,
            members: vec![
                Member {
                    id: 1,
                    addr: "127.0.0.1:4101".into(),
                    voter: true,
                },
                Member {
                    id: 2,
                    addr: "127.0.0.1:4102".into(),
                    voter: true,
                },
                Member {
                    id: 3,
                    addr: "127.0.0.1:4103".into(),
                    voter: false,
                },
            ],
            api_addr: Some("127.0.0.1:4001".into()),
        };
        let t = show(&s);
        assert!(t.contains("leader: node 1 at 127.0.0.1:4101"), "{t}");
        assert!(t.contains("applied to 8, snapshot at -"), "{t}");
        assert!(
            t.contains("cluster 0123456789abcdef0123456789abcdef, apply version 7"),
            "{t}"
        );
        let lines: Vec<&str> = t.lines().skip(4).collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(
            lines[0].contains("leader") && lines[0].contains("4101"),
            "{t}"
        );
        assert!(lines[1].contains("voter"), "{t}");
        assert!(
            lines[2].contains("learner") && lines[2].contains("4103"),
            "{t}"
        );
    }
}
