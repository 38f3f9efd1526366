/* Loads the writer built as a library (dynamic TLS) and prints where its
 * `otel_thread_ctx_v1` is: its TLS module id and offset in the module's
 * block, as discovery would find them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	void *lib, *block = NULL;
	size_t module = 0;
	char *var;
	int (*run)(void);

	if (argc < 2 || !(lib = dlopen(argv[1], RTLD_NOW)))
		return 1;
	/* dlsym of a TLS symbol: this thread's copy (allocating its block). */
	var = dlsym(lib, "otel_thread_ctx_v1");
	run = (int (*)(void))dlsym(lib, "writer_run");
	if (!var || !run || dlinfo(lib, RTLD_DI_TLS_MODID, &module) ||
	    dlinfo(lib, RTLD_DI_TLS_DATA, &block) || !block)
		return 1;
	printf("dtv %zu %ld\n", module, (long)(var - (char *)block));
	fflush(stdout);
	return run();
}
