/*
 * Linked into SQLite's speedtest1 by `tablix bench pcache`: installs the
 * tablix page cache named by $TABLIX_PCACHE before main() runs, so before
 * SQLite initialises. Without the variable SQLite keeps its own cache.
 * At exit it prints the cache's totals to standard error (tablix caches
 * only), prefixed "tablix-pcache:".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "tablix_pcache.h"

static void report(void)
{
    uint64_t hits = 0, misses = 0, evictions = 0;
    tablix_pcache_totals(&hits, &misses, &evictions);
    fprintf(stderr, "tablix-pcache: hits %" PRIu64 " misses %" PRIu64 " evictions %" PRIu64 "\n",
            hits, misses, evictions);
}

__attribute__((constructor)) static void install(void)
{
    const char *policy = getenv("TABLIX_PCACHE");
    if (!policy || !*policy)
        return;
    int rc = tablix_pcache_install(policy);
    if (rc != 0) {
        fprintf(stderr, "tablix_pcache_install(%s) failed: %d (policies: %s)\n", policy, rc,
                tablix_pcache_policies());
        exit(2);
    }
    atexit(report);
}
