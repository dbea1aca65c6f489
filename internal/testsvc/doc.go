// Package testsvc starts the real servers that tests of the metadata
// backends need, on 127.0.0.1 only, and stops them in the test's cleanup:
//
//   - StartRedis runs redis-server (installed by `make deps`) on a free
//     port with persistence off (--save "" --appendonly no) and a
//     temporary --dir; extra arguments pass through. A missing binary
//     skips the test, or fails it when CRESCENT_REQUIRE_DEPS=1.
//   - StartEtcd runs a single-member etcd in-process
//     (go.etcd.io/etcd/server/v3/embed) on free client and peer ports with
//     a temporary data dir and fsync off.
//   - MasterReady dials a master's RPC port with crpc, optionally from a
//     given local address (a non-loopback peer), and asks ServiceReady:
//     whether that peer is served.
//
// Free ports are found by binding port 0 and releasing it; a start that
// collides is retried on other ports. GoleakIgnores lists the goroutines
// that etcd's dependencies leave running for the life of the process.
package testsvc
