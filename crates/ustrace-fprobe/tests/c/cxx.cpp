// C++ exceptions thrown through probed frames (built by tests/unwind.rs with c++).
#include <stdexcept>

extern "C" {
volatile int cxx_sink;

__attribute__((noinline)) int cxx_thrower(int x) {
    cxx_sink = x;
    if (x == 13) throw std::runtime_error("unlucky");
    return x * 2;
}

__attribute__((noinline)) int cxx_middle(int x) {
    cxx_sink = x;
    return cxx_thrower(x) + 1;
}

__attribute__((noinline)) int cxx_catcher(int x) {
    cxx_sink = x;
    try {
        return cxx_middle(x);
    } catch (const std::exception &) {
        return -1;
    }
}
}
