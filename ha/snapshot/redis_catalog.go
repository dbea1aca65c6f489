package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// maxListed bounds how many snapshots List returns from Redis (a
// catalog under retention holds a handful).
const maxListed = 4096

// RedisCatalog keeps the catalog in Redis, for masters that share no
// disk (doc.go, "Catalogs"). Its three keys carry the hash tag
// {<cluster>}, so they live in one slot and every change is one Lua
// script: Latest never names an unpublished id and only moves forward.
type RedisCatalog struct {
	cli    redis.UniversalClient
	keys   []string // snapshots (sorted set), latest (string), metas (hash)
	badCfg error
	closed atomic.Bool
}

var _ Catalog = (*RedisCatalog)(nil)

// NewRedisCatalog returns the catalog of cluster clusterID under the key
// prefix prefix (for example "crescent:"). A prefix or cluster id with
// braces, or an empty cluster id, would break the shared hash slot: every
// call then returns that error. Close does not close cli (the caller's).
// A connection string is parsed by redismeta.ParseConn.
func NewRedisCatalog(cli redis.UniversalClient, prefix, clusterID string) *RedisCatalog {
	base := prefix + "{" + clusterID + "}:"
	c := &RedisCatalog{cli: cli, keys: []string{base + "snapshots", base + "latest", base + "metas"}}
	switch {
	case cli == nil:
		c.badCfg = errors.New("snapshot: redis catalog without a client")
	case clusterID == "":
		c.badCfg = errors.New("snapshot: redis catalog: empty cluster id")
	case strings.ContainsAny(prefix+clusterID, "{}"):
		c.badCfg = fmt.Errorf("snapshot: redis catalog: prefix %q and cluster id %q must not contain braces", prefix, clusterID)
	}
	return c
}

// Keys are the sorted set, latest and meta hash keys, for operators and
// tests.
func (c *RedisCatalog) Keys() (snapshots, latest, metas string) {
	return c.keys[0], c.keys[1], c.keys[2]
}

// KEYS: snapshots latest metas; ARGV: id, seq, meta.
var publishScript = redis.NewScript(`
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then
  if old ~= ARGV[3] then return redis.error_reply('EXISTS published with another meta') end
else
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local cur = redis.call('GET', KEYS[2])
if (not cur) or ARGV[1] > cur then redis.call('SET', KEYS[2], ARGV[1]) end
return 'OK'
`)

// KEYS: snapshots latest metas; ARGV: max meta size, id length. Returns
// the meta string, nil when nothing is published, or an error reply. An
// id or meta longer than any Publish writes is refused, not sent.
var latestScript = redis.NewScript(`
local id = redis.call('GET', KEYS[2])
if not id then
  local n = redis.call('ZCARD', KEYS[1])
  if n > 0 then return redis.error_reply('CORRUPT no latest key but ' .. n .. ' snapshots') end
  return false
end
if #id ~= tonumber(ARGV[2]) then return redis.error_reply('CORRUPT latest names an id of ' .. #id .. ' bytes: ' .. string.sub(id, 1, 64)) end
local n = redis.call('HSTRLEN', KEYS[3], id)
if n == 0 then return redis.error_reply('CORRUPT latest names ' .. string.sub(id, 1, 64) .. ' without a meta') end
if n > tonumber(ARGV[1]) then return redis.error_reply('CORRUPT meta of ' .. string.sub(id, 1, 64) .. ' is ' .. n .. ' bytes') end
return {id, redis.call('HGET', KEYS[3], id)}
`)

// KEYS: snapshots latest metas; ARGV: max count, max meta size, id
// length. Returns id, meta, id, meta... by ascending id.
var listScript = redis.NewScript(`
local n = redis.call('ZCARD', KEYS[1])
if n > tonumber(ARGV[1]) then return redis.error_reply('CORRUPT ' .. n .. ' snapshots listed') end
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for _, id in ipairs(ids) do
  if #id ~= tonumber(ARGV[3]) then return redis.error_reply('CORRUPT an id of ' .. #id .. ' bytes listed: ' .. string.sub(id, 1, 64)) end
  local l = redis.call('HSTRLEN', KEYS[3], id)
  if l == 0 then return redis.error_reply('CORRUPT ' .. string.sub(id, 1, 64) .. ' listed without a meta') end
  if l > tonumber(ARGV[2]) then return redis.error_reply('CORRUPT meta of ' .. string.sub(id, 1, 64) .. ' is ' .. l .. ' bytes') end
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[3], id)
end
return out
`)

