package master

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
)

// ErrInvalidConfig is returned by New for a Config field out of range.
var ErrInvalidConfig = errors.New("master: invalid configuration")

// Defaults (the reference's).
const (
	DefaultShards                = 1024
	DefaultLeaseTTL              = 10 * time.Second
	DefaultSoftPinTTL            = 30 * time.Minute
	DefaultMaxSoftPinTTL         = 24 * time.Hour
	DefaultEvictionHighWatermark = 0.90
	DefaultEvictionRatio         = 0.05
	DefaultClientTTL             = 10 * time.Second
	DefaultPutDiscardTimeout     = 30 * time.Second
	DefaultPutReleaseTimeout     = 600 * time.Second
	DefaultMaxKeyLen             = 4096
	DefaultMaxReplicas           = 16
	DefaultEvictInterval         = 10 * time.Millisecond
	DefaultLivenessInterval      = time.Second
	DefaultRegexBudget           = 5 * time.Second
	DefaultMaxSegments           = 16384
	DefaultMaxSegmentsPerClient  = 1024
)

// Config configures a Master. Zero fields take the defaults above, except
// the booleans: AllowEvictSoftPinned is inverted as KeepSoftPinned so the
// zero value keeps the reference's default (soft-pinned objects may be
// evicted in the second pass).
type Config struct {
	// Shards splits the key space for locking (default 1024; 1 to 65536).
	Shards int
	// LeaseTTL is the read lease GetReplicaList grants: the object is
	// not removed or evicted before it ends (default 10s; at least 1ms).
	LeaseTTL time.Duration
	// SoftPinTTL is how long a soft pin protects an object from the
	// first eviction pass (default 30m); MaxSoftPinTTL caps it
	// (default 24h).
	SoftPinTTL    time.Duration
	MaxSoftPinTTL time.Duration
	// KeepSoftPinned: true never evicts soft-pinned objects
	// (allow_evict_soft_pinned_objects=false); false (default) lets the
	// second eviction pass take them.
	KeepSoftPinned bool
	// EvictionHighWatermark is the usage fraction above which eviction
	// runs (default 0.90; in (0, 1]); each round frees EvictionRatio of
	// the capacity (default 0.05; in (0, 1]).
	EvictionHighWatermark float64
	EvictionRatio         float64
	// ClientTTL: a client that has not pinged for this long is dropped
	// with its segments (default 10s).
	ClientTTL time.Duration
	// PutDiscardTimeout: an unfinished PutStart older than this may be taken
	// over by a new PutStart of the same key (default 30s).
	PutDiscardTimeout time.Duration
	// PutReleaseTimeout: an unfinished PutStart's space is freed this long
	// after it started, whether or not it was taken over (default 600s;
	// not below PutDiscardTimeout).
	PutReleaseTimeout time.Duration
	// Strategy places replicas (default alloc.Random).
	Strategy alloc.Strategy
	// MaxKeyLen bounds a key's bytes (default 4096); MaxReplicas the
	// replicas of one object (default 16; at most 255).
	MaxKeyLen   int
	MaxReplicas int
	// MaxSegments bounds the segments mounted in all (default 16384) and
	// MaxSegmentsPerClient those of one client (default 1024): a mount
	// past either is NO_AVAILABLE_HANDLE. Every mount copies the segment
	// table, so the bound keeps a mount's cost bounded too. A log or
	// snapshot replayed is not held to them.
	MaxSegments          int
	MaxSegmentsPerClient int
	// EvictInterval and LivenessInterval pace the background loops of
	// Start (defaults 10ms and 1s); decisions inside them use Clock.
	EvictInterval    time.Duration
	LivenessInterval time.Duration
	// RegexBudget bounds the time one RemoveByRegex may take (on Clock;
	// default 5s); past it the removal stops with RPC_TIMEOUT and what
	// it removed.
	RegexBudget time.Duration
	// InvalidationTTL is how long a hot-cache subscriber may serve cached
	// values after the poll of its last answer, and so the longest a
	// remove waits for a subscriber that stopped answering (default 1 s);
	// MaxSubscribers bounds the subscriptions (default 1024).
	InvalidationTTL time.Duration
	MaxSubscribers  int
	// ViewVersion is what Ping reports; 0 (default) picks a random epoch.
	ViewVersion uint64
	Clock       clock.Clock // nil (default): clock.Real{}
	OpLog       OpSink      // nil (default): none
	Events      EventSink   // nil (default): none
	// Logger gets mounts, unmounts, client expiries and eviction rounds
	// at info, finished puts at debug; nil = slog.Default(), so the
	// application's slog setup applies.
	Logger *slog.Logger
	// Seed makes placement reproducible (alloc.WithRand); 0 (default) = random.
	Seed uint64
}

