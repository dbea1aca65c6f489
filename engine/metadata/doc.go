// Package metadata finds segment descriptors: the P2P handshake server
// and client, the descriptor schema, and the Backend interface that etcd,
// Redis and HTTP stores implement.
//
// # Handshake wire format (reference-compatible)
//
// One exchange per TCP connection: the client sends one frame, the server
// answers with one frame of the same type, half-closes, and waits for the
// client to close. A frame is
//
//	u64 length, little-endian   = 1 + len(body)
//	u8  type                     0 Connection, 1 Metadata, 2 Notify, 3 Probe
//	body                         JSON (compact, newline-terminated)
//
// A frame whose first byte after the length is above 3 is the reference's
// untyped old protocol: the whole payload is a Connection request and the
// reply carries no type byte. Request frames are bounded by MaxFrame
// (1 MiB by default); a zero, oversize or truncated frame, invalid JSON or
// an unknown type gets {"status":"error","reply_msg":"..."} and the
// connection closes.
//
// The server is bounded so that a slow or hostile client cannot block
// it: a connection that sends nothing within FirstByteTimeout (1 s) is
// closed without a reply; each exchange is bounded by Timeout (5 s); live
// connections are capped per listener (MaxConns, 1024) and per remote IP
// (MaxConnsPerHost, 256). At a cap the connection idle longest (nothing
// sent yet, or its reply already sent) is closed first, so idle sockets
// never make a peer with a request wait; only when every connection is
// mid-exchange do new peers wait in the accept queue (global cap) or get
// closed (per-host cap). Accept errors such as EMFILE back off and
// retry (internal/netx). The client reports ErrUnreachable when it cannot
// connect and ErrNoReply when the server took the connection but sent no
// reply (timed out, or closed at its limits).
//
// With ServerConfig.Token set, every connection first runs the
// internal/auth challenge (PurposeHandshake: the client's 38-byte hello
// where the frame's length would be) and only then carries the frame
// above; a peer that fails, including any reference peer, is closed
// without a reply. Client{Token} is the dialling side. ServerConfig.Allow
// admits peers by address (the protected default).
//
// Bodies:
//
//   - Metadata: request = the caller's own descriptor (ignored); reply = the
//     server's descriptor, or null when it has none yet.
//   - Notify: {"name": sender segment, "notify_msg": text}; reply
//     {"name":"","notify_msg":"success"}.
//   - Probe: {} ; reply {"status":"success"}.
//   - Connection: transport-specific endpoint exchange (RDMA/EFA); an error
//     reply has a non-empty "reply_msg".
//
// # Segment descriptor
//
// The reference's JSON: name, protocol ("tcp" for Crescent segments, so
// reference peers decode the buffers), tcp_data_port, tcp_proto_version
// (2), tcp_data_host, timestamp ("YYYY-MM-DD HH:MM:SS.ffffff", local time),
// buffers [{name (location), addr u64, length u64, rkey/lkey for RDMA}],
// devices and priority_matrix for RDMA/EFA, cxl_name/cxl_base_addr for CXL.
// Crescent adds "crescent": {version, host_id, protocols, shm_socket,
// shm_buffers}, which reference decoders ignore. Numbers are JSON numbers,
// never strings. A buffer with an empty name, zero address (except CXL) or
// zero length makes the whole descriptor invalid, as in the reference.
//
// # Validation
//
// A descriptor comes from the network, so every one that enters (the
// handshake client, the etcd, Redis and HTTP backends, their watches:
// all decode with UnmarshalDesc; the engine checks again whatever a
// registered backend returns) passes SegmentDesc.Validate before any
// transport sees it. Validate refuses, with a *DescError naming the
// field ("crescent.efa.first_device", "buffers[3].rkey"): names and
// counts past the Max* bounds; tcp_data_port outside 0..65535 and a
// tcp_data_host that is not a host name or address; devices without a
// name or with '@'; a crescent.rdma or crescent.efa range
// [first_device, +devices) outside devices (checked without overflow),
// GIDs in it that are not rdma GIDs (hex, ':' and '.') or hex efa
// addresses, repeated device names in it; more rkeys than devices or
// lkeys that do not pair with them; buffers that wrap, overlap, or whose
// CXL offset+length wraps; an shm_socket longer than a Unix socket path
// or holding NUL. Transports keep their own overflow-safe checks.
// Before decoding, UnmarshalDesc bounds what decoding would build (a
// "{}" of three bytes becomes a struct of a hundred): at most
// MaxDescBytes (64 MiB) of JSON, 1024 top-level members, MaxBuffers
// objects or arrays in one member's value, MaxDevices in anything
// deeper, 16 levels of nesting (ErrBadDescriptor otherwise). The Redis
// backend reads at most MaxDescBytes+1 bytes of a value; the etcd
// backend refuses a response over MaxDescBytes+1 MiB from its length.
//
// # Backends and store keys
//
// Open picks a Backend by connection string: "" or P2PHANDSHAKE (built
// in), or a scheme registered by a backend package (etcdmeta: etcd:// and
// bare host:port; redismeta: redis://, rediss://; httpmeta: http://,
// https://). Backends are opt-in, as database/sql drivers are: a backend
// package calls Register from its init function, so a program enables a
// scheme by importing the package (engine/metadata/all imports every
// one; this package and the engine import none, so they link neither
// etcd's client, go-redis nor gRPC). Open refuses a scheme nobody
// registered with a *SchemeError (matching ErrUnknownServer) that names
// the package to import; Schemes lists the registered ones. Store
// backends share the reference's key names (Keys):
//
//	"mooncake/" [cluster id "/"] "ram/" <segment>   descriptor
//	"mooncake/" [cluster id "/"] <segment>          descriptor, when the name holds '/'
//	"mooncake/" [cluster id "/"] "rpc_meta/" <segment>
//	                     {"ip_or_host_name":"<host>","rpc_port":<port>} (RPCMeta)
//
// The cluster id is Options.ClusterID, else $MC_METADATA_CLUSTER_ID. A
// backend that can report changes implements Watcher; descriptors from a
// store whose name is not host:port get tcp_data_host from rpc_meta
// (FillDataHost), as the reference's newest engine does.
package metadata
