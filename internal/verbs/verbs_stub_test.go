//go:build !cgo || !verbs

package verbs

import (
	"errors"
	"testing"
)

func TestStubUnavailable(t *testing.T) {
	l, err := Load("")
	if l != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Load = %v, %v", l, err)
	}
	var zero Library
	if _, err := zero.Devices(Options{}); !errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
	if zero.Close() != nil {
		t.Fatal("Close")
	}
}