func (c *Config) fill() error {
	c.Shards = cmp.Or(c.Shards, DefaultShards)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.SoftPinTTL = cmp.Or(c.SoftPinTTL, DefaultSoftPinTTL)
	c.MaxSoftPinTTL = cmp.Or(c.MaxSoftPinTTL, DefaultMaxSoftPinTTL)
	c.ClientTTL = cmp.Or(c.ClientTTL, DefaultClientTTL)
	c.PutDiscardTimeout = cmp.Or(c.PutDiscardTimeout, DefaultPutDiscardTimeout)
	c.PutReleaseTimeout = cmp.Or(c.PutReleaseTimeout, DefaultPutReleaseTimeout)
	c.EvictInterval = cmp.Or(c.EvictInterval, DefaultEvictInterval)
	c.LivenessInterval = cmp.Or(c.LivenessInterval, DefaultLivenessInterval)
	c.RegexBudget = cmp.Or(c.RegexBudget, DefaultRegexBudget)
	c.InvalidationTTL = cmp.Or(c.InvalidationTTL, DefaultInvalidationTTL)
	c.MaxSubscribers = cmp.Or(c.MaxSubscribers, DefaultMaxSubscribers)
	c.EvictionHighWatermark = cmp.Or(c.EvictionHighWatermark, DefaultEvictionHighWatermark)
	c.EvictionRatio = cmp.Or(c.EvictionRatio, DefaultEvictionRatio)
	c.MaxKeyLen = cmp.Or(c.MaxKeyLen, DefaultMaxKeyLen)
	c.MaxSegments = cmp.Or(c.MaxSegments, DefaultMaxSegments)
	c.MaxSegmentsPerClient = cmp.Or(c.MaxSegmentsPerClient, DefaultMaxSegmentsPerClient)
	c.MaxReplicas = cmp.Or(c.MaxReplicas, DefaultMaxReplicas)
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default() // the application's slog setup
	}
	bad := func(f string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(f, args...))
	}
	switch {
	case c.Shards < 1 || c.Shards > 1<<16:
		return bad("Shards %d outside [1, 65536]", c.Shards)
	case c.LeaseTTL < time.Millisecond, c.SoftPinTTL < 0, c.MaxSoftPinTTL < 0, c.ClientTTL < 0,
		c.PutDiscardTimeout < 0, c.PutReleaseTimeout < 0, c.EvictInterval < 0, c.LivenessInterval < 0, c.RegexBudget < 0,
		c.InvalidationTTL < 3*time.Millisecond, c.MaxSubscribers < 0:
		return bad("durations must be positive (lease TTL at least 1ms)")
	case c.SoftPinTTL > c.MaxSoftPinTTL:
		return bad("SoftPinTTL %v above MaxSoftPinTTL %v", c.SoftPinTTL, c.MaxSoftPinTTL)
	case c.PutReleaseTimeout < c.PutDiscardTimeout:
		return bad("PutReleaseTimeout %v below PutDiscardTimeout %v", c.PutReleaseTimeout, c.PutDiscardTimeout)
	case !(c.EvictionHighWatermark > 0 && c.EvictionHighWatermark <= 1):
		return bad("EvictionHighWatermark %v outside (0, 1]", c.EvictionHighWatermark)
	case !(c.EvictionRatio > 0 && c.EvictionRatio <= 1):
		return bad("EvictionRatio %v outside (0, 1]", c.EvictionRatio)
	case c.MaxKeyLen < 1:
		return bad("MaxKeyLen %d", c.MaxKeyLen)
	case c.MaxSegments < 1 || c.MaxSegmentsPerClient < 1:
		return bad("MaxSegments %d, MaxSegmentsPerClient %d", c.MaxSegments, c.MaxSegmentsPerClient)
	case c.MaxReplicas < 1 || c.MaxReplicas > 255:
		return bad("MaxReplicas %d outside [1, 255]", c.MaxReplicas)
	case c.Strategy < alloc.Random || c.Strategy > alloc.LocalFirst:
		return bad("unknown strategy %d", int(c.Strategy))
	}
	return nil
}
