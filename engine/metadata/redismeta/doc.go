// Package redismeta stores segment descriptors in Redis, as the
// reference engine's Redis metadata plugin does, with expiring keys so
// that a dead owner's entries disappear by themselves. Importing it
// registers the "redis" and "rediss" (TLS) schemes with engine/metadata;
// the engine does not import it, a program that wants Redis does (or
// engine/metadata/all).
//
// # Connection string
//
//	redis://[user:password@]host[:port][/db]     port 6379, db 0 by default
//	rediss://...                                  the same over TLS
//
// Credentials and db absent from the string come from MC_REDIS_USERNAME,
// MC_REDIS_PASSWORD and MC_REDIS_DB_INDEX (0-255), which the reference
// reads. Open fails with metadata.ErrBadConnString for a malformed
// string (never echoing the password) and with metadata.ErrUnavailable
// when the server does not answer PING within Options.Timeout. Every
// operation is bounded by Options.Timeout.
//
// # Keys and values (exactly the reference's)
//
//	<prefix>        = "mooncake/" + (cluster id + "/" if set)
//	                  cluster id: Options.ClusterID, else $MC_METADATA_CLUSTER_ID
//	<prefix>ram/<segment>       segment descriptor JSON (metadata.SegmentDesc),
//	                            or <prefix><segment> when the name holds '/'
//	<prefix>rpc_meta/<segment>  {"ip_or_host_name":"<host>","rpc_port":<port>}
//
// Values are plain strings (SET), compact JSON ending in '\n'. Publish
// SETs the descriptor and, when Options.RPCAddr is set, the rpc_meta
// entry in one MULTI/EXEC.
//
// # Lifetime
//
// Both keys are SET with PX = Options.TTL. While the backend is open it
// extends them every TTL/3 (PEXPIRE); a key found missing then (Redis
// unreachable for longer than the TTL, or deleted by hand) is SET again.
// If the process dies the keys expire within one TTL. Remove DELs a
// segment's keys; Close DELs everything it still owns.
//
// # Watch
//
// Backend implements metadata.Watcher. When the server's
// notify-keyspace-events includes K and either A or all of $, g and x
// (NotifyFlags = "K$gx"), a watch subscribes to
// "__keyspace@<db>__:<key>" on one pub/sub connection shared by the
// backend's watches, and reads the key after every event except
// expire/persist (the owner's TTL refresh). Each (re)subscription
// confirmation also triggers a read, so events lost while the pub/sub
// connection was down are made up for; a connection silent for two
// health intervals (max(TTL/2, 1s)) is replaced. When notifications are
// off, or CONFIG GET is refused (common on managed Redis), the backend
// logs it once and watches poll the key every Options.PollInterval
// instead; `CONFIG SET notify-keyspace-events K$gx` enables the
// notification path.
package redismeta