// KEYS: snapshots latest metas; ARGV: id.
var deleteScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  local top = redis.call('ZRANGE', KEYS[1], -1, -1)
  if #top > 0 then redis.call('SET', KEYS[2], top[1]) else redis.call('DEL', KEYS[2]) end
end
return 'OK'
`)

// scriptErr maps the scripts' error replies to the package's errors.
func scriptErr(op string, err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "EXISTS "):
			return fmt.Errorf("%w: %s", ErrExists, strings.TrimPrefix(msg, "EXISTS "))
		case strings.HasPrefix(msg, "CORRUPT "):
			return fmt.Errorf("%w: redis: %s", ErrCorrupt, strings.TrimPrefix(msg, "CORRUPT "))
		}
	}
	return fmt.Errorf("snapshot: redis catalog %s: %w", op, err)
}

// Publish adds m (sorted set member id, score Seq; meta in the hash) and
// moves latest to id when id is above it, atomically. Publishing the
// same Meta again is a no-op success; another Meta under a published id
// is ErrExists.
func (c *RedisCatalog) Publish(ctx context.Context, m Meta) error {
	if err := c.usable(); err != nil {
		return err
	}
	if err := checkMeta(m); err != nil {
		return err
	}
	// The score is a float64: above 2^53 neighbouring seqs may share one,
	// and Redis then orders them by member, which is the id: still by seq.
	err := publishScript.Run(ctx, c.cli, c.keys, m.ID, strconv.FormatUint(m.Seq, 10), encodeMeta(m)).Err()
	if err != nil {
		return scriptErr("publish "+m.ID, err)
	}
	return nil
}

// Latest reads the meta the latest key names: ErrNoSnapshot when nothing
// is published; a Redis that cannot be read (a connection error) or an
// inconsistent catalog is another error.
func (c *RedisCatalog) Latest(ctx context.Context) (Meta, error) {
	if err := c.usable(); err != nil {
		return Meta{}, err
	}
	v, err := latestScript.Run(ctx, c.cli, c.keys, maxMetaSize, idLen).Slice()
	if errors.Is(err, redis.Nil) {
		return Meta{}, ErrNoSnapshot
	}
	if err != nil {
		return Meta{}, scriptErr("latest", err)
	}
	ms, err := decodePairs(v)
	if err != nil {
		return Meta{}, err
	}
	if len(ms) != 1 {
		return Meta{}, fmt.Errorf("%w: redis: latest returned %d snapshots", ErrCorrupt, len(ms))
	}
	return ms[0], nil
}

// List returns every published snapshot by ascending Seq.
func (c *RedisCatalog) List(ctx context.Context) ([]Meta, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	v, err := listScript.Run(ctx, c.cli, c.keys, maxListed, maxMetaSize, idLen).Slice()
	if err != nil {
		return nil, scriptErr("list", err)
	}
	return decodePairs(v)
}

func decodePairs(v []any) ([]Meta, error) {
	if len(v)%2 != 0 {
		return nil, fmt.Errorf("%w: redis: odd reply of %d elements", ErrCorrupt, len(v))
	}
	ms := make([]Meta, 0, len(v)/2)
	for i := 0; i < len(v); i += 2 {
		id, ok1 := v[i].(string)
		b, ok2 := v[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: redis: reply element %d is %T, %T", ErrCorrupt, i, v[i], v[i+1])
		}
		if err := checkID(id); err != nil {
			return nil, fmt.Errorf("%w: redis: %w", ErrCorrupt, err)
		}
		m, err := decodeMeta([]byte(b), id)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// Delete forgets id; when latest names it, latest moves to the highest
// remaining id (or is deleted), in the same script.
func (c *RedisCatalog) Delete(ctx context.Context, id string) error {
	if err := c.usable(); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	if err := deleteScript.Run(ctx, c.cli, c.keys, id).Err(); err != nil {
		return scriptErr("delete "+id, err)
	}
	return nil
}

func (c *RedisCatalog) usable() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.badCfg
}

// Close makes later calls return ErrClosed; it does not close the
// client (the caller's).
func (c *RedisCatalog) Close() error {
	c.closed.Store(true)
	return nil
}
