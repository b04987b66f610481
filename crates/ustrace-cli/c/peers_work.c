/* The workload `ustrace bench --peers` and `--scale` time under every tracer: a C function
 * `long work(long a, long b)` called in a loop, and the same loop with an event of three
 * integers. Built at run time with the system `cc` in several ways (plain, -pg,
 * -fpatchable-function-entry, with an LTTng-UST tracepoint, as a shared object that
 * ustrace loads and probes), so every tracer sees the same code.
 *
 * As a program: `peers_work calls|events N REPS` prints the median ns per iteration of REPS
 * timed loops of N iterations (after one warm-up loop of N/10+1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef PEERS_LTTNG
#define TRACEPOINT_DEFINE
#define TRACEPOINT_CREATE_PROBES
#include "peers_tp.h"
#endif

/* An empty asm keeps the compiler from folding the body into the caller or the loop. */
__attribute__((noinline)) long work(long a, long b)
{
    long r = (a * 31) ^ b;
    __asm__ volatile("" : "+r"(r));
    return r;
}

__attribute__((noinline)) long run_calls(long n)
{
    long acc = 0;
    for (long i = 0; i < n; i++)
        acc += work(i, 7);
    return acc;
}

#ifdef PEERS_LTTNG
__attribute__((noinline)) long run_events(long n)
{
    long acc = 0;
    for (long i = 0; i < n; i++) {
        acc += work(i, 7);
        tracepoint(ustrace_peers, ints3, i, acc, 7);
    }
    return acc;
}
#endif

#ifndef PEERS_NO_MAIN
static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s calls|events N REPS\n", argv[0]);
        return 2;
    }
    long (*loop)(long) = run_calls;
    if (strcmp(argv[1], "events") == 0) {
#ifdef PEERS_LTTNG
        loop = run_events;
#else
        fprintf(stderr, "built without an event\n");
        return 2;
#endif
    } else if (strcmp(argv[1], "calls") != 0) {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    long n = atol(argv[2]), reps = atol(argv[3]);
    if (n < 1 || reps < 1 || reps > 1000)
        return 2;
    double samples[1000];
    volatile long sink = loop(n / 10 + 1);
    for (long r = 0; r < reps; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        sink += loop(n);
        clock_gettime(CLOCK_MONOTONIC, &b);
        samples[r] = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    }
    (void)sink;
    qsort(samples, reps, sizeof samples[0], cmp);
    printf("%.3f\n", samples[reps / 2]);
    return 0;
}
#endif
