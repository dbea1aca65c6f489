// Command crescent-master runs the store's master: metadata of keys,
// replicas, leases, pins and segments, over gRPC, with an HTTP admin port.
// It runs with no flags (rpc 0.0.0.0:50051, admin 9003); every flag can
// also be set in a YAML file (--config) under the same name.
//
// With --ha_backend etcd|redis (and --oplog etcd://...) several masters
// run as one: ha/supervisor elects a leader, the others follow the log as
// hot standbys with their RPC port unbound; the admin port is always up,
// with /role and /leader (JSON) and /health 200 only on the serving
// leader (ha.go).
package main
