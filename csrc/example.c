/* Example: put and get a value through a Crescent master.
 *   gcc -Iinclude csrc/example.c -Lbuild -lcrescent -o example
 *   ./example 127.0.0.1:50051 */
#include <stdio.h>
#include <string.h>

#include "crescent.h"

int main(int argc, char **argv) {
    crescent_store_config_t cfg = {0};
    cfg.master_server_address = argc > 1 ? argv[1] : "127.0.0.1:50051";
    cfg.local_hostname = "127.0.0.1";
    cfg.global_segment_size = 64 << 20; /* contribute 64 MiB to the pool */
    cfg.local_buffer_size = 16 << 20;

    crescent_store_t store;
    if (crescent_store_create(&cfg, &store) != 0) {
        fprintf(stderr, "create: %s\n", crescent_last_error());
        return 1;
    }
    const char *value = "hello, KV cache";
    int rc = crescent_store_put(store, "example/greeting", value, strlen(value), NULL);
    if (rc != 0 && rc != CRESCENT_OBJECT_ALREADY_EXISTS) {
        fprintf(stderr, "put: %d %s\n", rc, crescent_last_error());
        return 1;
    }
    /* Zero-copy read: a view valid until released. */
    crescent_buffer_t buf;
    void *data;
    size_t size;
    if (crescent_store_get_buffer(store, "example/greeting", &buf, &data, &size) != 0) {
        fprintf(stderr, "get: %s\n", crescent_last_error());
        return 1;
    }
    printf("%.*s\n", (int)size, (const char *)data);
    crescent_buffer_release(buf);
    crescent_store_remove(store, "example/greeting", 1);
    return crescent_store_close(store) == 0 ? 0 : 1;
}
