package errcode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSentinelsMatchByCode(t *testing.T) {
	err := fmt.Errorf("put %q: %w", "k", New(ObjectAlreadyExists, "key exists"))
	if !errors.Is(err, ErrObjectAlreadyExists) || errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("errors.Is on %v", err)
	}
	if CodeOf(err) != ObjectAlreadyExists || CodeOf(nil) != OK || CodeOf(errors.New("x")) != InternalError {
		t.Fatal("CodeOf")
	}
	if FromCode(OK, "") != nil || !errors.Is(FromCode(ObjectHasLease, "held"), ErrObjectHasLease) {
		t.Fatal("FromCode")
	}
	if ObjectNotFound.String() != "OBJECT_NOT_FOUND" || Code(-4242).String() != "ERROR_CODE(-4242)" || Code(-4242).Known() {
		t.Fatal("names")
	}
	if int32(ObjectNotFound) != -704 || int32(LeaseExpired) != -707 || int32(NoAvailableHandle) != -200 || int32(IllegalClient) != -601 {
		t.Fatal("numeric values drifted from the reference")
	}
}

func TestStatusRoundTrip(t *testing.T) {
	for c := range names {
		if c == OK {
			continue
		}
		sent := fmt.Errorf("op: %w", New(c, "detail %d", 7))
		st := ToStatus(sent)
		if s, ok := status.FromError(st); !ok || s.Code() == codes.OK {
			t.Fatalf("%v: not a failed status", c)
		}
		got := FromStatus(st)
		if CodeOf(got) != c || !errors.Is(got, &Error{Code: c}) {
			t.Fatalf("%v came back as %v", c, got)
		}
		// The detail survives, with the sender's wrapping text.
		var e *Error
		if !errors.As(got, &e) || !strings.Contains(e.Msg, "detail 7") || !strings.HasPrefix(e.Msg, "op: ") {
			t.Fatalf("%v: message %v", c, got)
		}
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil {
		t.Fatal("nil")
	}
}

func TestTransportFailures(t *testing.T) {
	if err := FromStatus(status.Error(codes.Unavailable, "connection refused")); !errors.Is(err, ErrRPCFail) {
		t.Fatalf("unavailable: %v", err)
	}
	if err := FromStatus(status.Error(codes.DeadlineExceeded, "slow")); !errors.Is(err, ErrRPCTimeout) {
		t.Fatalf("deadline: %v", err)
	}
	if err := FromStatus(context.DeadlineExceeded); !errors.Is(err, ErrRPCTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: %v", err)
	}
	if s, _ := status.FromError(ToStatus(context.Canceled)); s.Code() != codes.Canceled {
		t.Fatalf("canceled: %v", s)
	}
	if s, _ := status.FromError(ToStatus(errors.New("boom"))); s.Code() != codes.Internal {
		t.Fatalf("plain error: %v", s)
	}
	// Codes map onto sensible gRPC codes for generic tooling.
	if s, _ := status.FromError(ToStatus(ErrObjectNotFound)); s.Code() != codes.NotFound {
		t.Fatalf("not found: %v", s.Code())
	}
}
