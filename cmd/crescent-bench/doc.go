// Command crescent-bench measures Crescent beside the physical limit of
// the same machine, measured in the same run.
//
//	crescent-bench transfer [flags]   transfer engine throughput and latency
//	crescent-bench store [flags]      store put/get throughput and latency vs Redis
//
// Run "crescent-bench transfer -h" (or store -h) for the flags.
package main
