// Package supervisor runs a master's high-availability cycle: a hot
// standby following the operation log, an election, a promotion fenced
// by the leader's term, a warm-up, serving while the session lives, and
// back to standby.
//
// # Cycle
//
// Each round:
//  1. standby: Config.Replica builds a fresh master (not started, its
//     OpLog a forwarder that panics while following, since Replay never
//     logs) and an ha.Follower follows the log into it (Config.OpenLog
//     with term 0). A replica is never reused after it led or after its
//     follower failed: each round builds a new one.
//  2. Every TTL at most, or when the view changes, the log's term is read
//     afresh and Config.Coordinator builds the round's coordinator with it
//     (Redis: leader.WithMinTerm, so its terms stay above the log's). If
//     nobody leads, candidate: TryAcquire(Config.Advertise).
//  3. acquired (role still candidate, term set): the log is claimed,
//     Config.OpenLog with the session's term (oplog.EtcdOptions.Term),
//     which fences the old leader: its next append is oplog.ErrFenced and
//     it acknowledges nothing. Then Follower.Handover applies the rest;
//     the claimed store must end at the handed-over seq. A Sink with the
//     term numbers from there.
//  4. warmup: until Config.Warmup (default one TTL; crescent-master
//     --ha_warmup_ms, default 500 ms) has passed since the acquisition.
//     Any old leader has already stopped answering: it serves only
//     while its lease func (step 5) says yes, which ends at its
//     session's Deadline, never after its lease expired on the backend,
//     which came before our acquisition. The wait covers clocks running
//     at different rates and the old leader's stop; the log's term
//     fences its writes whatever happens. Skipped when the released
//     marker (Config.Released, ReleasedTerm) equals the log's term as
//     read just before the claim: the master that last claimed the log
//     wrote it after it stopped serving, so nobody else can be serving
//     (a SIGTERM hand-off then takes well under a TTL).
//  5. leader: the master is started and Config.Serve serves it with a
//     lease func (nil while the session lives and its Deadline is
//     ahead) that Serve checks before every answer (service.WithGate,
//     reads included); leader.Monitor cancels Serve's context when the
//     session ends (the reason is logged at error level), and so does a
//     failed log
//     (Durable.Failed, checked every TTL/4: fenced by a newer term, or
//     etcd unreachable past the write timeout), which acknowledges
//     nothing more: the master steps down so a standby can take over.
//  6. When Serve returns: the Durable (master, sink, store) is closed,
//     the released marker written with the term, then the session
//     released (the view is deleted if still ours, so a
//     standby takes over at once), then back to 1.
//
// Run's context ending (SIGTERM) stops at whatever step: leading, it
// stops serving, closes the log and releases, then Run returns nil. A
// failed round (backend unreachable, claim fenced by a higher term,
// follower fault) is logged and retried after Config.Retry.
//
// # Admin
//
// RoleHandler serves /role:
//
//	{"role":"leader|standby|candidate|warmup","term":N,"leader":"h:p","applied_seq":N}
//
// term is 0 in standby; leader is the last view seen; applied_seq is the
// replica's applied seq, or the sink's durable seq once promoted.
// LeaderHandler serves /leader: {"leader":"h:p","view_version":N} (the
// last view seen; "" and 0 when nobody leads). NotServing answers 503
// with the /role body.
//
// # Metrics
//
// Collector: crescent_ha_role{role} (1 for the current role, 0 for the
// others), crescent_ha_term, crescent_ha_elections_total (acquisitions),
// crescent_ha_time_to_serve_seconds (acquisition to serving, the last
// time), and the current follower's crescent_ha_follower_* metrics.
package supervisor
