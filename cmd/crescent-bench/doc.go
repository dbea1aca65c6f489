// Command crescent-bench measures Crescent beside the physical limit of
// the same machine, measured in the same run.
//
//	crescent-bench transfer [flags]   transfer engine throughput and latency
//	crescent-bench store [flags]      store put/get throughput and latency vs Redis
//	                                  (--dummy N: through dummy clients of a local socket)
//	crescent-bench rpc [flags]        unary latency of the master's RPC layers vs plain gRPC
//
// Run "crescent-bench transfer -h" (or store -h, rpc -h) for the flags.
package main
