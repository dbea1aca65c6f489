/* C test of the engine ABI: loopback transfers, notifications, errors,
 * many threads. Run by csrc/run_tests.sh (make test). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define BUF (1 << 20)
#define THREADS 8

static crescent_engine_t eng;
static crescent_segment_t self_seg;
static unsigned char *src, *dst;

static void *worker(void *arg) {
    size_t t = (size_t)arg, chunk = BUF / THREADS, off = t * chunk;
    for (int round = 0; round < 20; round++) {
        crescent_batch_t b;
        CHECK_OK(crescent_engine_allocate_batch(eng, 1, &b));
        memset(src + off, (int)(t * 16 + round), chunk);
        crescent_transfer_request_t r = {CRESCENT_OPCODE_WRITE, src + off, self_seg,
                                         (uint64_t)(uintptr_t)(dst + off), chunk};
        CHECK_OK(crescent_engine_submit(eng, b, &r, 1));
        crescent_batch_status_t st;
        CHECK_OK(crescent_engine_wait(eng, b, 10000, &st));
        CHECK(st.status == CRESCENT_STATUS_COMPLETED && st.transferred_bytes == chunk);
        CHECK(dst[off] == (unsigned char)(t * 16 + round) && dst[off + chunk - 1] == dst[off]);
        CHECK_OK(crescent_engine_free_batch(eng, b));
    }
    /* The error message is per thread: provoke one here, check it is ours. */
    CHECK_RC(crescent_engine_free_batch(eng, 0xdead0000u + t), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(crescent_last_error(), "batch") != NULL);
    return NULL;
}

/* One WRITE of 4 KiB from e's src to dst in segment seg: the submit's or
 * the wait's code. */
static int write_once(crescent_engine_t e, crescent_segment_t seg) {
    crescent_batch_t b;
    CHECK_OK(crescent_engine_allocate_batch(e, 1, &b));
    crescent_transfer_request_t r = {CRESCENT_OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 4096};
    int rc = crescent_engine_submit(e, b, &r, 1);
    if (rc == 0) {
        crescent_batch_status_t st;
        rc = crescent_engine_wait(e, b, 10000, &st);
        CHECK(rc != 0 || st.status == CRESCENT_STATUS_COMPLETED);
    }
    CHECK_OK(crescent_engine_free_batch(e, b));
    return rc;
}

/* Transports at run time: eng (shm, tcp; its buffers are not memfds, so
 * only tcp carries them) drops tcp, and neither it nor a peer engine
 * reaches it; installed again, both do. */
