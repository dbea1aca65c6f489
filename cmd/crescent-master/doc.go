// Command crescent-master runs the store's master: metadata of keys,
// replicas, leases, pins and segments. The RPC port serves gRPC and crpc
// (internal/crpc, the store clients' lighter framing), told apart by each
// connection's first bytes; the HTTP admin port serves a status page at
// /, its /status.json, metrics and the pages of store/master/admin.
// It runs with no flags (rpc 0.0.0.0:50051, admin 9003); every flag can
// also be set in a YAML file (--config) under the same name; docs/master.yaml
// is a commented sample listing every key with its default.
//
// A bad command line or config exits 2 with one line naming the flag or
// key: unknown flags, stray arguments, unknown YAML keys, more than one
// YAML document, a bad log_level or log_format, values out of range (counts below 1,
// negative durations), an rpc_address that does not resolve. An address
// that cannot be bound exits 1 naming its flags. --version prints the
// build; -h the flags.
//
// Logs go to stderr through one slog handler (internal/logx): --log_level
// debug|info|warn|error, --log_format text|json; etcd's client and gRPC
// log through it too (component=etcd, component=grpc). Mounts, unmounts,
// client expiries and eviction rounds are info lines, puts debug.
//
// With --ha_backend etcd|redis (and --oplog etcd://...) several masters
// run as one: ha/supervisor elects a leader, the others follow the log as
// hot standbys with their RPC port unbound; the admin port is always up,
// with /role and /leader (JSON) and /health 200 only on the serving
// leader (ha.go).
//
// Security (security.go): --token_file (the cluster token every RPC
// connection proves), --tls_cert/--tls_key (TLS on the RPC and HTTP
// ports, files re-read when they change), --tls_ca (client certificates
// required: mTLS), --admin_token_file (RemoveAll, RemoveByRegex, forced
// removes and the admin port's POSTs need it; without it they are
// refused unless --insecure). With neither a token nor --tls_ca the RPC
// and HTTP ports admit loopback peers only and one log line says so;
// --insecure opens them without authentication, and is refused together
// with a credential (exit 2).
package main
