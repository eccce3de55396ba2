/* Proves that a plain C program linked against SQLite can use the tablix
 * page cache: installs it, runs a workload larger than the cache, checks
 * the database and the cache's counters. Exits non-zero on any failure. */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tablix_pcache.h"

static int failures = 0;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static void exec(sqlite3 *db, const char *sql) {
    char *err = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    CHECK(rc == SQLITE_OK, "%s: %s", sql, err ? err : "?");
    sqlite3_free(err);
}

static int text_cb(void *out, int n, char **vals, char **cols) {
    (void)n;
    (void)cols;
    snprintf((char *)out, 64, "%s", vals[0] ? vals[0] : "NULL");
    return 0;
}

int main(int argc, char **argv) {
    const char *policy = argc > 1 ? argv[1] : "s3-fifo";
    char path[256];
    snprintf(path, sizeof path, "/tmp/tablix-pcache-c-%d.db", (int)getpid());
    unlink(path);

    CHECK(tablix_pcache_install(NULL) == SQLITE_ERROR, "NULL policy accepted");
    CHECK(tablix_pcache_install("arc") == SQLITE_ERROR, "unknown policy accepted");
    CHECK(strstr(tablix_pcache_policies(), "s3-fifo") != NULL, "policy list");
    int rc = tablix_pcache_install(policy);
    CHECK(rc == SQLITE_OK, "install(%s) = %d", policy, rc);

    sqlite3 *db;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK, "open");
    exec(db, "PRAGMA cache_size = 50");
    exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT)");
    exec(db, "CREATE INDEX tk ON t(k)");
    exec(db, "BEGIN");
    exec(db, "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 20000) "
             "INSERT INTO t(k, v) SELECT (i * 7919) % 10007, printf('row %d %.*c', i, i % 100, 'x') FROM c");
    exec(db, "COMMIT");
    exec(db, "DELETE FROM t WHERE id % 3 = 0");
    exec(db, "UPDATE t SET v = v || 'y' WHERE k < 500");
    char out[64] = "";
    sqlite3_exec(db, "SELECT count(*) FROM t WHERE v LIKE '%xx%'", text_cb, out, NULL);
    CHECK(atoi(out) > 1000, "count = %s", out);
    sqlite3_exec(db, "PRAGMA integrity_check", text_cb, out, NULL);
    CHECK(strcmp(out, "ok") == 0, "integrity_check = %s", out);

    /* Installing once SQLite runs is refused. */
    CHECK(tablix_pcache_install(policy) == SQLITE_MISUSE, "late install accepted");

    uint64_t hits = 0, misses = 0, evictions = 0;
    tablix_pcache_totals(&hits, &misses, &evictions);
    CHECK(hits > 1000 && misses > 100 && evictions > 100,
          "counters hits=%llu misses=%llu evictions=%llu", (unsigned long long)hits,
          (unsigned long long)misses, (unsigned long long)evictions);
    sqlite3_close(db);
    unlink(path);

    printf("tablix_pcache from C, policy %s: hits=%llu misses=%llu evictions=%llu\n", policy,
           (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)evictions);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
