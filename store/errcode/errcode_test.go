package errcode

import (
	"errors"
	"fmt"
	"testing"
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
