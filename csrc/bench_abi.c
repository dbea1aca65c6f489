/* Per-call cost of the C ABI, measured from C: a loop of calls into the
 * library, ns per call. crescent_abi_version is a bare crossing into Go;
 * get_transfer_status adds a handle lookup and an engine call. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    volatile int sink = 0;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink += crescent_abi_version();
    double bare = (now_ns() - t0) / n;

    crescent_engine_t e;
    CHECK_OK(crescent_engine_create(NULL, "127.0.0.1", "tcp", &e));
    crescent_batch_t b;
    CHECK_OK(crescent_engine_allocate_batch(e, 1, &b));
    crescent_transfer_status_t st;
    t0 = now_ns();
    for (long i = 0; i < n; i++) sink += crescent_engine_get_transfer_status(e, b, 0, &st);
    double status = (now_ns() - t0) / n;
    CHECK_OK(crescent_engine_free_batch(e, b));
    CHECK_OK(crescent_engine_destroy(e));
    printf("crescent_abi_version            %8.1f ns/op (%ld calls)\n", bare, n);
    printf("crescent_engine_get_transfer_status %4.1f ns/op (%ld calls)\n", status, n);
    return sink == -1;
}
