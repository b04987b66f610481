/* The LTTng-UST tracepoint of the `--peers` event workload: three integers. */
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER ustrace_peers

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./peers_tp.h"

#if !defined(PEERS_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define PEERS_TP_H

#include <lttng/tracepoint.h>

TRACEPOINT_EVENT(ustrace_peers, ints3,
    TP_ARGS(long, a, long, b, long, c),
    TP_FIELDS(
        ctf_integer(long, a, a)
        ctf_integer(long, b, b)
        ctf_integer(long, c, c)
    )
)

#endif

#include <lttng/tracepoint-event.h>
