/*
 * tablix page cache for SQLite.
 *
 * Link libtablix_pcache.a (built by `cargo build -p tablix-pcache --release`)
 * together with your SQLite and -lpthread -ldl -lm, and call
 * tablix_pcache_install() before sqlite3_initialize() or the first
 * sqlite3_open*(): SQLite takes its page cache when it initialises.
 */
#ifndef TABLIX_PCACHE_H
#define TABLIX_PCACHE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Installs the page cache with eviction policy `policy`, one of the names
 * tablix_pcache_policies() lists ("lru", "lfu-hist", "s3-fifo", "s3-lru",
 * "w-tinylfu").
 *
 * Returns SQLITE_OK (0); SQLITE_ERROR (1) if `policy` is NULL or unknown;
 * SQLITE_MISUSE (21) if SQLite is already initialised (call it earlier, or
 * after sqlite3_shutdown()).
 */
int tablix_pcache_install(const char *policy);

/* The valid policy names, comma-separated. Static storage; do not free. */
const char *tablix_pcache_policies(void);

/*
 * Page fetches that hit, that missed (the page had to be created), and
 * pages evicted, summed over every tablix cache of the process so far.
 * Any pointer may be NULL.
 */
void tablix_pcache_totals(uint64_t *hits, uint64_t *misses, uint64_t *evictions);

#ifdef __cplusplus
}
#endif

#endif /* TABLIX_PCACHE_H */
