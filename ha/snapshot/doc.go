// Package snapshot stores snapshots of a master's state: payload stores
// (bodies) and catalogs (which snapshots exist, which is the latest).
//
// # Ids, payload stores and catalogs
//
// A snapshot's id is IDFor(seq, term): the last included log seq and the
// term, each as 20 zero-padded decimal digits, joined by "-" (41 bytes).
// Ids sort as strings by seq, then term; "latest" is the highest id.
// Every store refuses any other string (ErrBadID), so an id is always a
// safe file name and Redis member.
//
// LocalPayloads keeps bodies in DIR/<id>.snap. Create writes
// DIR/.<id>.tmp; Commit fsyncs it, renames it to <id>.snap and fsyncs
// DIR, so a body is visible only whole and durable. Opening the store
// removes .<id>.tmp files left by a crash.
//
// A Meta record (LocalCatalog's DIR/<id>.meta, RedisCatalog's hash
// field) is one JSON object, "\n", the CRC32C (Castagnoli) of the JSON
// bytes as 8 lower-case hex digits, "\n"; at most 4096 bytes:
//
//	{"v":1,"id":"<id>","seq":N,"term":N,"created":"<RFC 3339, UTC>","size":N,"checksum":N}
//	1a2b3c4d
//
// Unknown JSON fields are ignored; v other than 1, a bad checksum, or an
// id that does not match seq, term and the file name or field is
// ErrCorrupt.
//
// LocalCatalog: DIR/<id>.meta per published snapshot, and DIR/LATEST
// holding the latest id and "\n". Each file is written as a dot-named
// .tmp, fsynced, renamed and the directory fsynced. Publish writes the
// meta, then moves LATEST when the id is higher. Delete of the latest
// moves LATEST to the next highest id (or removes it) before removing
// the meta. Opening removes stale .tmp files and, when a meta is above
// LATEST (a crash inside Publish), moves LATEST to it. DIR/.catalog.lock
// (flock) keeps a directory to one process; the payload store may share
// the directory.
//
// RedisCatalog, for a cluster id C and key prefix P: the sorted set
// P{C}:snapshots (member id, score seq), the string P{C}:latest (an id)
// and the hash P{C}:metas (id -> Meta record). The hash tag {C} puts
// them in one slot; Publish, Latest, List and Delete are each one Lua
// script, so latest never names an unpublished id and only moves forward
// except when Delete removes it. Sizes are checked in the script before
// a value is sent.
//
// Latest is ErrNoSnapshot only when nothing is published: a missing or
// corrupt meta or marker is ErrCorrupt and an unreachable Redis its own
// error. Prune keeps the newest N, deleting each catalog entry before its
// payload, so a crash leaves at most an orphan body (CleanOrphans).
package snapshot
