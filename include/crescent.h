/*
 * crescent.h: the C ABI of Crescent (libcrescent.so, built by `make lib`).
 *
 * Two parts:
 *   - the transfer engine (crescent_engine_*), in the shape of Mooncake's
 *     transfer_engine_c.h: create/destroy, register/unregister memory,
 *     open/close segment, allocate/free batch, submit, status, wait,
 *     notifications;
 *   - the store client (crescent_store_*): create, put/get/get_into,
 *     batch forms, exist, remove, register buffer, zero-copy get_buffer
 *     with a release, close.
 *
 * Conventions, for every function:
 *   - Return value: 0 (CRESCENT_OK) or a positive count on success, a
 *     negative error code on failure. Engine functions return the engine
 *     codes below (Mooncake's transfer engine error.h values); store
 *     functions return the store codes below (Mooncake Store's
 *     include/types.h values). After a failure crescent_last_error() gives
 *     this thread's message.
 *   - Objects are opaque 64-bit handles, never pointers: 0 is never a
 *     valid handle, a destroyed or forged handle is refused with
 *     CRESCENT_ERR_INVALID_ARGUMENT / CRESCENT_INVALID_PARAMS, never a
 *     crash. No pointer into the Go heap is ever handed to C.
 *   - Strings and arrays passed in are read during the call only; the
 *     caller may free them when the call returns. Memory given to
 *     *_register_* must stay mapped until the matching unregister returns
 *     0 (it is read and written by peers meanwhile).
 *   - Memory handed out is owned as stated at each function: free it with
 *     the function named there, exactly once.
 *   - Every function may be called from many threads at once. Calls
 *     block the calling thread only (waits are bounded: see each).
 */
#ifndef CRESCENT_H
#define CRESCENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: bumped on any incompatible change. */
#define CRESCENT_ABI_VERSION 2 /* 2: crescent_store_config_t gained the credential fields */

typedef uint64_t crescent_engine_t;  /* an engine; 0 = none */
typedef uint64_t crescent_segment_t; /* a segment opened by an engine */
typedef uint64_t crescent_batch_t;   /* a batch of an engine */
typedef uint64_t crescent_store_t;   /* a store client; 0 = none */
typedef uint64_t crescent_buffer_t;  /* a zero-copy view from get_buffer */

#define CRESCENT_OK 0

/* ---- Engine error codes (Mooncake transfer engine error.h) ---- */
#define CRESCENT_ERR_INVALID_ARGUMENT (-1)       /* bad handle, index, length, opcode, config */
#define CRESCENT_ERR_TOO_MANY_REQUESTS (-2)      /* batch capacity exceeded */
#define CRESCENT_ERR_ADDRESS_NOT_REGISTERED (-3) /* local memory not registered */
#define CRESCENT_ERR_BATCH_BUSY (-4)             /* requests in flight (free_batch, unregister) */
#define CRESCENT_ERR_DEVICE_NOT_FOUND (-6)
#define CRESCENT_ERR_ADDRESS_OVERLAPPED (-7)     /* overlaps a registered buffer */
#define CRESCENT_ERR_QUARANTINED (-9)            /* Crescent: a peer did not confirm it unmapped the buffer */
#define CRESCENT_ERR_DNS (-101)
#define CRESCENT_ERR_SOCKET (-102)
#define CRESCENT_ERR_MALFORMED_JSON (-103)
#define CRESCENT_ERR_REJECT_HANDSHAKE (-104)
#define CRESCENT_ERR_METADATA (-200)             /* segment not found, metadata backend failed */
#define CRESCENT_ERR_ENDPOINT (-201)             /* no transport reaches the target */
#define CRESCENT_ERR_CONTEXT (-202)              /* the engine is closed */
#define CRESCENT_ERR_MEMORY (-302)               /* out of memory */
#define CRESCENT_ERR_NOT_IMPLEMENTED (-303)

