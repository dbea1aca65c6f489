package storepb

// MaxBatchItems bounds the items of one batch RPC (keys of a Batch* call,
// items of a CommitPut). The master refuses a larger batch with
// INVALID_PARAMS before it sizes anything by the count: what it allocates
// per item is many times the item's bytes on the wire. Clients send
// larger batches in pieces of at most this many items.
const MaxBatchItems = 10000
