// Command crescent-bench measures Crescent beside the physical limit of
// the same machine, measured in the same run.
//
//	crescent-bench transfer [flags]   transfer engine throughput and latency
//	crescent-bench store [flags]      store put/get throughput and latency vs Redis
//	                                  (--dummy N: through dummy clients of a local socket)
//	crescent-bench rpc [flags]        unary latency of the master's RPC layers vs plain gRPC
//	crescent-bench ha [flags]         failover of HA masters under put load: seconds and lost acks
//
// Run "crescent-bench transfer -h" (or store -h, rpc -h, ha -h) for the flags;
// --version prints the build. A bad command line exits 2 with one line
// naming the flag: unknown flags and stray arguments, counts below 1
// (--threads, --batch_size, --clients, --replicas, ...; 0 never means "the
// default"), sizes that are not positive, an unknown --report_unit, and
// --duration 0 (every run is timed; a target runs until signalled
// whatever --duration says). Other failures exit 1.
package main
