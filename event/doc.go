// Package event produces and consumes KV cache events: which blocks of
// KV cache became available or went away, and where. It speaks vLLM's
// event stream byte for byte (vllm/distributed/kv_events.py), so vLLM
// consumers (llm-d's indexer, Dynamo, SGLang routers) can follow a
// Crescent publisher, and a Crescent Subscriber can follow vLLM engines
// and Mooncake masters.
//
// # Contract
//
// A Publisher takes events from any number of goroutines (Publish) into a
// bounded queue. One sender goroutine pops up to MaxBatchEvents events at
// a time (waiting FlushInterval for more when set), encodes them as one
// EventBatch, gives it the next sequence number, keeps it in a replay
// ring of ReplayBuffer batches and queues it for every subscriber. The
// order of events is preserved across batches. Producers never wait for
// the network: with Overflow Block a full queue makes Publish wait for
// room; with DropOldest it never waits and the oldest queued events are
// dropped. BlockUpdate events are never put in a batch with other kinds,
// so a consumer that fails a whole batch on an unknown tag (llm-d, vLLM's
// msgspec decoder) loses only the BlockUpdate events it cannot use.
//
// Sequence numbers count batches from 0, one per batch. When DropOldest
// drops events, the next batch sent skips exactly one sequence number
// (the number the dropped events' batch would have had): that number is
// never sent and never in the replay ring, so subscribers see a gap that
// replay cannot fill, and know they lost events. Stats.DroppedEvents
// counts the events, Stats.SkippedSeqs the skipped numbers.
//
// Each subscriber has its own queue of SendHWM batches: a subscriber that
// reads too slowly misses batches (a gap it can replay) without slowing
// the others, unless NoDrop makes the sender wait for it. Close drains the
// queue, writes out what subscribers have queued and closes the sockets,
// bounded by its context.
//
// A Subscriber connects to one or more publishers, delivers decoded
// batches in sequence order per publisher, fills gaps from the replay
// socket and reports what it cannot fill (Gap) and publisher restarts
// (Restart). With Source.StartSeq it first catches up from the replay
// ring; it also catches up after every reconnect, and asks the replay
// socket again (100ms, doubling to 5s) until the first live batch shows
// that the PUB has registered its subscription (ZeroMQ's slow joiner:
// batches sent before that reach it only through replay). A publisher restart
// is recognised when the sequence goes backwards; one that restarts and
// publishes past the old sequence while the subscriber is disconnected is
// indistinguishable from a live stream (vLLM's protocol has no epoch).
//
// Everything read from the network is bounded before it is allocated. A
// Publisher accepts from subscribers only subscribe/cancel messages with
// topics of at most MaxTopicSize bytes (default 256), at most
// MaxSubscriptions (default 1024) each, and from replay clients requests
// of at most 64 bytes in 4 frames; anything else ends that connection.
// Its bound sockets accept through internal/netx: transient accept errors
// (EMFILE, ...) back off instead of ending the listener, and MaxConns
// (default 4096) / MaxConnsPerHost cap connections, closing the peer idle
// longest (never subscribed, or between replay requests) to make room. A
// Subscriber (and Replay) refuses a message of more than MaxMessageSize
// bytes (default 64 MiB) or MaxFrames frames (default 16) as soon as its
// header shows it, reports an error wrapping ErrMalformed through OnError
// and reconnects.
//
// # Sockets
//
// The PUB socket binds or connects by vLLM's rule (PublisherConfig.Mode
// ModeAuto): it binds when the endpoint contains "*" or "::" or starts
// with ipc://, and connects otherwise (to a SUB that binds, as llm-d's
// indexer does). ModeBind and ModeConnect override the rule. The replay
// socket is a ROUTER and always binds. Endpoints are tcp://host:port
// (port 0 picks a free port; Publisher.Endpoint reports it) and
// ipc://path. inproc:// is not supported. The ZMTP 3.0 handshake (NULL
// security) is github.com/go-zeromq/zmq4's; see internal/zmtp for why the
// socket logic above it is ours.
//
// # Wire format
//
// Live message, 3 frames:
//
//	[ topic | seq: 8 bytes, big-endian uint64 | payload: msgpack EventBatch ]
//
// Replay, on the ROUTER socket. The client (DEALER or REQ) sends
//
//	[ "" | start: 8 bytes, big-endian uint64 ]
//
// (the ROUTER sees [identity, "", start]; a request without the empty
// delimiter is accepted and answered without it). The reply is one
// message per buffered batch with seq >= start, oldest first,
//
//	[ "" | topic | seq | payload ]
//
// then the end marker
//
//	[ "" | "" | 0xFFFFFFFFFFFFFFFF | "" ]
//
// exactly as vLLM >= 0.26 sends them (older vLLM omits the topic frame;
// Replay and the Subscriber accept both). A request whose start is not 8
// bytes gets the end marker alone.
//
// Payload, the msgpack of msgspec's encoding of vLLM's structs. The batch
// (array_like, so always three elements):
//
//	[ ts: float64 seconds | events: array | data_parallel_rank: int or nil ]
//
// Integers are written in the smallest format, unsigned formats for
// values >= 0 (0xcc-0xcf, positive fixint) and signed ones only for
// negative values; floats as float64 (0xcb); strings as fixstr/str8/16/32;
// hashes given as bytes as bin8/16/32; an empty string or nil pointer is
// nil (None). Events, with EncodingMap (vLLM >= 0.26: tag=True,
// omit_defaults=True), are maps whose first key is "type"; fields without
// a default are always written, defaulted ones (marked "= None") only
// when set:
//
//	{"type": "BlockStored", "block_hashes": [hash...], "parent_block_hash": hash|nil,
//	 "token_ids": [uint...], "block_size": int, "lora_id": int|nil, "medium": str|nil,
//	 "lora_name": str|nil, "extra_keys" = None: [[value...]|nil...],
//	 "group_idx" = None: int, "kv_cache_spec_kind" = None: str,
//	 "kv_cache_spec_sliding_window" = None: int}
//	{"type": "BlockRemoved", "block_hashes": [hash...], "medium": str|nil, "group_idx" = None: int}
//	{"type": "AllBlocksCleared"}
//	{"type": "BlockUpdate", "block_hashes": [hash...], "medium": str|nil,
//	 "object_key" = None: str, "replicas" = None: [[medium, endpoint]...], "group_idx" = None: int}
//
// With EncodingArray (older vLLM: array_like=True, which writes every
// field, defaults included) the same fields in the same order follow the
// tag in one array:
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//	 medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
//	["BlockRemoved", block_hashes, medium, group_idx]
//	["AllBlocksCleared"]
//	["BlockUpdate", block_hashes, medium, object_key, replicas, group_idx]
//
// BlockUpdate is Crescent's: a vLLM consumer does not know its tag.
// testdata/golden holds the exact bytes of every event in both encodings,
// checked against python3-msgpack packing the same layouts.
//
// DecodeBatch reads all of the above leniently, plus vLLM batches of two
// elements (before data_parallel_rank), shorter event arrays from older
// vLLM, a map-shaped batch, signed integer hashes, and Mooncake's RFC
// #1527 events: maps keyed by "event_type" (stored, removed, cleared) with
// seq_hashes or block_hashes, parent_hash, token_ids, block_size, medium,
// lora_name and an envelope (event_id, timestamp, model_name, tenant_id,
// backend_id, additional_salt, group_id, object_key, dp_rank) kept in
// RFCInfo; an integer batch timestamp is taken as Mooncake's milliseconds.
// Events with unknown tags are skipped and counted in EventBatch.Skipped.
// A container's announced count is at most the bytes left (one byte an
// element); arrays sized by a count are charged against a budget of 8
// times the batch's size or 64 MiB, whichever is larger, before they are
// made (past it the batch is ErrMalformed), and event slabs grow 256
// events at a time as events are decoded.
package event
