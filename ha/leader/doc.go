// Package leader elects one master per cluster: the Coordinator
// interface and its etcd and Redis backends.
//
// # Contract
//
// A View is {Leader address, Version}; Version is the fencing term, and
// the zero View means nobody leads. Versions handed out by one backend
// strictly increase across acquisitions (Redis: see Fencing below).
//
//   - View(ctx) reads the current view.
//   - TryAcquire(ctx, addr) tries once: acquired gives a live Session and
//     its view; contended gives a nil Session and the observed view;
//     never both. An empty addr is ErrInvalid.
//   - WaitChange(ctx, after) returns the first view with Version != after
//     (at once if the current one already differs), or ctx's error.
//   - Session.Term is the version it holds. The lease is renewed in the
//     background; Session.Renew renews once now. When the session ends,
//     Lost is closed and Err says why: ErrLeadershipLost (the view is no
//     longer ours: lease revoked or expired, key deleted or taken),
//     ErrRenew wrapping the cause (the backend could not be reached for
//     a lease TTL), or ErrClosed (Release, or the coordinator's Close).
//     The first reason sticks. Release also deletes the view if it is
//     still ours, compared by term (etcd) or owner token (Redis).
//   - Session.Deadline is the latest time this process may act as
//     leader: the send time of the last renewal (or acquisition) the
//     backend confirmed plus the TTL it confirmed. The backend counts its
//     expiry from when it received that renewal, later, so it never
//     expires the lease before Deadline, and nobody can acquire the view
//     before then. A session nothing renews ends at Deadline (ErrRenew)
//     by its own clock, without waiting for the backend. A leader that
//     stops answering at Deadline (ha/supervisor's lease gate) has
//     stopped before any successor exists, so a successor needs to wait
//     only for clock-rate differences, not a whole TTL.
//   - Monitor(s, fn) calls fn(reason) exactly once, when s ends.
//   - Coordinator.Close ends its live sessions with ErrClosed without
//     deleting their views (they expire after the TTL) and refuses new
//     acquisitions; the client passed in stays the caller's to close.
//
// Options: WithPrefix (default "crescent"), WithTTL (default 5 s),
// WithPollInterval (Redis, default 200 ms), WithMinTerm (Redis only).
// A cluster id must be non-empty and free of '/', '{', '}', ':'.
//
// # etcd
//
// One key, `<prefix>/<cluster_id>/master_view`, whose value is the
// leader address (raw bytes), put with a lease of the TTL (whole
// seconds, rounded up; etcd may raise it to its minimum) in a
// transaction guarded by CreateRevision(key) == 0; the else branch reads
// the key, so a contended candidate sees the winner in the same
// transaction. Version = the key's CreateRevision (etcd's global
// revision: it never goes back, so WithMinTerm is rejected). The lease
// is renewed every granted TTL/3 by single keep-alives (KeepAliveOnce,
// bounded by the deadline; after a failed one, again 100 ms later), so
// each confirmed renewal's send time is known and extends Deadline. A
// lease found gone (not found, TTL <= 0) is ErrLeadershipLost; the
// deadline passing with no renewal confirmed is ErrRenew (etcd extends
// leases across its own leader changes, so a live lease with an
// unreachable etcd still ends here: the process cannot know). The session also
// watches the key: a delete or a new create revision is
// ErrLeadershipLost. The watch is opened off the session's loop (opening
// one waits for its stream, which a partition holds indefinitely), so
// nothing the network does keeps the session past its deadline. Release deletes the key only if its CreateRevision
// is still the term, then revokes the lease. WaitChange and the session
// watch with clientv3.WithRequireLeader, so a member cut off from its
// cluster breaks the watch instead of holding it silently; after a
// break the key is read again (each watch's context is cancelled on
// return, so no watch stream or goroutine is left behind). Build the
// client from EtcdClientConfig: it sets dial keep-alives (2 s + 2 s) so
// a hung etcd member is noticed and the client moves to another, and
// bounds a response at 1 MiB (the etcd client's own default is 2 GiB).
//
// # Bounds on what the backend holds
//
// A leader address is at most MaxAddrLen (4096) bytes. TryAcquire
// refuses a longer one (ErrInvalid); a view read back (View, WaitChange,
// a contended TryAcquire) with a longer address, or on Redis a
// view_version that is no number, is ErrBadView, and WaitChange keeps
// waiting for a good one. On Redis the view is read by a Lua script that
// cuts leader_address at MaxAddrLen+1 bytes and view_version at 32, so
// an oversized field written by anyone with access to the server is
// refused without being sent.
//
// # Redis
//
// Leadership only: Redis replication is asynchronous, so the log stays
// on etcd or local files. Two keys in one hash-tag slot:
//
//	{<prefix>:<cluster_id>}:master_view  hash
//	    leader_address  the address
//	    view_version    the term, decimal ASCII
//	    owner_token     32 lowercase hex digits (16 random bytes), one per session
//	{<prefix>:<cluster_id>}:term         string, decimal: the last term handed out
//
// Acquire is one Lua script: if the hash exists (Redis removes it when
// its TTL passes) it returns the current leader_address and
// view_version; otherwise it INCRs the term (raised to min term + 1 when
// WithMinTerm is larger), HSETs the three fields and PEXPIREs the hash
// for the TTL. Renew (Lua) compares owner_token and PEXPIREs; release
// (Lua) compares owner_token and DELs. Renewals run every max(TTL/3,
// 200 ms), so the TTL must be at least 600 ms. A renewal that finds
// another token (or no hash) ends the session with ErrLeadershipLost;
// each success extends Deadline to its send time plus the TTL, and a
// timer ends the session with ErrRenew at Deadline. Renewals run beside
// that timer, one at a time, so a call that hangs (a partition: go-redis
// bounds a blocked read by its ReadTimeout, not by the context, unless
// ContextTimeoutEnabled is set) cannot hold the session past Deadline;
// an answer that comes after the end extends nothing. Release and Close
// wait for a renewal in flight, which only ContextTimeoutEnabled lets
// them cut short: set it (crescent-master does). Terms are below 2^53 (Lua numbers are doubles).
// WaitChange polls the hash every poll interval: keyspace notifications
// are off by default on redis-server.
//
// # Fencing on Redis
//
// The term counter is only as durable as Redis: without persistence
// (AOF with fsync) a restart loses it and INCR starts again from 1, so
// a new leader could get a term an old one already used. Either run
// Redis with persistence or seed the counter with WithMinTerm from the
// last term found in the operation log, as the supervisor does.
package leader
