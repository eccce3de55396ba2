//! The writer of user SQL: `SqlCommand`s in groups, on a sandboxed
//! connection of its own, so that a user's write never occupies the file
//! system's connection (whose reads the mount needs in async mode).

use rusqlite::Connection;

use crate::budget::Limits;
use crate::command::{SqlCommand, Stamp, Stamped};
use crate::error::StoreError;
use crate::exec::{self, Collect, Stop};
use crate::group;
use crate::outcome::{SqlReply, StatementOutcome, StatementResult};
use crate::sandbox::UserConn;
use crate::state_machine::{Grouped, StateMachine};
use crate::volatile::MemImage;
use crate::write_point::{WritePoint, WriteProbe};

pub(crate) struct SqlWriter {
    pub(crate) uc: UserConn,
}

impl SqlWriter {
    /// Attaches a newer image of the memory database; before a group.
    pub(crate) fn refresh_mem(&mut self, image: &MemImage) -> Result<(), StoreError> {
        self.uc.refresh_mem(image)
    }

    /// Applies user SQL Commands as one group commit, ending the group
    /// early when the results it holds would pass `budget` bytes (see
    /// [`group::commit`]): returns the replies of a prefix. Inside the
    /// transaction `record(conn, n)` records where the log stands once the
    /// first `n` are applied.
    pub(crate) fn apply_group(
        &self,
        items: &[(&Stamped<SqlCommand>, &Limits)],
        budget: usize,
        record: impl Fn(&Connection, usize) -> rusqlite::Result<()>,
        probe: &WriteProbe,
    ) -> Result<Vec<Result<Held, StoreError>>, StoreError> {
        group::commit(self, items, budget, |conn, n| {
            record(conn, n)?;
            probe.at(WritePoint::Applied);
            Ok(())
        })
    }

    /// The reply to a Command whose client went away before it was
    /// logged: it never runs.
    pub(crate) fn cancelled() -> SqlReply {
        SqlReply {
            rolled_back: true,
            statements: vec![StatementOutcome {
                result: StatementResult::Error(
                    "statement cancelled: the client went away before it ran".into(),
                ),
                seconds: 0.0,
            }],
        }
    }
}

/// A reply of user SQL and the bytes its results hold until answered.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) reply: SqlReply,
    pub(crate) bytes: usize,
}

/// User SQL's domain: the statements, on the sandboxed writer connection,
/// as their principal, within the proposer's limits.
impl StateMachine for SqlWriter {
    type Op = SqlCommand;
    type Reply = Held;
    type Bounds = Limits;

    fn connection(&self) -> &Connection {
        &self.uc.conn
    }

    fn apply(&self, stamp: Stamp, op: &SqlCommand, limits: &Limits) -> Result<Held, StoreError> {
        let SqlCommand {
            statements,
            transaction,
            principal,
        } = op;
        self.uc.set_stamp(stamp);
        let _running = self.uc.begin(principal, limits);
        let mut sink = Collect::new(limits.max_result_bytes);
        let mut rolled_back = false;
        for st in statements {
            match exec::run(&self.uc, st, &mut sink) {
                Ok(failed) => {
                    if failed && *transaction {
                        rolled_back = true;
                        break;
                    }
                    if self.uc.conn.is_autocommit() {
                        // The statement ended the enclosing transaction
                        // (ON CONFLICT ROLLBACK, an interrupted write); the
                        // group restarts without this Command.
                        rolled_back = true;
                        break;
                    }
                }
                // Results nobody can receive whole: the Command does not
                // happen.
                Err(Stop::TooLarge(_)) | Err(Stop::Gone) => {
                    rolled_back = true;
                    break;
                }
                Err(Stop::Failed(f)) => return Err(StoreError::Failed(f)),
            }
        }
        let bytes = sink.used();
        let reply = SqlReply {
            statements: sink.outcomes,
            rolled_back,
        };
        Ok(Held { reply, bytes })
    }

    fn refused(held: &Held) -> bool {
        held.reply.rolled_back
    }
}

impl Grouped for SqlWriter {
    fn ended(mut held: Held) -> Held {
        held.reply.rolled_back = true;
        held
    }

    fn reply_bytes(held: &Held) -> usize {
        held.bytes
    }
}
