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
//
// # Store workload
//
// RunStore starts a master (in this process, or uses StoreConfig.MasterAddr)
// and Clients store clients (in this process, or as child processes), each
// contributing SegmentSize bytes, with Threads workers each. Client i
// places its values on the segments of clients i+1, i+2, ... (ReplicateConfig.
// Preferred), so every put and get moves bytes from one client to another.
// Workers call PutFrom/GetInto on buffers registered with RegisterBuffer
// (BatchPut/BatchGet with Batch > 1; Put/Get on heap memory when Staged).
// Before a get or mixed run each client stores its read set; the key sets
// fill at most 70% of each segment (size classes counted), below the
// master's eviction watermark, so nothing is evicted. Put workers cycle
// through a ring of keys and remove the whole ring with one BatchRemove
// (outside the call's latency, inside the round's time) before reusing it.
// Operation meta measures the master alone: Clients gRPC connections with
// Threads workers store Objects objects with BatchPutStart+BatchPutEnd of
// Batch keys on a segment mounted for the run, unmounted at the end.
//
// RunStoreLocal ("store --dummy N") measures the store through dummy
// clients (store/local) in this process: an in-process master, a real
// client serving two local sockets (one with a shared hot cache of
// blocks of the value size, one without), a second client whose segment
// holds the "remote" replicas, and N dummies, one worker each, for
// Duration per phase: GetBuffer of keys hot in the shared cache (a view,
// no copy; baseline memcpy of the same size by N goroutines right after,
// ratio = hot / memcpy), GetInto a registered pool of a replica in the
// real client's segment and of one in the other client's, Ping (the IPC
// round trip), and PutFrom of a registered pool followed by Remove (so
// the pool never fills; the figures are per pair). HotOnly stops after
// the hot phase.
//
// The Redis baseline (Baseline "redis") starts redis-server on a free
// loopback port (persistence off) and runs the same key sets, value size,
// operation mix and concurrency through go-redis: Clients clients of
// Threads connections, SET for put and GET for get (a pipeline of Batch
// commands when Batch > 1). Rounds of about a second alternate baseline
// and Crescent. Ops count keys; latency is per call; ratio is Crescent's
// throughput over Redis's.
//
// With StoreConfig.Oplog the in-process master is durable: local files
// (OplogDir, default a temporary directory in the working directory) or
// etcd (an embedded single-member etcd with its data on disk and fsync
// on, or an external one given as etcd://host:port). The default
// baseline is then "oplog_off": a second in-process master with the log
// off and its own Clients clients with the same plan, run in rounds
// alternating with the measured ones (meta: Objects objects to each, in
// rounds of Objects/rounds). The result adds the log's group commit
// (commits/s, entries per commit), its mean fdatasync and its bytes per
// put (local).
//
// Each client process runs with GOMAXPROCS = CPUs / Clients (at least 1)
// unless GOMAXPROCS is set in the environment: the processes share the
// host's cores.
//
// # RPC layers
//
// StoreConfig.MasterProtocol picks the clients' layer to the master:
// auto/crpc, grpc, grpc_tuned (the in-process master's gRPC server then
// takes internal/grpctune's options, as crescent-master --grpc_tuned
// does) or drpc (internal/drpcx, served by the in-process master on a
// port of its own, which is the clients' master address; not with
// MasterAddr). RunRPC (crescent-bench rpc) measures one cheap unary call
// (ExistKey of a missing key, no lease) to one in-process master over
// each layer: plain gRPC and crpc on the master's port, tuned gRPC and
// drpc on ports of their own, the same service and interceptor behind
// all. Each cell (layer x calls in flight) runs for Duration, split into
// Rounds in which the layers take turns (the order rotating), so drift
// on a noisy machine weighs on all alike; rows report calls/s, p50/p99
// and the ratio to plain gRPC at the same in-flight count.
//
// Client processes are driven by JSON lines: the parent writes one object
// per command on the child's stdin, the child answers each with one object
// on stdout, and exits when stdin closes:
//
//	{"cmd":"init","config":StoreConfig,"index":i,"master":"host:port"}
//	                                    -> {"segment":"host:port","proto":"crpc","buf_addr":address}
//	{"cmd":"prepare","plan":{"run_id","peers":[...],"peer_bufs":[...],"get_keys","ring"}}
//	                                    -> {}
//	{"cmd":"run","dur":nanoseconds}     -> {"stats":{"Ops","Gets","Puts","Bytes",
//	                                        "Elapsed","Hist":{"n","max_ns","buckets":[[i,count],...]}}}
//	{"cmd":"engine","dur":nanoseconds}  -> the same, for a round of the engine baseline
//
// buf_addr is where the client's registered buffers start (the engine
// baseline's targets; 0 when they are not registered) and peer_bufs lists
// every client's, in peer order.
//
// Any answer may instead be {"error":"text"}. Histogram buckets are the
// indices of Histogram's log-linear buckets.
package bench
