// Package ha is the read side of the operation log (ha/oplog): it keeps a
// master.Master replica current from the log a leader writes, so that a
// standby can take over at once. It owns no wire or disk format; it reads
// the log through oplog.Store and applies entries with oplog.DecodeOp and
// master.Replay.
//
// # Notifier
//
// A Notifier says that the log may have grown (Changed, a channel with a
// buffer of one: signals merge). NewNotifier picks one by store:
//   - *oplog.Etcd: a watch on the log's durable_prefix key, which every
//     append rewrites, with clientv3.WithRequireLeader (a member cut off
//     from its cluster ends the watch instead of going silent). After an
//     error, a compaction of the watched revision or the stream closing,
//     the watch is re-established with backoff (NotifyOptions.RetryMin,
//     RetryMax: 50ms..5s) from the present, after a read of the key, and
//     the notifier fires, since what was missed is in the store. Each
//     watch runs under its own context, cancelled before the next one
//     starts, so a re-armed watch leaves no goroutine behind.
//   - *oplog.Local (a follower in the leader's process: a data directory
//     has one user): the store's Notify channel, closed by its writer when
//     a group commit is published. No polling.
//   - any other Store: LastSeq polled every NotifyOptions.PollInterval
//     (default 10ms).
//
// # Applier
//
// An Applier applies entries to a master strictly in seq order. Each
// entry is verified (checksum, limits); the one at Applied()+1 is decoded
// and replayed, then any buffered ones that follow; one further ahead is
// buffered (at most ApplierOptions.MaxPending entries and MaxPendingBytes,
// default 4096 and 64 MiB); one at or below Applied() is skipped when its
// checksum is the one applied for that seq (seqs older than the last
// Window, default 4096, or below the applier's start are skipped
// unchecked). Complete(last) tells it that every entry up to last was
// handed over (a read returns a contiguous run), so a seq still missing
// is a gap.
//
// It fails closed: the first fault stops it for good (nothing more is
// applied, the buffer is dropped, every later call returns the same
// error), an *ApplyError with the seq at fault and one reason:
// ErrGap (a missing seq: Complete, or a full buffer), ErrRegression (a
// seq seen again with other bytes, applied or buffered), ErrChecksum
// (an entry failing its checksum, or a read the store found corrupt;
// also matches oplog.ErrCorrupt), ErrTermRegressed (a lower term after a
// higher one), ErrDiverged (an op that does not decode, oplog.ErrBadOp, or
// that Replay refuses, master.ErrReplayDiverged; Replay leaves a refused
// op unapplied). The replica then holds the state up to Applied() and
// must be rebuilt (from a snapshot) to follow again.
//
// # Follower
//
// NewFollower(store, m, applied, opts) follows the log from applied+1 into
// m, a replica the caller built (from a snapshot at seq applied, or empty
// at 0); m must not be started (expiries and releases come from the log)
// and the follower is its only writer. One goroutine reads the store's
// LastSeq and then up to FollowerOptions.Batch entries (default 1024)
// after Applied(), applies them, and reads again while the store holds
// more; otherwise it waits for the notifier or the safety timer
// (FollowerOptions.Safety, default 1s). A read shorter than LastSeq said
// is a gap. A failed read (etcd unavailable) is counted and retried at
// the next wake-up; a compacted one (oplog.ErrCompacted) stops the
// follower with ErrResync (rebuild from a snapshot), a corrupt one with
// ErrChecksum, an applier fault with its *ApplyError. Entries a failed
// read returned before its error are applied first. Handover retries
// failed reads with backoff within its ctx.
//
// Applied is the last seq applied; Lag the store's last seq as last read
// minus Applied; Err why it stopped (nil while it follows); WaitApplied
// waits for a seq. Pause returns once nothing is being applied and
// nothing will be until Resume (a snapshot can export the quiescent
// replica). Handover reads the store's LastSeq, applies up to it, stops
// following (Err is then ErrHandedOver) and returns the master and that
// seq: the caller promotes it, starting its sink after that seq. Close
// stops the follower and waits for its goroutines; the store and the
// master stay the caller's.
//
// Metrics (Collector or Register): crescent_ha_follower_applied_seq,
// _log_last_seq, _lag_entries and _pending_entries (gauges),
// _applied_entries_total, _apply_errors_total (the failure that stopped
// it), _read_errors_total (retried) and _watch_rearms_total (counters).
package ha
