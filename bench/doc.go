// Package bench is the benchmark harness behind crescent-bench: it runs a
// workload and, in the same run, the physical baseline it is compared with
// (memcpy between the same buffers for memory transports, a raw TCP stream
// over as many connections for TCP), and reports throughput, the ratio to
// the baseline and request latency percentiles.
//
// The transfer workload follows the reference's transfer_engine_bench:
// each of Threads goroutines allocates a batch, submits BatchSize requests
// of BlockSize bytes at offsets BlockSize*(i*Threads+thread) of the local
// and the target buffer, waits, and frees the batch, for Duration after a
// warm-up. Buffers come from prefaulted mempool arenas, so no run times
// first-touch page faults.
package bench
