// An LD_AUDIT module that stalls the dynamic loader for
// WALLSCOPE_TEST_STALL_MS (default 2000) right after it maps libjvm.so,
// before it relocates it or runs its constructors: the window in which a
// JVM's structures are mapped but not yet filled in, which a busy host
// stretches, held open long enough for a test to land in it.
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

unsigned int la_version(unsigned int version)
{
	(void)version;
	return LAV_CURRENT;
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
	(void)lmid;
	(void)cookie;
	if (map->l_name && strstr(map->l_name, "libjvm.so")) {
		const char *ms = getenv("WALLSCOPE_TEST_STALL_MS");
		long stall = ms ? atol(ms) : 2000;
		struct timespec ts = {stall / 1000, (stall % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	return 0;
}
