package service

import (
	"context"
	"time"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// WaitInvalidations implements storepb.MasterServer: one long poll of a
// hot cache's invalidation subscription (master.WaitInvalidations).
func (s *Service) WaitInvalidations(ctx context.Context, r *storepb.WaitInvalidationsRequest) (*storepb.WaitInvalidationsResponse, error) {
	b, err := s.m.WaitInvalidations(ctx, master.InvalidationPoll{Sub: r.Subscription, Ack: r.Ack,
		MaxItems: int(r.MaxItems), Wait: time.Duration(r.WaitMs) * time.Millisecond, Unsubscribe: r.Unsubscribe})
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	out := &storepb.WaitInvalidationsResponse{Subscription: b.Sub, Reset_: b.Reset, First: b.First, Last: b.Last,
		More: b.More, TtlMs: uint32(b.TTL / time.Millisecond), Items: make([]*storepb.Invalidation, len(b.Items))}
	for i, it := range b.Items {
		out.Items[i] = &storepb.Invalidation{Key: it.Key, Generation: it.Gen}
	}
	return out, nil
}