/* ---- Store error codes (Mooncake Store include/types.h) ---- */
#define CRESCENT_INTERNAL_ERROR (-1)
#define CRESCENT_BUFFER_OVERFLOW (-10)
#define CRESCENT_SEGMENT_NOT_FOUND (-101)
#define CRESCENT_SEGMENT_ALREADY_EXISTS (-102)
#define CRESCENT_CLIENT_NOT_FOUND (-103)
#define CRESCENT_NO_AVAILABLE_HANDLE (-200)
#define CRESCENT_INVALID_VERSION (-300)
#define CRESCENT_INVALID_KEY (-400)
#define CRESCENT_WRITE_FAIL (-500)
#define CRESCENT_INVALID_PARAMS (-600)
#define CRESCENT_ILLEGAL_CLIENT (-601)
#define CRESCENT_INVALID_WRITE (-700)
#define CRESCENT_INVALID_READ (-701)
#define CRESCENT_INVALID_REPLICA (-702)
#define CRESCENT_REPLICA_IS_NOT_READY (-703)
#define CRESCENT_OBJECT_NOT_FOUND (-704)
#define CRESCENT_OBJECT_ALREADY_EXISTS (-705)
#define CRESCENT_OBJECT_HAS_LEASE (-706)
#define CRESCENT_LEASE_EXPIRED (-707)
#define CRESCENT_OBJECT_HAS_REPLICATION_TASK (-708)
#define CRESCENT_OBJECT_NO_REPLICATION_TASK (-709)
#define CRESCENT_REPLICA_NOT_FOUND (-710)
#define CRESCENT_REPLICA_ALREADY_EXISTS (-711)
#define CRESCENT_REPLICA_IS_GONE (-712)
#define CRESCENT_REPLICA_NOT_IN_LOCAL_MEMORY (-713)
#define CRESCENT_OBJECT_REPLICA_BUSY (-714)
#define CRESCENT_TRANSFER_FAIL (-800)
#define CRESCENT_CHECKSUM_MISMATCH (-801)
#define CRESCENT_RPC_FAIL (-900)
#define CRESCENT_RPC_TIMEOUT (-901)
#define CRESCENT_ETCD_OPERATION_ERROR (-1000)
#define CRESCENT_ETCD_KEY_NOT_EXIST (-1001)
#define CRESCENT_ETCD_TRANSACTION_FAIL (-1002)
#define CRESCENT_ETCD_CTX_CANCELLED (-1003)
#define CRESCENT_OPLOG_ENTRY_NOT_FOUND (-1004)
#define CRESCENT_INCOMPLETE_OPLOG_CATCH_UP (-1007)
#define CRESCENT_UNAVAILABLE_IN_CURRENT_STATUS (-1010) /* also: the client is closed */
#define CRESCENT_UNAVAILABLE_IN_CURRENT_MODE (-1011)
#define CRESCENT_NOT_SUPPORTED (-1012)
#define CRESCENT_FILE_NOT_FOUND (-1100)
#define CRESCENT_FILE_OPEN_FAIL (-1101)
#define CRESCENT_FILE_READ_FAIL (-1102)
#define CRESCENT_FILE_WRITE_FAIL (-1103)
#define CRESCENT_FILE_INVALID_BUFFER (-1104)
#define CRESCENT_FILE_LOCK_FAIL (-1105)
#define CRESCENT_FILE_INVALID_HANDLE (-1106)
#define CRESCENT_BUCKET_NOT_FOUND (-1200)
#define CRESCENT_BUCKET_ALREADY_EXISTS (-1201)
#define CRESCENT_KEYS_EXCEED_BUCKET_LIMIT (-1202)
#define CRESCENT_KEYS_ULTRA_LIMIT (-1203)
#define CRESCENT_UNABLE_OFFLOAD (-1300)
#define CRESCENT_UNABLE_OFFLOADING (-1301)
#define CRESCENT_TASK_NOT_FOUND (-1400)
#define CRESCENT_TASK_PENDING_LIMIT_EXCEEDED (-1401)
#define CRESCENT_SERIALIZE_FAIL (-1501)
#define CRESCENT_DESERIALIZE_FAIL (-1502)

/* The message of this thread's last failed call ("" when none yet).
 * Owned by the library, valid until this thread's next failed call. */
const char *crescent_last_error(void);

/* The code of this thread's last failed call (0 when none yet). */
int crescent_last_error_code(void);

