/* Loaded by the dlopen test only after an fprobe filter that matches it was registered. */
#include <stdint.h>

volatile uint64_t late_sink;

__attribute__((noinline)) uint64_t dl_late_square(uint64_t x) {
    late_sink = x;
    return x * x;
}
