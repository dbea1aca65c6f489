/* C test of dummy clients (crescent_store_dial_local) against a real
 * crescent-client serving CRESCENT_LOCAL_SOCKET with a shared hot cache
 * (--local_hot_cache_shm=1, admission at the first miss), started by
 * csrc/run_tests.sh with the master at CRESCENT_MASTER. */
#include <stdint.h>
#include <string.h>

#include "check.h"

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 29);
}

int main(void) {
    const char *sock = getenv("CRESCENT_LOCAL_SOCKET"), *master = getenv("CRESCENT_MASTER");
    CHECK(sock != NULL && master != NULL);

    /* No such socket: a clear code and a message naming the path. */
    crescent_store_t d;
    CHECK_RC(crescent_store_dial_local("/nonexistent/crescent.sock", &d), CRESCENT_RPC_FAIL);
    CHECK(crescent_last_error_code() == CRESCENT_RPC_FAIL);
    CHECK(strstr(crescent_last_error(), "/nonexistent/crescent.sock") != NULL);
    CHECK_RC(crescent_store_dial_local("", &d), CRESCENT_INVALID_PARAMS);
    CHECK_RC(crescent_store_dial_local(NULL, &d), CRESCENT_INVALID_PARAMS);

    CHECK_OK(crescent_store_dial_local(sock, &d));

    /* put / get / get_into / exist through the real client. */
    static unsigned char v[100000], got[100000];
    fill(v, sizeof v, 3);
    CHECK_OK(crescent_store_put(d, "cdummy/a", v, sizeof v, NULL));
    CHECK_RC(crescent_store_put(d, "cdummy/a", v, sizeof v, NULL), CRESCENT_OBJECT_ALREADY_EXISTS);
    void *val;
    size_t n;
    CHECK_OK(crescent_store_get(d, "cdummy/a", &val, &n));
    CHECK(n == sizeof v && memcmp(val, v, n) == 0);
    crescent_free(val);
    CHECK_RC(crescent_store_get_into(d, "cdummy/a", got, sizeof got), sizeof v);
    CHECK(memcmp(got, v, sizeof v) == 0);
    CHECK_RC(crescent_store_get_into(d, "cdummy/a", got, 10), CRESCENT_BUFFER_OVERFLOW);
    CHECK_RC(crescent_store_exist(d, "cdummy/a"), 1);
    CHECK_RC(crescent_store_exist(d, "cdummy/none"), 0);
    CHECK_RC(crescent_store_get(d, "cdummy/none", &val, &n), CRESCENT_OBJECT_NOT_FOUND);
    CHECK_RC(crescent_store_remove_all(d, 1), CRESCENT_NOT_SUPPORTED);

    /* get_buffer views the real client's shared hot cache: a value put by
     * another client (so it is not in the real client's own segment) is
     * admitted at its first miss; two views held at once then show the
     * same cache block, not two private copies. */
    crescent_store_t other;
    const char *ok[] = {"master_server_address", "local_hostname"}, *ov[] = {master, "127.0.0.1"};
    CHECK_OK(crescent_store_create_kv(ok, ov, 2, &other));
    static unsigned char hot[1 << 19];
    fill(hot, sizeof hot, 7);
    CHECK_OK(crescent_store_put(other, "cdummy/hot", hot, sizeof hot, NULL));
    CHECK_OK(crescent_store_close(other));

    crescent_buffer_t b1, b2;
    void *p1, *p2;
    size_t n1, n2;
    CHECK_OK(crescent_store_get_buffer(d, "cdummy/hot", &b1, &p1, &n1)); /* the miss fills a block */
    CHECK(n1 == sizeof hot && memcmp(p1, hot, n1) == 0);
    CHECK_OK(crescent_buffer_release(b1));
    CHECK_OK(crescent_store_get_buffer(d, "cdummy/hot", &b1, &p1, &n1));
    CHECK_OK(crescent_store_get_buffer(d, "cdummy/hot", &b2, &p2, &n2));
    CHECK(n1 == sizeof hot && n2 == sizeof hot);
    CHECK(p1 == p2); /* one block of the shared cache, mapped here */
    CHECK(memcmp(p1, hot, n1) == 0);
    CHECK_OK(crescent_buffer_release(b1));
    CHECK_OK(crescent_buffer_release(b2));
    CHECK_RC(crescent_buffer_release(b2), CRESCENT_INVALID_PARAMS); /* released: stale */
    CHECK_RC(crescent_store_get_buffer(d, "cdummy/none", &b1, &p1, &n1), CRESCENT_OBJECT_NOT_FOUND);

    CHECK_OK(crescent_store_remove(d, "cdummy/a", 1));
    CHECK_OK(crescent_store_remove(d, "cdummy/hot", 1));
    CHECK_RC(crescent_store_exist(d, "cdummy/a"), 0);
    CHECK_OK(crescent_store_close(d));
    CHECK_RC(crescent_store_exist(d, "cdummy/a"), CRESCENT_INVALID_PARAMS); /* closed handle */
    CHECK_RC(crescent_store_close(d), CRESCENT_INVALID_PARAMS);
    printf("test_dummy: ok\n");
    return 0;
}