#if !defined(CRESCENT_BUILDING_LIB) /* the library's own build declares these from Go */
/* CRESCENT_ABI_VERSION of the library (a plain call into Go: the ABI's
 * per-call cost without any work). */
int crescent_abi_version(void);
#endif

/* Frees memory the library handed out with "free with crescent_free". */
void crescent_free(void *p);

/* ================================ Engine ================================ */

#define CRESCENT_OPCODE_READ 0  /* remote -> local */
#define CRESCENT_OPCODE_WRITE 1 /* local -> remote */

#define CRESCENT_STATUS_WAITING 0
#define CRESCENT_STATUS_PENDING 1
#define CRESCENT_STATUS_INVALID 2
#define CRESCENT_STATUS_CANCELED 3
#define CRESCENT_STATUS_COMPLETED 4
#define CRESCENT_STATUS_TIMEOUT 5
#define CRESCENT_STATUS_FAILED 6

/* One request. For memory segments target_offset is the peer's virtual
 * address, as in the reference engine. */
typedef struct crescent_transfer_request {
    int opcode;                   /* CRESCENT_OPCODE_READ or _WRITE */
    void *source;                 /* local, inside registered memory */
    crescent_segment_t target_id; /* from crescent_engine_open_segment */
    uint64_t target_offset;
    uint64_t length;              /* > 0 */
} crescent_transfer_request_t;

typedef struct crescent_transfer_status {
    int status; /* CRESCENT_STATUS_* */
    uint64_t transferred_bytes;
} crescent_transfer_status_t;

typedef struct crescent_batch_status {
    int status; /* COMPLETED only when every request completed */
    uint64_t requests, completed, failed, timed_out, canceled, pending;
    uint64_t transferred_bytes;
} crescent_batch_status_t;

typedef struct crescent_buffer_entry {
    void *addr;
    size_t length;
} crescent_buffer_entry_t;

/* A received notification. Both strings are NUL-terminated; free the
 * array with crescent_engine_free_notifs. */
typedef struct crescent_notify_msg {
    char *name; /* the sender's segment name */
    char *msg;
} crescent_notify_msg_t;

#if !defined(CRESCENT_BUILDING_LIB) /* the library's own build declares these from Go */
/* Starts an engine. metadata_conn_string NULL or "" or "P2PHANDSHAKE" is
 * the P2P handshake (etcd://, redis://, http:// backends are linked in).
 * local_server_name is "host" or "host:port" (NULL: this host, port
 * picked in 15000-17000). protocols is a comma-separated preference list
 * ("shm,tcp"; NULL or "": the engine's default). On success *out is the
 * engine; destroy it with crescent_engine_destroy. */
int crescent_engine_create(const char *metadata_conn_string, const char *local_server_name,
                           const char *protocols, crescent_engine_t *out);

/* Stops the engine and frees its handle (a second call is refused). Its
 * segments and batches are gone with it; registered memory is no longer
 * touched once this returns. */
int crescent_engine_destroy(crescent_engine_t engine);

/* Writes the engine's segment name ("host:port", what peers open) into
 * buf, NUL-terminated. CRESCENT_ERR_INVALID_ARGUMENT when buf_len is too
 * short. */
int crescent_engine_get_local_name(crescent_engine_t engine, char *buf, size_t buf_len);

/* Registers [addr, addr+length) so transfers may use it; location is
 * "cpu:N", "cuda:N" or "*"/NULL (detect). remote_accessible is accepted
 * for the reference's shape (registered memory is always remotely
 * accessible). The memory must stay mapped until unregistered. */
int crescent_engine_register_memory(crescent_engine_t engine, void *addr, size_t length,
                                    const char *location, int remote_accessible);

/* Withdraws a registration made at addr, waiting (up to 10 s) for
 * transfers touching it. Only 0 means the memory may be freed:
 * CRESCENT_ERR_BATCH_BUSY asks to call again; CRESCENT_ERR_QUARANTINED
 * means a same-host peer may still map it: keep it until the process
 * ends. */
int crescent_engine_unregister_memory(crescent_engine_t engine, void *addr);

