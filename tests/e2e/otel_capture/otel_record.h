/* The OpenTelemetry thread-context record (OTEP 4947) as the test and
 * bench writers lay it out: the 28-byte header, then attributes (key
 * index, length, value); and the TLS variable readers look for. */
#ifndef OTEL_RECORD_H
#define OTEL_RECORD_H

#include <stdint.h>

struct otel_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t flags;
	uint16_t attrs_size;
	uint8_t attrs[32];
};

__attribute__((visibility("default"))) __thread struct otel_record *otel_thread_ctx_v1;

#endif
