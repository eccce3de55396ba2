//! `pcache_stats`: an eponymous virtual table with one row per live tablix
//! page cache in the process, read live from the counters.

use std::borrow::Cow;
use std::ffi::{CStr, c_int};
use std::marker::PhantomData;

use rusqlite::vtab::{
    Context, Filters, IndexInfo, Module, VTab, VTabConfig, VTabConnection, VTabCursor,
};
use rusqlite::{Connection, ffi};

use crate::stats::{StatsSnapshot, caches};

const NAME: &CStr = c"pcache_stats";

/// Makes `pcache_stats` queryable on `conn`.
pub fn register_stats_table(conn: &Connection) -> rusqlite::Result<()> {
    const MODULE: Module<StatsTab> = Module::eponymous_only_module();
    conn.create_module(NAME, &MODULE, None)
}

#[repr(C)]
struct StatsTab {
    base: ffi::sqlite3_vtab,
}

// SAFETY: `base` is the first field of a repr(C) struct, as rusqlite requires.
unsafe impl<'vtab> VTab<'vtab> for StatsTab {
    type Aux = ();
    type Cursor = StatsCursor<'vtab>;

    fn connect(
        db: &mut VTabConnection,
        _aux: Option<&()>,
        _module: &[u8],
        _database: &[u8],
        _table: &[u8],
        _args: &[&[u8]],
    ) -> rusqlite::Result<(Cow<'static, CStr>, Self)> {
        db.config(VTabConfig::Innocuous)?;
        Ok((
            Cow::Borrowed(
                c"CREATE TABLE x(cache_id INTEGER, policy TEXT, page_size INTEGER, purgeable INTEGER, capacity INTEGER, resident INTEGER, pinned INTEGER, hits INTEGER, misses INTEGER, evictions INTEGER, hit_ratio REAL)",
            ),
            StatsTab {
                base: ffi::sqlite3_vtab::default(),
            },
        ))
    }

    fn best_index(&self, info: &mut IndexInfo) -> rusqlite::Result<bool> {
        info.set_estimated_cost(10.0);
        info.set_estimated_rows(10);
        Ok(true)
    }

    fn open(&mut self) -> rusqlite::Result<StatsCursor<'_>> {
        Ok(StatsCursor {
            base: ffi::sqlite3_vtab_cursor::default(),
            rows: Vec::new(),
            at: 0,
            phantom: PhantomData,
        })
    }
}

#[repr(C)]
struct StatsCursor<'vtab> {
    base: ffi::sqlite3_vtab_cursor,
    rows: Vec<StatsSnapshot>,
    at: usize,
    phantom: PhantomData<&'vtab StatsTab>,
}

// SAFETY: `base` is the first field of a repr(C) struct.
unsafe impl VTabCursor for StatsCursor<'_> {
    fn filter(
        &mut self,
        _idx: c_int,
        _idx_str: Option<&str>,
        _args: &Filters<'_>,
    ) -> rusqlite::Result<()> {
        self.rows = caches();
        self.at = 0;
        Ok(())
    }

    fn next(&mut self) -> rusqlite::Result<()> {
        self.at += 1;
        Ok(())
    }

    fn eof(&self) -> bool {
        self.at >= self.rows.len()
    }

    fn column(&self, ctx: &mut Context, i: c_int) -> rusqlite::Result<()> {
        let r = &self.rows[self.at];
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        match i {
            0 => ctx.set_result(as_i64(r.id)),
            1 => ctx.set_result(r.policy.name()),
            2 => ctx.set_result(r.page_size as i64),
            3 => ctx.set_result(r.purgeable),
            4 => ctx.set_result(as_i64(r.capacity)),
            5 => ctx.set_result(as_i64(r.resident)),
            6 => ctx.set_result(as_i64(r.pinned)),
            7 => ctx.set_result(as_i64(r.hits)),
            8 => ctx.set_result(as_i64(r.misses)),
            9 => ctx.set_result(as_i64(r.evictions)),
            _ => {
                let total = r.hits + r.misses;
                if total == 0 {
                    ctx.set_result(rusqlite::types::Null)
                } else {
                    ctx.set_result(r.hits as f64 / total as f64)
                }
            }
        }
    }

    fn rowid(&self) -> rusqlite::Result<i64> {
        Ok(self.at as i64 + 1)
    }
}
