// Package msgpfields checks the field names of msgpack maps against the
// set a decoder knows. The generated msgp decoders skip unknown fields;
// the operation log and the snapshot format refuse them instead, so a
// record written by a newer version is never applied in part.
package msgpfields

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// Set is the field names a decoder knows.
type Set map[string]bool

// Of returns the set of names.
func Of(names ...string) Set {
	s := make(Set, len(names))
	for _, n := range names {
		s[n] = true
	}
	return s
}

// Walk checks the keys of the map at the start of b against known and
// hands each value's bytes to fn (when not nil), in order.
func Walk(b []byte, known Set, fn func(name string, v []byte) error) error {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return err
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return err
		}
		if !known[string(key)] {
			return fmt.Errorf("unknown field %q", key)
		}
		v := b
		if b, err = msgp.Skip(b); err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
		if fn != nil {
			if err := fn(string(key), v[:len(v)-len(b)]); err != nil {
				return fmt.Errorf("field %q: %w", key, err)
			}
		}
	}
	return nil
}

// WalkNested is Walk without fn for a map value that may be nil.
func WalkNested(v []byte, known Set) error {
	if msgp.IsNil(v) {
		return nil
	}
	return Walk(v, known, nil)
}
