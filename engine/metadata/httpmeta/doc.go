// Package httpmeta is the reference's HTTP metadata protocol: a server
// (an in-memory key/value map, standalone or embedded in the store
// master) and the engine's client backend. Importing it registers the
// "http" and "https" schemes with engine/metadata; the engine does not
// import it, a program that wants them does (or engine/metadata/all).
//
// # Protocol
//
// The connection string is the URL the keys are appended to, usually
// "http://host:port/metadata"; a request targets <url>?key=<key> with the
// key query-escaped.
//
//	GET    ?key=K         200 + value (Content-Type application/json)
//	                      404 "metadata not found"
//	PUT    ?key=K  body   200 "metadata updated"
//	DELETE ?key=K         200 "metadata deleted", 404 "metadata not found"
//	missing or empty key  400 "Missing key parameter"
//	key > MaxKeyBytes     400; body > MaxValueBytes 413; store full 507
//	other methods         405
//
// Serve/NewServer also answer GET /health with "OK". The Store holds
// copies of values, is safe for concurrent use, and bounds key size,
// value size, key count and total bytes (StoreOptions); its Get, Put,
// Delete and Keys methods give an embedding process direct access.
//
// # Client keys and values
//
// The same names as the etcd and Redis backends:
//
//	<prefix>        = "mooncake/" + (cluster id + "/" if set)
//	<prefix>ram/<segment>       descriptor JSON, or <prefix><segment> when the name holds '/'
//	<prefix>rpc_meta/<segment>  {"ip_or_host_name":"<host>","rpc_port":<port>}
//
// PUT bodies are compact JSON without a trailing newline (the reference's
// HTTP plugin writes them so). Publish PUTs rpc_meta (once per segment,
// when Options.RPCAddr is set) and then the descriptor; the reference's
// store master refuses to overwrite an rpc_meta key with 400, which the
// client accepts when the stored address is its own. Remove DELETEs both
// keys (404 counts as done); Close removes what the backend published.
// Open checks within Options.Timeout that the server answers (a GET
// gets 200 or 404): metadata.ErrUnavailable if it does not,
// metadata.ErrBadConnString for a malformed URL.
//
// # No TTL, no watch
//
// Plain HTTP has no leases and no change notification: an entry stays
// until it is deleted, so the descriptor of an engine that crashed stays
// until its name is published again or removed (an embedding master may
// clean up entries of clients it knows are dead). The backend does not
// implement metadata.Watcher; engines that need to notice changes set
// engine.Config.SegmentRefresh to poll.
package httpmeta
