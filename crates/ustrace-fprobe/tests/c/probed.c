/* Functions probed by the ustrace-fprobe integration tests (built into a shared library). */
#include <setjmp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

volatile uint64_t c_sink;

__attribute__((noinline)) uint64_t c_add(uint64_t a, uint64_t b) {
    c_sink = a;
    return a + b;
}

__attribute__((noinline)) uint64_t c_mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                                         uint64_t e, uint64_t f, uint64_t g, uint64_t h) {
    c_sink = g + h;
    return a * 1 + b * 2 + c * 3 + d * 4 + e * 5 + f * 6 + g * 7 + h * 8;
}

__attribute__((noinline)) double c_scale(double x, double y, uint64_t n) {
    c_sink = n;
    return x * y + (double)n;
}

__attribute__((noinline)) uint64_t c_fib(uint64_t n) {
    c_sink = n;
    if (n < 2) return n;
    return c_fib(n - 1) + c_fib(n - 2);
}

/* longjmp through probed frames */
static jmp_buf c_env;

__attribute__((noinline)) uint64_t c_jump_deep(uint64_t n) {
    c_sink = n;
    if (n == 0) longjmp(c_env, 7);
    return c_jump_deep(n - 1) + 1;
}

__attribute__((noinline)) uint64_t c_longjmp_driver(uint64_t depth) {
    c_sink = depth;
    int r = setjmp(c_env);
    if (r != 0) {
        /* probed calls after the jump must still pair and return correctly */
        return (uint64_t)r * 1000 + c_add(depth, 1);
    }
    c_jump_deep(depth);
    return 0;
}

/* thread exit with probed frames outstanding */
__attribute__((noinline)) uint64_t c_exit_thread(uint64_t depth) {
    c_sink = depth;
    if (depth == 0) pthread_exit((void *)42);
    return c_exit_thread(depth - 1) + 1;
}

/* callbacks: a probed C frame below a Rust frame (for panics through C) */
typedef uint64_t (*c_callback)(uint64_t);
__attribute__((noinline)) uint64_t c_call_back(c_callback f, uint64_t x) {
    c_sink = x;
    uint64_t r = f(x);
    c_sink = r;
    return r + 1;
}

/* too short to patch: refused */
__attribute__((naked)) uint64_t c_tiny(void) {
    __asm__("xor %eax, %eax\n\tret\n\t");
}

/* a loop whose head is inside the first 5 bytes: refused */
__attribute__((naked)) uint64_t c_loop_head(uint64_t n) {
    __asm__("xor %eax, %eax\n\t"
            "1: inc %rax\n\t"
            "cmp %rdi, %rax\n\t"
            "jb 1b\n\t"
            "ret\n\t");
}

/* control flow in the prologue: refused */
__attribute__((naked)) uint64_t c_early_branch(uint64_t n) {
    __asm__("test %rdi, %rdi\n\t"
            "je 1f\n\t"
            "lea 1(%rdi), %rax\n\t"
            "ret\n\t"
            "1: xor %eax, %eax\n\t"
            "ret\n\t");
}

/* a thread that leaves through pthread_exit with probed frames outstanding */
static void *c_thread_main(void *arg) {
    (void)arg;
    c_exit_thread(3);
    return (void *)1;
}

__attribute__((noinline)) uint64_t c_spawn_exiting_thread(void) {
    pthread_t t;
    void *ret = 0;
    if (pthread_create(&t, 0, c_thread_main, 0) != 0) return 0;
    pthread_join(t, &ret);
    return (uint64_t)ret;
}
