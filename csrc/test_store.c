/* C test of the store ABI against a real master (CRESCENT_MASTER=host:port,
 * started by csrc/run_tests.sh): put/get/get_into/get_buffer, batches,
 * exist/remove, error codes, many threads. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define THREADS 8

static crescent_store_t st;

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 13);
}

static void *worker(void *arg) {
    size_t t = (size_t)arg;
    unsigned char v[8192], got[8192];
    char key[64];
    for (int i = 0; i < 25; i++) {
        snprintf(key, sizeof key, "t%zu/k%d", t, i);
        fill(v, sizeof v, (unsigned)(t * 100 + i));
        CHECK_OK(crescent_store_put(st, key, v, sizeof v, NULL));
        CHECK_RC(crescent_store_get_into(st, key, got, sizeof got), sizeof v);
        CHECK(memcmp(v, got, sizeof v) == 0);
    }
    snprintf(key, sizeof key, "t%zu/missing", t);
    CHECK_RC(crescent_store_get_into(st, key, got, sizeof got), CRESCENT_OBJECT_NOT_FOUND);
    CHECK(strstr(crescent_last_error(), "OBJECT_NOT_FOUND") != NULL);
    return NULL;
}

int main(void) {
    const char *master = getenv("CRESCENT_MASTER");
    CHECK(master != NULL);

    /* Bad configurations fail with a code and a message. */
    crescent_store_t bad;
    const char *bk[] = {"master_server_address", "no_such_key"}, *bv[] = {master, "1"};
    CHECK_RC(crescent_store_create_kv(bk, bv, 2, &bad), CRESCENT_INVALID_PARAMS);
    CHECK(strstr(crescent_last_error(), "no_such_key") != NULL);
    const char *nk[] = {"global_segment_size"}, *nv[] = {"lots"};
    CHECK_RC(crescent_store_create_kv(nk, nv, 1, &bad), CRESCENT_INVALID_PARAMS);

    const char *keys[] = {"master_server_address", "local_hostname", "global_segment_size", "local_buffer_size"};
    const char *vals[] = {master, "127.0.0.1", "67108864", "33554432"};
    CHECK_OK(crescent_store_create_kv(keys, vals, 4, &st));
    char host[128];
    CHECK_OK(crescent_store_get_hostname(st, host, sizeof host));
    CHECK(strncmp(host, "127.0.0.1:", 10) == 0);
    crescent_store_remove_all(st, 1);

    /* put / get / get_into / exist / remove */
    static unsigned char v[1 << 20], got[1 << 20];
    fill(v, sizeof v, 1);
    crescent_replicate_config_t rc = {1, 0, 0, NULL, 0};
    CHECK_OK(crescent_store_put(st, "big", v, sizeof v, &rc));
    CHECK_RC(crescent_store_put(st, "big", v, sizeof v, &rc), CRESCENT_OBJECT_ALREADY_EXISTS);
    CHECK_RC(crescent_store_put(st, "empty", v, 0, NULL), CRESCENT_INVALID_PARAMS);
    CHECK_RC(crescent_store_put(st, "", v, 16, NULL), CRESCENT_INVALID_KEY);
    CHECK_RC(crescent_store_exist(st, "big"), 1);
    CHECK_RC(crescent_store_exist(st, "nope"), 0);
    CHECK_RC(crescent_store_get_into(st, "big", got, sizeof got), sizeof v);
    CHECK(memcmp(v, got, sizeof v) == 0);
    CHECK_RC(crescent_store_get_into(st, "big", got, 100), CRESCENT_BUFFER_OVERFLOW);
    void *p;
    size_t n;
    CHECK_OK(crescent_store_get(st, "big", &p, &n));
    CHECK(n == sizeof v && memcmp(p, v, n) == 0);
    crescent_free(p);

    /* zero-copy view */
    crescent_buffer_t b;
    CHECK_OK(crescent_store_get_buffer(st, "big", &b, &p, &n));
    CHECK(n == sizeof v && memcmp(p, v, n) == 0);
    CHECK_OK(crescent_buffer_release(b));
    CHECK_RC(crescent_buffer_release(b), CRESCENT_INVALID_PARAMS);
    CHECK_RC(crescent_store_get_buffer(st, "nope", &b, &p, &n), CRESCENT_OBJECT_NOT_FOUND);

    /* registered buffers: put_from / get_into with no copy */
    unsigned char *reg = aligned_alloc(4096, 1 << 20);
    CHECK(reg != NULL);
    CHECK_OK(crescent_store_register_buffer(st, reg, 1 << 20));
    CHECK_RC(crescent_store_register_buffer(st, reg, 1 << 20), CRESCENT_INVALID_PARAMS);
    fill(reg, 4096, 9);
    CHECK_OK(crescent_store_put_from(st, "reg", reg, 4096, NULL));
    CHECK_RC(crescent_store_get_into(st, "reg", reg + 8192, 4096), 4096);
    CHECK(memcmp(reg, reg + 8192, 4096) == 0);
    CHECK_OK(crescent_store_unregister_buffer(st, reg));
    CHECK_RC(crescent_store_unregister_buffer(st, reg), CRESCENT_INVALID_PARAMS);
    free(reg);

    /* batches: one call each */
    const char *bkeys[] = {"b0", "b1", "b2", "big"};
    static unsigned char bv0[4096], bv1[4096], bv2[4096];
    fill(bv0, 4096, 20), fill(bv1, 4096, 21), fill(bv2, 4096, 22);
    const void *bvals[] = {bv0, bv1, bv2, bv0};
    size_t bsizes[] = {4096, 4096, 4096, 4096};
    int res[4];
    CHECK_RC(crescent_store_batch_put(st, bkeys, bvals, bsizes, 4, NULL, res), CRESCENT_OBJECT_ALREADY_EXISTS);
    CHECK(res[0] == 0 && res[1] == 0 && res[2] == 0 && res[3] == CRESCENT_OBJECT_ALREADY_EXISTS);
    const char *gkeys[] = {"b0", "b1", "b2", "nope"};
    static unsigned char g0[4096], g1[4096], g2[4096], g3[4096];
    void *dsts[] = {g0, g1, g2, g3};
    size_t caps[] = {4096, 4096, 4096, 4096};
    int64_t res64[4];
    CHECK_RC(crescent_store_batch_get_into(st, gkeys, dsts, caps, 4, res64), CRESCENT_OBJECT_NOT_FOUND);
    CHECK(res64[0] == 4096 && res64[1] == 4096 && res64[2] == 4096 && res64[3] == CRESCENT_OBJECT_NOT_FOUND);
    CHECK(memcmp(g0, bv0, 4096) == 0 && memcmp(g1, bv1, 4096) == 0 && memcmp(g2, bv2, 4096) == 0);
    void *outs[4];
    size_t osz[4];
    CHECK_RC(crescent_store_batch_get(st, gkeys, 4, outs, osz, res), CRESCENT_OBJECT_NOT_FOUND);
    CHECK(res[0] == 0 && osz[1] == 4096 && memcmp(outs[2], bv2, 4096) == 0 && outs[3] == NULL && osz[3] == 0);
    for (int i = 0; i < 4; i++) crescent_free(outs[i]);
    CHECK_OK(crescent_store_batch_exist(st, gkeys, 4, res));
    CHECK(res[0] == 1 && res[1] == 1 && res[2] == 1 && res[3] == 0);
    CHECK_RC(crescent_store_batch_remove(st, gkeys, 4, 1, res), CRESCENT_OBJECT_NOT_FOUND);
    CHECK(res[0] == 0 && res[3] == CRESCENT_OBJECT_NOT_FOUND);
    CHECK_RC(crescent_store_exist(st, "b0"), 0);
    CHECK_RC(crescent_store_batch_put(st, bkeys, NULL, bsizes, 4, NULL, res), CRESCENT_INVALID_PARAMS);

    /* many threads */
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)t) == 0);
    for (size_t t = 0; t < THREADS; t++) pthread_join(th[t], NULL);

    CHECK_RC(crescent_store_remove_by_regex(st, "^t0/.*", 1), 25);
    CHECK_OK(crescent_store_remove(st, "big", 1));
    CHECK_RC(crescent_store_remove(st, "big", 1), CRESCENT_OBJECT_NOT_FOUND);
    CHECK(crescent_store_remove_all(st, 1) >= 7 * 25);

    /* A view outlives close; the handle does not. */
    CHECK_OK(crescent_store_put(st, "last", v, 4096, NULL));
    CHECK_OK(crescent_store_get_buffer(st, "last", &b, &p, &n));
    CHECK_OK(crescent_store_close(st));
    CHECK(n == 4096 && memcmp(p, v, 4096) == 0);
    CHECK_OK(crescent_buffer_release(b));
    CHECK_RC(crescent_store_close(st), CRESCENT_INVALID_PARAMS);
    CHECK_RC(crescent_store_put(st, "x", v, 16, NULL), CRESCENT_INVALID_PARAMS);
    printf("test_store: ok\n");
    return 0;
}
