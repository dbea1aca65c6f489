// Command crescent-bench measures Crescent beside the physical limit of
// the same machine, measured in the same run.
//
//	crescent-bench transfer [flags]   transfer engine throughput and latency
//	crescent-bench store [flags]      store put/get throughput and latency vs Redis
//	crescent-bench rpc [flags]        unary latency of the master's RPC layers vs plain gRPC
//	crescent-bench ha [flags]         failover of HA masters under put load: seconds and lost acks
//
// Run "crescent-bench transfer -h" (or store -h, rpc -h, ha -h) for the flags.
package main
