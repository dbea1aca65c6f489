package store

import (
	"context"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// ExistOption modifies IsExist and BatchIsExist.
type ExistOption func(*existOpts)

type existOpts struct{ noLease bool }

// NoLease checks existence without granting a read lease, so probes do not
// hold objects back from eviction (the reference always grants one).
func NoLease() ExistOption { return func(o *existOpts) { o.noLease = true } }

func existOptions(opts []ExistOption) existOpts {
	var o existOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// IsExist reports whether key is stored and complete. Like the reference
// it grants a read lease, unless NoLease is given.
func (c *Client) IsExist(ctx context.Context, key string, opts ...ExistOption) (bool, error) {
	if err := c.enter(); err != nil {
		return false, err
	}
	defer c.leave()
	if err := c.checkKey(key); err != nil {
		return false, err
	}
	o := existOptions(opts)
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	resp, err := c.master.ExistKey(rctx, &storepb.ExistKeyRequest{Key: key, NoLease: o.noLease})
	if err != nil {
		return false, rpcerr.FromStatus(err)
	}
	return resp.Exists, nil
}

// BatchIsExist is IsExist for many keys, answering per item.
func (c *Client) BatchIsExist(ctx context.Context, keys []string, opts ...ExistOption) ([]bool, []error) {
	found := make([]bool, len(keys))
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		fill(errs, err)
		return found, errs
	}
	defer c.leave()
	o := existOptions(opts)
	items, req := c.validKeys(keys, errs)
	if len(items) == 0 {
		return found, errs
	}
	rfound, rerrs := inPieces(len(req), func(lo, hi int) ([]bool, []error) { return c.rpcExist(ctx, req[lo:hi], o.noLease) })
	for j, i := range items {
		found[i], errs[i] = rfound[j], rerrs[j]
	}
	return found, errs
}

// rpcExist is one BatchExistKey, answering per key.
func (c *Client) rpcExist(ctx context.Context, keys []string, noLease bool) ([]bool, []error) {
	found, errs := make([]bool, len(keys)), make([]error, len(keys))
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	resp, err := c.master.BatchExistKey(rctx, &storepb.BatchExistKeyRequest{Keys: keys, NoLease: noLease})
	if err == nil && len(resp.Results) != len(keys) {
		err = errcode.New(errcode.InternalError, "BatchExistKey answered %d results for %d keys", len(resp.Results), len(keys))
	}
	if err != nil {
		fill(errs, rpcerr.FromStatus(err))
		return found, errs
	}
	for i, r := range resp.Results {
		found[i], errs[i] = r.Exists, errcode.FromCode(errcode.Code(r.ErrorCode), "")
	}
	return found, errs
}

// validKeys checks keys, recording errors, and returns the valid ones
// with their positions.
func (c *Client) validKeys(keys []string, errs []error) ([]int, []string) {
	var items []int
	var valid []string
	for i, k := range keys {
		if errs[i] = c.checkKey(k); errs[i] == nil {
			items = append(items, i)
			valid = append(valid, k)
		}
	}
	return items, valid
}

// Remove deletes key. A leased object fails with OBJECT_HAS_LEASE and one
// being written with OBJECT_REPLICA_BUSY, unless force.
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.checkKey(key); err != nil {
		return err
	}
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	_, err := c.master.Remove(rctx, &storepb.RemoveRequest{Key: key, Force: force, AdminToken: c.adminToken(force)})
	return rpcerr.FromStatus(err)
}

// BatchRemove is Remove for many keys, answering per item.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		fill(errs, err)
		return errs
	}
	defer c.leave()
	items, req := c.validKeys(keys, errs)
	if len(items) == 0 {
		return errs
	}
	_, rerrs := inPieces(len(req), func(lo, hi int) ([]struct{}, []error) { return c.rpcRemove(ctx, req[lo:hi], force) })
	for j, i := range items {
		errs[i] = rerrs[j]
	}
	return errs
}

// rpcRemove is one BatchRemove, answering per key.
func (c *Client) rpcRemove(ctx context.Context, keys []string, force bool) ([]struct{}, []error) {
	errs := make([]error, len(keys))
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	resp, err := c.master.BatchRemove(rctx, &storepb.BatchRemoveRequest{Keys: keys, Force: force, AdminToken: c.adminToken(force)})
	if err == nil && len(resp.Results) != len(keys) {
		err = errcode.New(errcode.InternalError, "BatchRemove answered %d results for %d keys", len(resp.Results), len(keys))
	}
	if err != nil {
		fill(errs, rpcerr.FromStatus(err))
		return make([]struct{}, len(keys)), errs
	}
	for i, r := range resp.Results {
		errs[i] = errcode.FromCode(errcode.Code(r.ErrorCode), r.Message)
	}
	return make([]struct{}, len(keys)), errs
}

// RemoveByRegex deletes every complete key matching regex (RE2, whole
// key) and returns how many went.
func (c *Client) RemoveByRegex(ctx context.Context, regex string, force bool) (uint64, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	resp, err := c.master.RemoveByRegex(rctx, &storepb.RemoveByRegexRequest{Regex: regex, Force: force, AdminToken: c.cfg.Security.Admin})
	if err != nil {
		return 0, rpcerr.FromStatus(err)
	}
	return resp.Removed, nil
}

// RemoveAll deletes every complete object that is not leased (every one
// when force) and returns how many went.
func (c *Client) RemoveAll(ctx context.Context, force bool) (uint64, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	resp, err := c.master.RemoveAll(rctx, &storepb.RemoveAllRequest{Force: force, AdminToken: c.cfg.Security.Admin})
	if err != nil {
		return 0, rpcerr.FromStatus(err)
	}
	return resp.Removed, nil
}
