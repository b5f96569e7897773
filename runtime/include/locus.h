/* The public C API of locus, for programs that want to talk to the profiler.
 *
 * locus_label(text): mark a point of the program ("phase 2") on the time axis of the
 * monitor (`locus record --lens monitor`, `locus monitor record|live`): the label is sent
 * as "label TEXT\n" to the control FIFO named by $LOCUS_MONITOR_FIFO. It never blocks and is
 * safe to call from any thread and from a signal handler. Returns 0 when the label was
 * sent, -1 otherwise (no monitor running, FIFO full or gone).
 *
 * The function is in liblocus.so, which `locus record` preloads. A program that must also
 * run without locus declares it weak and checks it:
 *
 *   #pragma weak locus_label
 *   ...
 *   if (locus_label) locus_label("phase 2");
 *
 * or links with -L<locus>/build -llocus. See docs/monitor.md. */
#ifndef LOCUS_H
#define LOCUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Longest label sent; longer text is cut (one write to a FIFO stays atomic below 4 KiB). */
#define LOCUS_LABEL_MAX 1000

int locus_label(const char *text);

#ifdef __cplusplus
}
#endif

#endif