/* Batch forms: all or the failing one's code (earlier ones stay done). */
int crescent_engine_register_memory_batch(crescent_engine_t engine, const crescent_buffer_entry_t *list,
                                          size_t count, const char *location);
int crescent_engine_unregister_memory_batch(crescent_engine_t engine, void *const *addrs, size_t count);

/* Opens a peer's segment by name (in P2P mode its "host:port"; the
 * engine's own name opens a loopback segment). */
int crescent_engine_open_segment(crescent_engine_t engine, const char *name, crescent_segment_t *out);
int crescent_engine_close_segment(crescent_engine_t engine, crescent_segment_t segment);

/* A batch holds up to batch_size requests (over all its submits). */
int crescent_engine_allocate_batch(crescent_engine_t engine, size_t batch_size, crescent_batch_t *out);

/* Refused with CRESCENT_ERR_BATCH_BUSY while a request is in flight. */
int crescent_engine_free_batch(crescent_engine_t engine, crescent_batch_t batch);

/* Validates every entry, then starts all of them or none. One crossing
 * into the library per call, whatever count is. */
int crescent_engine_submit(crescent_engine_t engine, crescent_batch_t batch,
                           const crescent_transfer_request_t *entries, size_t count);

/* Submit, then deliver msg to segment target once the batch completed
 * (before wait returns). */
int crescent_engine_submit_with_notify(crescent_engine_t engine, crescent_batch_t batch,
                                       const crescent_transfer_request_t *entries, size_t count,
                                       crescent_segment_t target, const char *msg);

/* Status of request task (its index in submit order) without waiting. */
int crescent_engine_get_transfer_status(crescent_engine_t engine, crescent_batch_t batch, size_t task,
                                        crescent_transfer_status_t *status);

/* Summary of the batch without waiting. */
int crescent_engine_get_batch_status(crescent_engine_t engine, crescent_batch_t batch,
                                     crescent_batch_status_t *status);

/* Waits until no request of the batch is pending or timeout_ms passed
 * (negative: no limit but the engine's transfer timeout); unfinished
 * requests then end TIMEOUT. Returns 0 with *status filled whenever the
 * batch was found: status->status says how it ended. */
int crescent_engine_wait(crescent_engine_t engine, crescent_batch_t batch, int64_t timeout_ms,
                         crescent_batch_status_t *status);

/* Drains received notifications: *out is an array of *count entries
 * (NULL and 0 when none); free it with crescent_engine_free_notifs. */
int crescent_engine_get_notifs(crescent_engine_t engine, crescent_notify_msg_t **out, size_t *count);

/* Sends msg (NUL-terminated) to the opened segment target now, with no
 * batch (the reference's genNotifyInEngine); returns once the peer's
 * engine answered (it drops messages over its bound, 64 KiB by default).
 * The receiver sees this engine's name. */
int crescent_engine_notify(crescent_engine_t engine, crescent_segment_t target, const char *msg);

/* open_segment with the descriptor fetched now, even when the segment is
 * open already (the reference's openSegmentNoCache). Close it with
 * crescent_engine_close_segment like any other. */
int crescent_engine_open_segment_no_cache(crescent_engine_t engine, const char *name,
                                          crescent_segment_t *out);

/* Fetches the descriptor of every opened segment again (the reference's
 * syncSegmentCache). Every segment is tried; the code is the first
 * failure's (CRESCENT_ERR_SOCKET for a peer whose engine is gone). */
int crescent_engine_sync_segment_cache(crescent_engine_t engine);

/* The reference's install/uninstallTransport, on a live engine.
 * install starts proto ("tcp", "shm", "cxl", "rdma", "efa"), registers
 * the memory registered so far with it and republishes the segment
 * descriptor (peers see it on their next fetch: sync_segment_cache, a
 * watch, or a request outside their cached copy); a running one is 0;
 * an unknown name is CRESCENT_ERR_INVALID_ARGUMENT, one this host or
 * build cannot run CRESCENT_ERR_NOT_IMPLEMENTED.
 * uninstall republishes the descriptor without proto, withdraws the
 * registered memory from it and closes its listener and connections:
 * requests it carried end FAILED (their message says proto was
 * uninstalled), later ones only it could carry are refused with
 * CRESCENT_ERR_ENDPOINT naming it; one not running is
 * CRESCENT_ERR_INVALID_ARGUMENT. Installing again works. */
