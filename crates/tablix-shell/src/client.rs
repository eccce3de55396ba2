//! A small client of the daemon's HTTP API.

use std::time::Duration;

use serde_json::{Value as Json, json};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no tablix daemon is answering at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("the daemon refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
}

/// The result of one statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Rows {
        columns: Vec<String>,
        types: Vec<String>,
        /// Values as JSON; blobs are arrays of byte values.
        values: Vec<Vec<Json>>,
    },
    Executed {
        last_insert_id: i64,
        rows_affected: u64,
    },
    Error(String),
}

pub struct Client {
    addr: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the daemon listening at `addr` (HOST:PORT).
    pub fn new(addr: impl Into<String>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(3)))
            .build()
            .into();
        Client {
            addr: addr.into(),
            agent,
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn post(&self, path: &str, body: &Json) -> Result<Json, ClientError> {
        let url = format!("http://{}{path}", self.addr);
        let mut resp = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| ClientError::Unreachable {
                addr: self.addr.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let json: Json = serde_json::from_str(&text)
            .map_err(|_| ClientError::Protocol(format!("HTTP {status}: {text}")))?;
        if status != 200 {
            let message = json["error"].as_str().unwrap_or(&text).to_string();
            return Err(ClientError::Refused { status, message });
        }
        Ok(json)
    }

    /// Runs statements through `/db/request` (reads on a snapshot, writes
    /// through the writer), optionally as one transaction.
    pub fn request(
        &self,
        statements: &[String],
        transaction: bool,
    ) -> Result<Vec<Reply>, ClientError> {
        let path = if transaction {
            "/db/request?blob_array&transaction"
        } else {
            "/db/request?blob_array"
        };
        self.results(self.post(path, &json!(statements))?)
    }

    /// Runs read-only statements on one snapshot through `/db/query`.
    pub fn query(&self, statements: &[String]) -> Result<Vec<Reply>, ClientError> {
        self.results(self.post("/db/query?blob_array", &json!(statements))?)
    }

    /// Checks that a daemon answers.
    pub fn ping(&self) -> Result<(), ClientError> {
        let url = format!("http://{}/readyz", self.addr);
        match self.agent.get(&url).call() {
            Ok(r) if r.status().as_u16() == 200 => Ok(()),
            Ok(r) => Err(ClientError::Refused {
                status: r.status().as_u16(),
                message: "the daemon is not ready".into(),
            }),
            Err(e) => Err(ClientError::Unreachable {
                addr: self.addr.clone(),
                reason: e.to_string(),
            }),
        }
    }

    fn results(&self, json: Json) -> Result<Vec<Reply>, ClientError> {
        let list = json["results"]
            .as_array()
            .ok_or_else(|| ClientError::Protocol(format!("no results in {json}")))?;
        list.iter().map(reply).collect()
    }
}

fn reply(r: &Json) -> Result<Reply, ClientError> {
    if let Some(e) = r.get("error") {
        return Ok(Reply::Error(e.as_str().unwrap_or_default().to_string()));
    }
    if let Some(cols) = r.get("columns") {
        let strings = |v: &Json| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| s.as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let values = r["values"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| row.as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        return Ok(Reply::Rows {
            columns: strings(cols),
            types: strings(&r["types"]),
            values,
        });
    }
    Ok(Reply::Executed {
        last_insert_id: r["last_insert_id"].as_i64().unwrap_or(0),
        rows_affected: r["rows_affected"].as_u64().unwrap_or(0),
    })
}