static void uninstall_install(const char *name) {
    crescent_engine_t peer;
    CHECK_OK(crescent_engine_create(NULL, "127.0.0.1", "tcp", &peer));
    crescent_buffer_entry_t pb = {src, 4096};
    crescent_segment_t seg;
    CHECK_OK(crescent_engine_register_memory_batch(peer, &pb, 1, "cpu:0"));
    CHECK_OK(crescent_engine_open_segment(peer, name, &seg));
    CHECK_OK(write_once(peer, seg));
    CHECK_OK(write_once(eng, self_seg));

    CHECK_OK(crescent_engine_uninstall_transport(eng, "tcp"));
    CHECK_RC(crescent_engine_uninstall_transport(eng, "tcp"), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(write_once(eng, self_seg), CRESCENT_ERR_ENDPOINT);
    CHECK(strstr(crescent_last_error(), "offers [shm]") != NULL);
    CHECK_OK(crescent_engine_sync_segment_cache(peer)); /* the peer learns it */
    CHECK_RC(write_once(peer, seg), CRESCENT_ERR_ENDPOINT);
    CHECK(strstr(crescent_last_error(), "offers [shm]") != NULL);

    CHECK_OK(crescent_engine_install_transport(eng, "tcp"));
    CHECK_OK(write_once(eng, self_seg));
    CHECK_OK(crescent_engine_sync_segment_cache(peer));
    CHECK_OK(write_once(peer, seg));
    CHECK_OK(crescent_engine_close_segment(peer, seg));
    CHECK_OK(crescent_engine_destroy(peer));
}

int main(void) {
    CHECK(crescent_abi_version() == CRESCENT_ABI_VERSION);
    CHECK_OK(crescent_engine_create(NULL, "127.0.0.1", NULL, &eng));
    char name[128];
    CHECK_OK(crescent_engine_get_local_name(eng, name, sizeof name));
    CHECK(strncmp(name, "127.0.0.1:", 10) == 0);
    CHECK_RC(crescent_engine_get_local_name(eng, name, 3), CRESCENT_ERR_INVALID_ARGUMENT);

    src = aligned_alloc(4096, BUF);
    dst = aligned_alloc(4096, BUF);
    CHECK(src && dst);
    memset(dst, 0, BUF);
    crescent_buffer_entry_t bufs[2] = {{src, BUF}, {dst, BUF}};
    CHECK_OK(crescent_engine_register_memory_batch(eng, bufs, 2, "cpu:0"));
    CHECK_RC(crescent_engine_register_memory(eng, src, BUF, "*", 1), CRESCENT_ERR_ADDRESS_OVERLAPPED);
    CHECK_OK(crescent_engine_open_segment(eng, name, &self_seg));

    /* WRITE then READ back, one batch of two requests, with a notify. */
    for (size_t i = 0; i < BUF; i++) src[i] = (unsigned char)(i * 7);
    crescent_batch_t b;
    CHECK_OK(crescent_engine_allocate_batch(eng, 4, &b));
    crescent_transfer_request_t w[2] = {
        {CRESCENT_OPCODE_WRITE, src, self_seg, (uint64_t)(uintptr_t)dst, BUF / 2},
        {CRESCENT_OPCODE_WRITE, src + BUF / 2, self_seg, (uint64_t)(uintptr_t)(dst + BUF / 2), BUF / 2},
    };
    CHECK_OK(crescent_engine_submit_with_notify(eng, b, w, 2, self_seg, "written"));
    crescent_batch_status_t st;
    CHECK_OK(crescent_engine_wait(eng, b, -1, &st));
    CHECK(st.status == CRESCENT_STATUS_COMPLETED && st.requests == 2 && st.completed == 2);
    CHECK(st.transferred_bytes == BUF);
    CHECK(memcmp(src, dst, BUF) == 0);
    crescent_transfer_status_t ts;
    CHECK_OK(crescent_engine_get_transfer_status(eng, b, 1, &ts));
    CHECK(ts.status == CRESCENT_STATUS_COMPLETED && ts.transferred_bytes == BUF / 2);
    CHECK_RC(crescent_engine_get_transfer_status(eng, b, 9, &ts), CRESCENT_ERR_INVALID_ARGUMENT);
    crescent_notify_msg_t *msgs;
    size_t n;
    CHECK_OK(crescent_engine_get_notifs(eng, &msgs, &n));
    CHECK(n == 1 && strcmp(msgs[0].msg, "written") == 0 && strcmp(msgs[0].name, name) == 0);
    crescent_engine_free_notifs(msgs, n);
    CHECK_OK(crescent_engine_get_notifs(eng, &msgs, &n));
    CHECK(n == 0 && msgs == NULL);

    /* A notification with no batch (genNotifyInEngine). */
    CHECK_OK(crescent_engine_notify(eng, self_seg, "no batch"));
    CHECK_OK(crescent_engine_get_notifs(eng, &msgs, &n));
    CHECK(n == 1 && strcmp(msgs[0].msg, "no batch") == 0);
    crescent_engine_free_notifs(msgs, n);
    CHECK_RC(crescent_engine_notify(eng, 12345, "x"), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(crescent_engine_notify(eng, self_seg, NULL), CRESCENT_ERR_INVALID_ARGUMENT);

    /* openSegmentNoCache, syncSegmentCache, install/uninstallTransport. */
    crescent_segment_t again;
    CHECK_OK(crescent_engine_open_segment_no_cache(eng, name, &again));
    CHECK(again == self_seg);
    CHECK_OK(crescent_engine_close_segment(eng, again));
    CHECK_OK(crescent_engine_sync_segment_cache(eng));
    CHECK_RC(crescent_engine_open_segment_no_cache(eng, "127.0.0.1:1", &again), CRESCENT_ERR_METADATA);
    CHECK_OK(crescent_engine_install_transport(eng, "tcp")); /* running: done */
    CHECK_RC(crescent_engine_install_transport(eng, "nvmeof"), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(crescent_engine_uninstall_transport(eng, "nvmeof"), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(crescent_engine_install_transport(eng, NULL), CRESCENT_ERR_INVALID_ARGUMENT);
    uninstall_install(name);

    memset(src, 0, BUF);
    crescent_transfer_request_t r = {CRESCENT_OPCODE_READ, src, self_seg, (uint64_t)(uintptr_t)dst, 4096};
    CHECK_OK(crescent_engine_submit(eng, b, &r, 1));
    CHECK_OK(crescent_engine_wait(eng, b, INT64_MAX, &st)); /* a huge timeout is no limit, not an overflow */
    CHECK(st.status == CRESCENT_STATUS_COMPLETED && memcmp(src, dst, 4096) == 0);
    CHECK_RC(crescent_engine_submit(eng, b, w, 2), CRESCENT_ERR_TOO_MANY_REQUESTS); /* 3 of 4 used */
    CHECK_OK(crescent_engine_free_batch(eng, b));
    CHECK_RC(crescent_engine_free_batch(eng, b), CRESCENT_ERR_INVALID_ARGUMENT); /* freed: stale */

    /* Bad requests are refused before anything starts. */
    CHECK_OK(crescent_engine_allocate_batch(eng, 4, &b));
    unsigned char stack[64];
    crescent_transfer_request_t bad[] = {
        {CRESCENT_OPCODE_WRITE, stack, self_seg, (uint64_t)(uintptr_t)dst, sizeof stack}, /* unregistered */
        {CRESCENT_OPCODE_WRITE, src, self_seg, 16, 64},                                   /* outside peer */
        {7, src, self_seg, (uint64_t)(uintptr_t)dst, 64},                                 /* opcode */
        {CRESCENT_OPCODE_WRITE, src, self_seg, (uint64_t)(uintptr_t)dst, 0},              /* length */
        {CRESCENT_OPCODE_WRITE, src, 12345, (uint64_t)(uintptr_t)dst, 64},                /* segment */
    };
    int want[] = {CRESCENT_ERR_ADDRESS_NOT_REGISTERED, CRESCENT_ERR_INVALID_ARGUMENT, CRESCENT_ERR_INVALID_ARGUMENT,
                  CRESCENT_ERR_INVALID_ARGUMENT, CRESCENT_ERR_INVALID_ARGUMENT};
    for (int i = 0; i < 5; i++) {
        CHECK_RC(crescent_engine_submit(eng, b, &bad[i], 1), want[i]);
        CHECK(crescent_last_error_code() == want[i] && crescent_last_error()[0] != 0);
    }
    CHECK_OK(crescent_engine_free_batch(eng, b));
    CHECK_RC(crescent_engine_submit(eng, b, NULL, 1), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(crescent_engine_allocate_batch(eng, 0, &b), CRESCENT_ERR_INVALID_ARGUMENT);

    /* Many threads through one engine. */
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)t) == 0);
    for (size_t t = 0; t < THREADS; t++) pthread_join(th[t], NULL);

    CHECK_OK(crescent_engine_close_segment(eng, self_seg));
    CHECK_OK(crescent_engine_unregister_memory(eng, src));
    CHECK_RC(crescent_engine_unregister_memory(eng, src), CRESCENT_ERR_ADDRESS_NOT_REGISTERED);
    void *rest[] = {dst};
    CHECK_OK(crescent_engine_unregister_memory_batch(eng, rest, 1));
    CHECK_OK(crescent_engine_destroy(eng));
    CHECK_RC(crescent_engine_destroy(eng), CRESCENT_ERR_INVALID_ARGUMENT);
    CHECK_RC(crescent_engine_open_segment(eng, name, &self_seg), CRESCENT_ERR_INVALID_ARGUMENT);
    free(src);
    free(dst);
    printf("test_engine: ok\n");
    return 0;
}
