// Package chaos holds the HA chaos suite and nothing else: tests that run
// three crescent-master processes in HA mode (bench.HACluster) on an
// embedded three-member etcd cluster (and a real redis-server for Redis
// leadership), keep a put load up through a store client on the HA
// address, and break things with real signals: kill -9 the leader again
// and again, SIGSTOP it past its lease then SIGCONT it, stop an etcd
// member, restart Redis. After each, every acknowledged put must be
// readable with its bytes and each term must have had one leader.
// Failover times are logged, never asserted (benchmarks measure them:
// crescent-bench ha).
//
// TestMain builds crescent-master once into a temporary directory with
// the go tool that runs the tests.
package chaos
