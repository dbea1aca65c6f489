// Package etcdmeta stores segment descriptors in etcd, as the reference
// engine's etcd metadata plugin does, plus leases so that a dead owner's
// entries disappear by themselves. Importing it registers the "etcd"
// scheme with engine/metadata; the engine does not import it, a program
// that wants etcd does (import _ ".../engine/metadata/etcdmeta", or
// engine/metadata/all for every backend).
//
// # Connection string
//
//	etcd://host:port[,host2:port2...]     (';' also separates)
//	host:port[,host2:port2...]            a string without "scheme://" is etcd
//
// Open fails with metadata.ErrBadConnString for a malformed string and
// with metadata.ErrUnavailable when no endpoint answers within
// Options.Timeout (the message says whether the port refused or was
// silent). Every operation is bounded by Options.Timeout. A response
// is at most metadata.MaxDescBytes + 1 MiB (checked from its length,
// before it is read): a larger value is refused with
// metadata.ErrBadDescriptor.
//
// # Keys and values (exactly the reference's)
//
//	<prefix>        = "mooncake/" + (cluster id + "/" if set)
//	                  cluster id: Options.ClusterID, else $MC_METADATA_CLUSTER_ID
//	<prefix>ram/<segment>       segment descriptor JSON (metadata.SegmentDesc),
//	                            or <prefix><segment> when the name holds '/'
//	<prefix>rpc_meta/<segment>  {"ip_or_host_name":"<host>","rpc_port":<port>}
//
// Values are compact JSON ending in '\n' (the reference's FastWriter
// output). Publish writes the descriptor and, when Options.RPCAddr is
// set, the rpc_meta entry in one transaction.
//
// # Lifetime
//
// Everything a Backend publishes is attached to one lease of
// Options.TTL (rounded up to whole seconds; etcd may raise very short
// TTLs to its minimum), kept alive by the client's KeepAlive stream.
// If the process dies, the lease expires and etcd deletes the entries
// within about one TTL. If the lease is lost while the process lives
// (etcd unreachable for longer than the TTL), the backend grants a new
// lease and writes its entries again. Remove deletes a segment's two
// keys; Close revokes the lease, deleting everything at once.
//
// # Watch
//
// Backend implements metadata.Watcher with an etcd watch on the segment
// key: it reads the key, reports it, and watches from the next revision,
// so no change is missed; a cancelled or compacted watch reads again. A
// delete (Remove, lease expiry) is reported as nil. Nothing is polled.
package etcdmeta
