//! The writer of user SQL: `Command::Sql` in groups, on a sandboxed
//! connection of its own, so that a user's write never occupies the file
//! system's connection (whose reads the mount needs in async mode).

use crate::budget::Limits;
use crate::command::{Command, Stamped};
use crate::error::StoreError;
use crate::exec::{self, Collect, Stop};
use crate::group;
use crate::outcome::Applied;
use crate::sandbox::UserConn;
use crate::volatile::MemImage;

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
    /// [`group::commit_prefix`]): returns the results of a prefix.
    pub(crate) fn apply_group(
        &self,
        items: &[(&Stamped, &Limits)],
        budget: usize,
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        group::commit_prefix(&self.uc.conn, items, budget, |(item, limits)| {
            self.apply(item, limits)
        })
    }

    /// Applies one Command; also returns the bytes its results hold.
    fn apply(&self, item: &Stamped, limits: &Limits) -> Result<(Applied, usize), StoreError> {
        let Command::Sql {
            statements,
            transaction,
            principal,
        } = &item.command
        else {
            return Err(StoreError::Apply(format!(
                "{} reached the SQL writer",
                item.command.kind()
            )));
        };
        if limits.cancel.is_cancelled() {
            let applied = Applied {
                rolled_back: true,
                statements: vec![crate::outcome::StatementOutcome {
                    result: crate::outcome::StatementResult::Error(
                        "statement cancelled: the client went away before it ran".into(),
                    ),
                    seconds: 0.0,
                }],
                ..Applied::default()
            };
            return Ok((applied, 0));
        }
        self.uc.set_stamp(item.stamp);
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
        let cost = sink.used();
        let applied = Applied {
            statements: sink.outcomes,
            rolled_back,
            ..Applied::default()
        };
        Ok((applied, cost))
    }
}