int crescent_engine_install_transport(crescent_engine_t engine, const char *proto);
int crescent_engine_uninstall_transport(crescent_engine_t engine, const char *proto);
#endif
void crescent_engine_free_notifs(crescent_notify_msg_t *msgs, size_t count);

/* ================================ Store ================================= */

/* NULL or "" strings and 0 numbers take their defaults. */
typedef struct crescent_store_config {
    const char *master_server_address; /* "host:port", default 127.0.0.1:50051 */
    const char *local_hostname;        /* engine host or host:port */
    const char *metadata_server;       /* default P2PHANDSHAKE */
    const char *protocol;              /* comma-separated transports, default the engine's */
    const char *device_name;           /* accepted for the reference's shape; unused */
    const char *master_protocol;       /* auto (default), crpc, grpc */
    uint64_t global_segment_size;      /* memory contributed to the pool (0 = none) */
    uint64_t local_buffer_size;        /* staging pool (default 256 MiB) */
    uint64_t rpc_timeout_ms;           /* each master call (default 10000) */
    /* Credentials, as the binaries' flags of the same names (NULL/"":
     * the environment variable in brackets, else none). The cluster
     * token authenticates the master connection and the engine's. */
    const char *token_file;            /* --token_file [CRESCENT_TOKEN_FILE] */
    const char *admin_token_file;      /* --admin_token_file, for remove_all, remove_by_regex and forced removes [CRESCENT_ADMIN_TOKEN_FILE] */
    const char *tls_ca;                /* --tls_ca: verifies the master; any tls_* turns TLS on [CRESCENT_TLS_CA] */
    const char *tls_cert;              /* --tls_cert, for a master that verifies clients [CRESCENT_TLS_CERT] */
    const char *tls_key;               /* --tls_key [CRESCENT_TLS_KEY] */
} crescent_store_config_t;

/* How a put places its replicas; NULL means the defaults (one replica,
 * no pins, no preference). */
typedef struct crescent_replicate_config {
    int replica_num;               /* 0 = 1 */
    int with_soft_pin;
    int with_hard_pin;
    const char *preferred_segment; /* NULL/"" = none; else comma-separated segment names */
    int prefer_alloc_in_same_node;
} crescent_replicate_config_t;

#if !defined(CRESCENT_BUILDING_LIB) /* the library's own build declares these from Go */
/* Connects a client to the master. Destroy it with crescent_store_close. */
int crescent_store_create(const crescent_store_config_t *config, crescent_store_t *out);

/* The same from count key/value strings, keys named as the fields of
 * crescent_store_config_t (sizes in bytes, decimal), and two more:
 * put_ahead_bytes, the pool memory the client's put-ahead reservations
 * may hold (default 64 MiB; at least the bytes of the batch puts in
 * flight at once), and location_cache, how many objects' locations the
 * client caches so repeated gets skip the master (default 0: off). An
 * unknown key is CRESCENT_INVALID_PARAMS. */
int crescent_store_create_kv(const char *const *keys, const char *const *values, size_t count,
                             crescent_store_t *out);

/* Connects a dummy client to the real client serving the Unix socket
 * path on this host (crescent-client --local_socket PATH). It has the
 * store calls below, forwarded over the socket, and no memory of its own
 * in the pool. get_buffer views the real client's shared hot cache in
 * place (--local_hot_cache_shm), else a private copy. put_from/get_into
 * move values by reference only in memory from crescent_store_alloc_buffer
 * (memory given to register_buffer is accepted, and its values are copied
 * through the socket). get_hostname, remove_all and remove_by_regex are
 * CRESCENT_NOT_SUPPORTED. A broken connection fails the calls in flight
 * with CRESCENT_RPC_FAIL; the next call connects again. Close it with
 * crescent_store_close. */
int crescent_store_dial_local(const char *path, crescent_store_t *out);

