/* The hw backend of the comm lens: hardware address sampling through perf_event_open
 * (Intel PEBS mem-loads/mem-stores with precise_ip, AMD IBS op). Each thread opens its own
 * sampling events; the kernel writes PERF_RECORD_SAMPLE records into a ring buffer mapped
 * by the thread and signals it (O_ASYNC, F_SETSIG, F_SETOWN_EX to the thread); the handler
 * drains the ring, writes a comm sample per access and hands it to the detector.
 *
 * NOT VERIFIED ON HARDWARE YET: the development machines have no PMU. The ring-buffer
 * parser is unit-tested with synthetic records (tests/test_hw_parse.c); the event set-up,
 * the signal plumbing and the accuracy of the samples have never run on a real PEBS or
 * IBS machine. */
#ifndef LOCUS_COMM_HW_H
#define LOCUS_COMM_HW_H

#include <stddef.h>
#include <stdint.h>

#include "../comm.h"

extern struct locus_comm_backend_ops locus_comm_hw;

/* Convert the PERF_RECORD_SAMPLE records of a linear byte range (whole records, as laid
 * out in the ring) into accesses and call cb for each; records of other types are skipped.
 * Access fields: ip, addr, cpu (-1 without PERF_SAMPLE_CPU), t = the record's time (ns of
 * the event's clock; 0 without PERF_SAMPLE_TIME), len = 8 (PEBS/IBS give no access size:
 * the handler decodes the instruction for it, locus_comm_access_size),
 * flags = LOCUS_AC_STORE when data_src says PERF_MEM_OP_STORE. A sample whose sample_type
 * has fields of variable or attr-dependent size (READ, BRANCH_STACK, REGS_*, STACK_USER,
 * AUX) cannot be walked: -1. Returns the number of samples handed to cb, or -1 when a
 * record is malformed (size < header or past the end), after the ones before it. */
int locus_hw_parse(const void *data, size_t len, uint64_t sample_type,
                   void (*cb)(const struct locus_comm_access *, void *), void *arg);

/* Walk the records of a perf ring-buffer data area of `size` bytes (a power of two) from
 * byte counter `tail` to `head` (the free-running counters of the mmap page), parsing them
 * with locus_hw_parse. A record that wraps past the end of the area is first copied into
 * `bounce` (a record longer than bounce_size is skipped). Returns the new tail (== head,
 * or the start of a malformed record, which the caller should then skip to head). */
uint64_t locus_hw_drain(const void *ring, size_t size, uint64_t tail, uint64_t head,
                        uint64_t sample_type, void (*cb)(const struct locus_comm_access *, void *),
                        void *arg, void *bounce, size_t bounce_size);

#endif
