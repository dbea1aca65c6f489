// Command crescent-master runs the store's master: metadata of keys,
// replicas, leases, pins and segments, over gRPC, with an HTTP admin port.
// It runs with no flags (rpc 0.0.0.0:50051, admin 9003); every flag can
// also be set in a YAML file (--config) under the same name.
package main
