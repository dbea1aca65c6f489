package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/store/errcode"
)

func TestStatusRoundTrip(t *testing.T) {
	n := 0
	for c := errcode.Code(-2000); c < 0; c++ {
		if !c.Known() {
			continue
		}
		n++
		sent := fmt.Errorf("op: %w", errcode.New(c, "detail %d", 7))
		st := ToStatus(sent)
		if s, ok := status.FromError(st); !ok || s.Code() == codes.OK {
			t.Fatalf("%v: not a failed status", c)
		}
		got := FromStatus(st)
		if errcode.CodeOf(got) != c || !errors.Is(got, &errcode.Error{Code: c}) {
			t.Fatalf("%v came back as %v", c, got)
		}
		// The detail survives, with the sender's wrapping text.
		var e *errcode.Error
		if !errors.As(got, &e) || !strings.Contains(e.Msg, "detail 7") || !strings.HasPrefix(e.Msg, "op: ") {
			t.Fatalf("%v: message %v", c, got)
		}
	}
	if n < 50 {
		t.Fatalf("only %d codes tried", n)
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil {
		t.Fatal("nil")
	}
}

func TestTransportFailures(t *testing.T) {
	if err := FromStatus(status.Error(codes.Unavailable, "connection refused")); !errors.Is(err, errcode.ErrRPCFail) {
		t.Fatalf("unavailable: %v", err)
	}
	if err := FromStatus(status.Error(codes.DeadlineExceeded, "slow")); !errors.Is(err, errcode.ErrRPCTimeout) {
		t.Fatalf("deadline: %v", err)
	}
	if err := FromStatus(context.DeadlineExceeded); !errors.Is(err, errcode.ErrRPCTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: %v", err)
	}
	if s, _ := status.FromError(ToStatus(context.Canceled)); s.Code() != codes.Canceled {
		t.Fatalf("canceled: %v", s)
	}
	if s, _ := status.FromError(ToStatus(errors.New("boom"))); s.Code() != codes.Internal {
		t.Fatalf("plain error: %v", s)
	}
	// Codes map onto sensible gRPC codes for generic tooling.
	if s, _ := status.FromError(ToStatus(errcode.ErrObjectNotFound)); s.Code() != codes.NotFound {
		t.Fatalf("not found: %v", s.Code())
	}
}

// TestUnprocessed: only the master's two refusals of a call it did not
// read count as unprocessed.
func TestUnprocessed(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM"), true},
		{status.Error(codes.ResourceExhausted, "the master has 4096 "+CallsBound+": retry later"), true},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9 vs. 4)"), false},
		{status.Error(codes.Unavailable, "error reading from server: connection reset by peer"), false},
		{status.Error(codes.Internal, "REFUSED_STREAM"), false},
		{errors.New("REFUSED_STREAM"), false},
		{nil, false},
	} {
		assert.Equal(t, c.want, Unprocessed(c.err), "%v", c.err)
	}
}