/* Unmounts the client's memory and closes it; frees the handle. Buffers
 * from get_buffer stay valid until released; memory from alloc_buffer
 * not yet freed is unmapped. */
int crescent_store_close(crescent_store_t store);

/* Writes this client's segment name ("host:port") into buf. */
int crescent_store_get_hostname(crescent_store_t store, char *buf, size_t buf_len);

/* Stores size bytes at value under key. put_from is the same call,
 * named for values in memory given to register_buffer (written to the
 * replicas with no copy); other memory goes through staging. */
int crescent_store_put(crescent_store_t store, const char *key, const void *value, size_t size,
                       const crescent_replicate_config_t *config);
int crescent_store_put_from(crescent_store_t store, const char *key, const void *value, size_t size,
                            const crescent_replicate_config_t *config);

/* Reads the value into dst; returns its size (>= 0) or a code
 * (CRESCENT_BUFFER_OVERFLOW when capacity is too small). */
int64_t crescent_store_get_into(crescent_store_t store, const char *key, void *dst, size_t capacity);

/* Reads the value into memory the library allocates: *value (free with
 * crescent_free) and *size. */
int crescent_store_get(crescent_store_t store, const char *key, void **value, size_t *size);

/* Zero-copy read: *data and *size view the value (in place when the replica
 * is in this client's own segment, else in its staging pool) until
 * crescent_buffer_release(*out). A view in place is guaranteed unchanged
 * only within the read lease (the master's default_kv_lease_ttl). */
int crescent_store_get_buffer(crescent_store_t store, const char *key, crescent_buffer_t *out,
                              void **data, size_t *size);
int crescent_buffer_release(crescent_buffer_t buffer);

/* Batch forms: one crossing and shared RPCs for all count items.
 * results[i] is item i's outcome (0 / size / 1-0 for exist, or a code);
 * the return value is 0 when every item succeeded, else the code of the
 * first item that failed (or of the call, when its arguments are bad). */
int crescent_store_batch_put(crescent_store_t store, const char *const *keys, const void *const *values,
                             const size_t *sizes, size_t count, const crescent_replicate_config_t *config,
                             int *results);
int crescent_store_batch_get_into(crescent_store_t store, const char *const *keys, void *const *dsts,
                                  const size_t *capacities, size_t count, int64_t *results);
/* values[i] (free each with crescent_free) and sizes[i] are set for the
 * items that succeeded, NULL and 0 for the others. */
int crescent_store_batch_get(crescent_store_t store, const char *const *keys, size_t count, void **values,
                             size_t *sizes, int *results);
int crescent_store_batch_exist(crescent_store_t store, const char *const *keys, size_t count, int *results);
int crescent_store_batch_remove(crescent_store_t store, const char *const *keys, size_t count, int force,
                                int *results);

/* 1 when key is stored and complete, 0 when not, or a code. Grants a
 * read lease, as the reference does. */
int crescent_store_exist(crescent_store_t store, const char *key);

/* Removes key (force: even while leased). */
int crescent_store_remove(crescent_store_t store, const char *key, int force);

/* Remove every key (or those matching an RE2 regex); returns how many. */
int64_t crescent_store_remove_all(crescent_store_t store, int force);
int64_t crescent_store_remove_by_regex(crescent_store_t store, const char *regex, int force);

/* Registers [addr, addr+size) with the client's engine so put_from and
 * get_into move its bytes with no copy. The memory must stay mapped until
 * unregister_buffer returns 0. */
int crescent_store_register_buffer(crescent_store_t store, void *addr, size_t size);
int crescent_store_unregister_buffer(crescent_store_t store, void *addr);

/* Maps at least size bytes of shared memory (a memfd) registered with the
 * client: put_from and get_into move values in it with no copy, through a
 * real client or a dummy alike. *out is its address; it stays mapped
 * until crescent_store_free_buffer(store, *out) returns 0 or the store
 * is closed. */
int crescent_store_alloc_buffer(crescent_store_t store, size_t size, void **out);
int crescent_store_free_buffer(crescent_store_t store, void *addr);
#endif

#ifdef __cplusplus
}
#endif

#endif /* CRESCENT_H */
